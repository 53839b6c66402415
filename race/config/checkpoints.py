"""Held-out checkpoints of a pilot: when they fire and their random streams (what ``eval.checkpoints`` asks for). Pure.

A pilot with ``eval.checkpoints`` on evaluates its policy on a fixed subset of the held-out
prompts (the first ``checkpoint_prompts`` of them, the same at every checkpoint):

- at fraction 0, the base policy before any step (the curve's start);
- between steps, when the metered FLOPs spent first reach each fraction ``f < 1`` of the
  pilot's budget (one evaluation when a step crosses several fractions, recorded at the
  largest);
- at the end (fraction 1): the final evaluation, which runs on all ``eval.prompts`` exactly as
  without checkpoints; the end checkpoint holds its scores on the checkpoint prompts, and its
  cost is the final evaluation's.

``eval.checkpoints: N`` puts the fractions log-spaced from ``CHECKPOINT_FIRST`` (1/64) to 1,
N of them counting the end (N = 8: 1/64, 0.028, 0.051, 0.093, 0.17, 0.31, 0.55, 1); a list
gives them explicitly; 0 switches checkpoints off. Checkpoint k draws its samples from its own
generator, seeded by ``checkpoint_seed(pilot seed, k)``, so training, which has its own, runs
bit for bit as without checkpoints. Evaluation FLOPs and seconds are recorded apart and never
count towards the budget or ρ.

The rule that reads them (a pilot that fell back) is race.stats.instability's.
"""
from __future__ import annotations

import hashlib
import math
from typing import Sequence

from race.core.errors import ConfigError

MAX_COUNT = 64      # race.config.rules.MAX_CHECKPOINTS (the same layer: tied by tests/test_hardening_heldout_fixes.py)

CHECKPOINT_FIRST = 1 / 64          # the earliest log-spaced fraction
DEFAULT_CHECKPOINTS = 8            # fractions, counting the end (1/64 … 1)
DEFAULT_CHECKPOINT_PROMPTS = 100   # checkpoint prompts when eval.checkpoint_prompts is not set


def checkpoint_fractions(spec: int | Sequence[float]) -> tuple[float, ...]:
    """Budget fractions < 1 at which a pilot evaluates between steps (the base, 0, and the end, 1,
    are implied whenever checkpoints are on). ``spec``: a count N (N fractions from
    ``CHECKPOINT_FIRST`` to 1, log-spaced, the end included) or explicit fractions in (0, 1]."""
    if isinstance(spec, (bool, str, bytes)) or not isinstance(spec, (int, Sequence)):
        raise ConfigError(f"checkpoints {str(spec)[:40]!r}: expected a whole count from 0 to {MAX_COUNT} or a list of "
                          "budget fractions in (0, 1]")
    if isinstance(spec, int):
        if spec > MAX_COUNT:
            raise ConfigError(f"checkpoints {spec}: expected a whole count from 0 to {MAX_COUNT}")
        if spec <= 1:
            return ()
        span = math.log(CHECKPOINT_FIRST)
        return tuple(math.exp(span * (1 - i / (spec - 1))) for i in range(spec - 1))
    return tuple(sorted(float(f) for f in spec if float(f) < 1.0))


def checkpoints_on(spec: int | Sequence[float]) -> bool:
    return bool(spec) if isinstance(spec, int) else len(spec) > 0


def checkpoint_prompts(prompts: int, setting: int | None) -> int:
    """Held-out prompts evaluated at each checkpoint: the setting, else all up to DEFAULT_CHECKPOINT_PROMPTS."""
    return setting if setting is not None else min(prompts, DEFAULT_CHECKPOINT_PROMPTS)


def checkpoint_seed(seed: int, index: int) -> int:
    """The seed of checkpoint ``index``'s sampling generator in the pilot of ``seed``: a stream of
    its own (not the training generator's, nor the final evaluation's), the same in every
    process and on every machine."""
    digest = hashlib.sha256(f"race-checkpoint:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1          # < 2**63: any torch generator takes it
