"""Step-structured arithmetic: column addition with carries, written out step by step.

``arithmetic-steps`` asks the ``arithmetic-easy`` sums (a, b in 0..99) with both operands
written with two digits (``05+37=``), and a completion shows its work, one column per
step, units first, then the final answer; steps are separated by ``STEP_SEPARATOR``
(``";"``)::

    47+85=  →  7+5+0=12;4+8+1=13;132</s>
    05+37=  →  5+7+0=12;0+3+1=04;42</s>

A column step is ``x+y+c=ss``: the column's two digits, the carry from the previous column
(0 or 1) and their sum written with two digits. Every step has the same width and sits at
the same place in every solution, so a small model can learn to check it. The last
segment is the final answer. The reference of a problem stays the final answer
(``"132"``): ``race.tasks.rewards.rules.final_answer`` reads the last segment of a completion
in this grammar, so the rule-based rewards judge the answer, not the work.

``step_labels`` is the rule that judges each step (the process checker): column step
``i`` is correct iff it equals the canonical step ``i`` (right digits, right carry, right
sum); the final step is correct iff it equals the answer. Steps beyond the number of
columns are wrong. Pure Python; no torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from race.tasks.arithmetic import ArithmeticTask
from race.tasks.datasets import Problem

from race.tasks.rewards.rules import STEP_SEPARATOR, split_steps as _split_steps
_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")
STEP_GRAMMAR = re.compile(r"\d(\+\d)*=\d+")     # one column step (any digits, right or wrong)


WIDTH = 2                                       # digits per operand (a, b in 0..99)


def columns(a: int, b: int) -> list[tuple[list[int], int]]:
    """Per column, units first: (the two digits and the carry-in, the column sum)."""
    da, db = f"{a:0{WIDTH}d}"[::-1], f"{b:0{WIDTH}d}"[::-1]
    out, carry = [], 0
    for x, y in zip(da, db):
        digits = [int(x), int(y), carry]
        total = sum(digits)
        out.append((digits, total))
        carry = total // 10
    return out


def canonical_steps(a: int, b: int) -> list[str]:
    """The correct steps of ``a+b``: one per column, then the final answer."""
    return [f"{'+'.join(map(str, digits))}={total:02d}" for digits, total in columns(a, b)] + [str(a + b)]


def prompt_of(a: int, b: int) -> str:
    return f"{a:0{WIDTH}d}+{b:0{WIDTH}d}="


def solution(a: int, b: int) -> str:
    """The canonical worked completion (without EOS): ``"7+5+0=12;4+8+1=13;132"`` for 47+85."""
    return STEP_SEPARATOR.join(canonical_steps(a, b))


def parse_prompt(prompt: str) -> tuple[int, int] | None:
    m = _PROMPT.match(prompt.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def split_steps(completion: str) -> list[str]:
    """The steps of a completion: its text up to the first EOS marker, split at ``;``, each
    stripped, empty ones dropped (as ``race.tasks.rewards.prm.split_steps`` does for a PRM)."""
    return _split_steps(completion, STEP_SEPARATOR)


def step_labels(prompt: str, completion: str) -> list[bool]:
    """Correctness of each step of ``completion`` (the last one is the final answer)."""
    ab = parse_prompt(prompt)
    steps = split_steps(completion)
    if ab is None or not steps:
        return [False] * len(steps)
    want = canonical_steps(*ab)
    cols = want[:-1]
    labels = [i < len(cols) and s == cols[i] for i, s in enumerate(steps[:-1])]
    return labels + [steps[-1] == want[-1]]


def process_score(prompt: str, completion: str, reference: str = "") -> float:
    """The process judge: the share of correct steps (0 for a completion with no step)."""
    labels = step_labels(prompt, completion)
    return sum(labels) / len(labels) if labels else 0.0


def final_answer_correct(prompt: str, completion: str, reference: str) -> float:
    """1.0 iff the final answer (``rules.final_answer``) equals ``reference``."""
    from race.tasks.rewards.rules import sparse

    return sparse(prompt, completion, reference)


@dataclass(frozen=True)
class StepArithmeticTask(ArithmeticTask):
    """``ArithmeticTask`` whose problems carry the canonical worked solution in ``meta``."""

    def problem(self, i: int) -> Problem:
        a, b = self.lo + i // self.width, self.lo + i % self.width
        return Problem(prompt=prompt_of(a, b), answer=str(a + b), id=i, meta={"solution": solution(a, b)})


# ----------------------------------------------------------------------------- step labels for PRMs

def _corrupt_column(step: str, rng) -> str:
    """A wrong version of a column step: a wrong sum, a wrong carry, or a wrong digit (its
    sum either recomputed, so the arithmetic looks right, or kept)."""
    left, total = step.split("=")
    digits, s = [int(d) for d in left.split("+")], int(total)
    kind = rng.choice(("sum", "carry", "digit"))
    if kind == "sum":
        s = min(99, max(0, s + rng.choice((-2, -1, 1, 2, 10, -10))))
    elif kind == "carry":
        digits[2] = 1 - digits[2]
        if rng.random() < 0.5:
            s = sum(digits)
    else:
        i = rng.randrange(2)
        digits[i] = rng.choice([d for d in range(10) if d != digits[i]])
        if rng.random() < 0.7:
            s = sum(digits)
    return f"{'+'.join(map(str, digits))}={s:02d}"


def _corrupt_answer(answer: str, rng) -> str:
    value = int(answer)
    kind = rng.choice(("digit", "offset", "offset"))
    if kind == "digit":
        i = rng.randrange(len(answer))
        return answer[:i] + rng.choice([d for d in "0123456789" if d != answer[i]]) + answer[i + 1:]
    return str(max(0, value + rng.choice((-100, -10, -1, 1, 10, 100))))


def corrupted_steps(a: int, b: int, rng, *, max_errors: int = 2) -> list[str]:
    """The canonical steps of ``a+b`` with 0..``max_errors`` of them made wrong (``rng``:
    a ``random.Random``). Labels come from ``step_labels`` (the rule), not from here."""
    steps = canonical_steps(a, b)
    k = min(rng.randint(0, max_errors), len(steps))
    for idx in rng.sample(range(len(steps)), k):
        for _ in range(20):       # a corruption can land back on the right step: retry
            wrong = _corrupt_answer(steps[idx], rng) if idx == len(steps) - 1 else _corrupt_column(steps[idx], rng)
            if wrong != steps[idx]:
                steps[idx] = wrong
                break
    return steps
