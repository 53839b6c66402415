"""Rule-based rewards on (prompt, completion, reference): sparse, structured, dense.

They cost 0 FLOPs (no model runs); ``score_completions`` reports their CPU time.

The *final answer* of a completion is its text up to the first end-of-sequence
marker, stripped of surrounding whitespace (``final_answer``); for a worked solution of
``arithmetic-steps`` (``"7+5+0=12;4+8+1=13;132"``) it is the last step, the answer. Rollout backends
decode completions **with** special tokens, so a reward can tell a policy that
stopped (the EOS marker is there) from one that ran out of tokens; text after the
EOS (padding, a second answer) is ignored. A completion with no marker counts as not
terminated and its whole text is the answer.
"""
from __future__ import annotations

import re

# EOS strings of the tiny policy ("</s>") and of common model families (Qwen2.5,
# Llama 3, Gemma); the earliest one present ends the answer.
EOS_MARKERS = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<eos>",
               "<end_of_turn>")
_INTEGER = re.compile(r"-?\d+")
_STEP = re.compile(r"\d(\+\d)*=\d+")     # a column step of arithmetic-steps (race.tasks.steps)


def final_answer(completion: str, eos_markers: tuple[str, ...] = EOS_MARKERS) -> tuple[str, bool]:
    """``(answer, terminated)``: the text before the first EOS marker, stripped, and
    whether any marker was found. ``"46</s><pad>"`` → ``("46", True)``; ``"4646"`` →
    ``("4646", False)``."""
    cut = min((i for i in (completion.find(m) for m in eos_markers) if i >= 0), default=-1)
    if cut < 0:
        return _worked_answer(completion.strip()), False
    return _worked_answer(completion[:cut].strip()), True


def _worked_answer(text: str) -> str:
    """The last segment of a worked solution in the ``arithmetic-steps`` grammar
    (``"7+5+0=12;4+8+1=13;132"`` → ``"132"``: column steps ``d+d+d=s`` separated by ``;``,
    then an integer; empty segments are skipped, as the step checker skips them); any other
    text unchanged."""
    if ";" not in text:
        return text
    *steps, last = [s.strip() for s in text.split(";") if s.strip()] or [""]
    if _INTEGER.fullmatch(last) and all(_STEP.fullmatch(s) for s in steps):
        return last
    return text


def sparse(prompt: str, completion: str, reference: str) -> float:
    """1.0 iff the final answer equals ``reference.strip()`` exactly, else 0.0.

    Termination is not required: ``"46"`` (decoded without special tokens) and
    ``"46</s>"`` both score 1.0 for reference ``"46"``; ``"46 "`` too (stripped);
    ``"046"``, ``"46.0"`` and ``"4646"`` score 0.0.
    """
    answer, _ = final_answer(completion)
    return 1.0 if answer == reference.strip() else 0.0


def well_formed(completion: str, reference: str) -> bool:
    """True iff the completion terminated (an EOS marker is present) and its final answer
    has the reference's shape: an integer (``-?[0-9]+``) when the reference is one,
    otherwise any non-empty single line."""
    answer, terminated = final_answer(completion)
    if not terminated or not answer:
        return False
    if _INTEGER.fullmatch(reference.strip()):
        return _INTEGER.fullmatch(answer) is not None
    return "\n" not in answer


def structured(prompt: str, completion: str, reference: str) -> float:
    """Format plus correctness: ``0.2 · well_formed + 0.8 · sparse``.

    Scores: 1.0 correct and terminated (``"46</s>"``); 0.8 correct but not terminated
    (``"46"``); 0.2 a terminated integer that is wrong (``"47</s>"``); 0.0 otherwise
    (``"4x</s>"``, ``"</s>"``, ``"47"``).
    """
    return 0.2 * well_formed(completion, reference) + 0.8 * sparse(prompt, completion, reference)


def dense(prompt: str, completion: str, reference: str) -> float:
    """Partial credit: characters of the final answer that match the reference in
    right-aligned positions (units digit against units digit), divided by the length
    of the *longer* of the two strings.

    The longer-length denominator is the length penalty: missing or extra characters
    cost credit, so 1.0 iff the answer equals the reference (as for ``sparse``), and an
    empty answer scores 0.0. Examples for reference ``"146"``: ``"146"`` → 1.0,
    ``"147"`` → 2/3, ``"46"`` → 2/3, ``"1146"`` → 3/4, ``"641"`` → 1/3, ``""`` → 0.0.
    """
    answer, _ = final_answer(completion)
    ref = reference.strip()
    longest = max(len(answer), len(ref))
    if longest == 0:
        return 1.0
    if not answer:
        return 0.0
    matches = sum(a == r for a, r in zip(reversed(answer), reversed(ref)))
    return matches / longest


# ---------------------------------------------------------------- the step grammar

STEP_SEPARATOR = ";"        # between the steps of an arithmetic-steps completion (race.tasks.steps)


def split_steps(completion: str, separator: str) -> list[str]:
    """Steps of a completion: the text before its first EOS marker, split at ``separator``,
    each stripped, empty ones dropped. One grammar for the step task (race.tasks.steps) and
    the PRMs that score steps (race.tasks.rewards.prm)."""
    cut = min((i for i in (completion.find(m) for m in EOS_MARKERS) if i >= 0), default=len(completion))
    return [s.strip() for s in completion[:cut].split(separator) if s.strip()]
