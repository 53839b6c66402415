"""Built-in arithmetic tasks: ``"a+b="`` prompts with the exact result as the answer.

Two difficulty levels on the shipped tiny policy (``race/tiny-arith``):

- ``arithmetic-easy``: a + b with a, b in 0..99 (10,000 problems). The tiny policy is
  pretrained on its training split to a sampled accuracy of roughly a third, leaving
  room for RL.
- ``arithmetic-hard``: a + b with a, b in 100..999 (810,000 problems; answers of 3–4
  digits). The tiny policy saw only a few of these, so its sampled accuracy is a few
  percent: sparse rewards are rare here, which is the point.

Problem ``i`` of a task is ``(lo + i // width, lo + i % width)`` with
``width = hi - lo + 1``; its ``id`` is ``i``. Train and eval splits are disjoint by
the prompt hash (``race.tasks.datasets.is_eval_prompt``). Small problem spaces are
enumerated; large ones are sampled without replacement from a seeded generator, the
evaluation set from a fixed generator so that it never depends on the pilot seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from race.tasks.datasets import Problem, TaskError, check_split, eval_bucket, is_eval_prompt, take

ENUMERATE_LIMIT = 200_000   # problem spaces up to this size are listed in full
_EVAL_STREAM_SEED = 20_260_713   # fixed: the evaluation set of a sampled task never moves


@dataclass(frozen=True)
class ArithmeticTask:
    """A family of ``"{a}{op}{b}="`` problems with both operands in ``lo..hi``."""

    name: str
    op: str = "+"
    lo: int = 0
    hi: int = 99
    eval_fraction: float = 0.1
    eval_size: int = 1000          # cap on the evaluation set (sampled spaces only)
    train_size: int = 10_000       # problems returned for n=None (sampled spaces only)

    def __post_init__(self) -> None:
        if self.op not in ("+", "*") or not 0 <= self.lo <= self.hi:
            raise TaskError(f"arithmetic task {self.name!r}: op {self.op!r} / range {self.lo}..{self.hi} "
                            f"invalid: expected '+' or '*' and 0 <= lo <= hi")

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    @property
    def size(self) -> int:
        return self.width ** 2

    def problem(self, i: int) -> Problem:
        a, b = self.lo + i // self.width, self.lo + i % self.width
        value = a + b if self.op == "+" else a * b
        return Problem(prompt=f"{a}{self.op}{b}=", answer=str(value), id=i)

    def load(self, *, split: str = "train", n: int | None = None, seed: int = 0) -> list[Problem]:
        """``n`` problems of one split (train: shuffled by ``seed``; eval: fixed order)."""
        check_split(split, self.eval_fraction)
        if self.size <= ENUMERATE_LIMIT:
            return self._enumerated(split, n, seed)
        return self._sampled(split, n, seed)

    def _enumerated(self, split: str, n: int | None, seed: int) -> list[Problem]:
        want_eval = split == "eval"
        rows = [p for p in map(self.problem, range(self.size))
                if is_eval_prompt(p.prompt, self.eval_fraction) == want_eval]
        if want_eval:
            rows.sort(key=lambda p: eval_bucket(p.prompt))
        else:
            random.Random(seed).shuffle(rows)
        return take(rows, n, f"the {split} split of {self.name}")

    def _sampled(self, split: str, n: int | None, seed: int) -> list[Problem]:
        want_eval = split == "eval"
        limit = self.eval_size if want_eval else self.train_size
        count = limit if n is None else n
        if want_eval and count > self.eval_size:
            raise TaskError(f"n ({count}) exceeds the {self.eval_size} problems in the eval split of {self.name}")
        # The eval stream is fixed; the train stream depends on the seed. Both skip the
        # other split's prompts, so they can never overlap.
        rng = random.Random(_EVAL_STREAM_SEED if want_eval else seed)
        seen: set[int] = set()
        out: list[Problem] = []
        while len(out) < count and len(seen) < self.size:
            i = rng.randrange(self.size)
            if i in seen:
                continue
            seen.add(i)
            p = self.problem(i)
            if is_eval_prompt(p.prompt, self.eval_fraction) == want_eval:
                out.append(p)
        return take(out, n, f"the {split} split of {self.name}")


ARITHMETIC_TASKS: dict[str, ArithmeticTask] = {
    "arithmetic-easy": ArithmeticTask("arithmetic-easy", op="+", lo=0, hi=99),
    "arithmetic-hard": ArithmeticTask("arithmetic-hard", op="+", lo=100, hi=999),
}
