"""Round 3's noisy verifier (setting `noisy`): the sparse rule (1 for the right final answer, else 0),
wrong on 20 % of answers. Whether an answer is misjudged is a fixed function of the prompt and the
answer given (a hash), so the same answer to the same prompt is always judged the same way: a buggy
verifier, not random noise. Over answers, E[reward] = 0.2 + 0.6 · accuracy, so it still ranks
policies by accuracy, with less signal per sample.

Self-contained on purpose (a custom reward runs in its own process; race.tasks.rewards.isolated): it
imports only the standard library and the rule it perturbs.
"""
from __future__ import annotations

import hashlib

from race.tasks.rewards.rules import final_answer, sparse

WRONG_SHARE = 0.2


def misjudged(prompt: str, answer: str) -> bool:
    """Whether this verifier gets (prompt, answer) wrong: the first 8 bytes of a SHA-256 below 20 %."""
    digest = hashlib.sha256(f"{prompt}\x1f{answer}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < WRONG_SHARE * 2 ** 64


def score(prompt: str, completion: str, reference: str) -> float:
    right = sparse(prompt, completion, reference)
    answer, _ = final_answer(completion)
    return 1.0 - right if misjudged(prompt, answer) else right
