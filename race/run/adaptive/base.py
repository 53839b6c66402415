"""What every adaptive policy shares: the pilot key, the budget of an adaptive grid, the protocol. Pure.

An adaptive grid runs a share of the full grid's pilots (``adaptive_cap``), rung by rung: a policy
says, from the scores of the pilots finished so far, which pilots the grid needs and whether that
list is final (``AdaptivePolicy.needed``). Every pilot keeps the full per-pilot budget, so the fit
stays IsoFLOP. Seeds are numbered 0 … seeds − 1 here (rung k runs seed k). Budget halving
(race.run.adaptive.budget) is the exception: its resource is the budget, its keys stages.

Invariants: a policy is deterministic (no randomness, no clock), reads only the scores it is given,
and never asks for more than ``adaptive_cap`` pilots (budget halving: the grid's pilots, each to a
rung's mark) or for a pilot outside the grid.
"""
from __future__ import annotations

import math
from typing import Mapping, Protocol, Sequence

Key = tuple[float, int]             # (ρ, seed)
DEFAULT_SHARE = 0.5                 # pilots of an adaptive grid, as a share of the full grid's


def adaptive_cap(P: int, seeds: int, share: float = DEFAULT_SHARE) -> int:
    """Pilots an adaptive grid runs: ``share`` of the full grid's (rounded down), at least one
    second seed, at most the full grid."""
    return min(P * seeds, max(P + 1, math.floor(share * P * seeds + 1e-9)))


class AdaptivePolicy(Protocol):
    """One adaptive policy: its name (``--adaptive-policy``), what the study stores of it, a line for
    the progress message, and its rule."""

    name: str
    stored: Mapping[str, object]     # the study's ``adaptive`` attribute (with ``share`` added)
    description: str
    # a policy may also say ``resource = "budget"`` (race.run.adaptive.budget): its keys are then stages
    # (ρ, seed, rung) and it ignores ``share``; without it, seeds are the resource

    def needed(self, grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
               given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
        """The pilots the grid needs so far and whether that list is final."""
        ...
