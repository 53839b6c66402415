"""Successive halving over ρ with seeds as the resource (η = 2): ``--adaptive-policy halving``. Pure."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from race.run.adaptive.base import DEFAULT_SHARE, Key, adaptive_cap


def successive_halving(grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
                       given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
    """The pilots an adaptive grid needs so far, and whether that list is final.

    Successive halving over ρ with seeds as the resource (η = 2): rung 0 runs seed 0 at every
    grid point; rung k gives seed k to the best ⌈P / 2^k⌉ points of rung k − 1 (mean primary
    score over their seeds so far), until the grid has spent ``share`` of the full grid's pilots
    (``adaptive_cap``; at least one point gets a second seed, which the regime rule needs). Every
    pilot has the full per-pilot budget, so the fit stays IsoFLOP; the dropped points keep their
    one seed.
    """
    grid, P = sorted(grid), len(grid)
    cap = adaptive_cap(P, seeds, share)
    keys: list[Key] = [(r, 0) for r in grid]
    alive, total = list(grid), P
    for k in range(1, seeds):
        prev = [(r, k - 1) for r in alive]
        if any(key not in scores and key not in given_up for key in prev):
            return keys, False
        n = min(math.ceil(P / 2 ** k), cap - total)
        if n <= 0:
            break
        ranked = sorted((r for r in alive if all((r, s) in scores for s in range(k))),
                        key=lambda r: (-sum(scores[(r, s)] for s in range(k)) / k, r))
        alive = ranked[:n]
        if not alive:
            break
        keys += [(r, k) for r in alive]
        total += len(alive)
    return keys, True


@dataclass(frozen=True)
class Halving:
    """``successive_halving`` as an adaptive policy."""

    name: str = "halving"
    stored: Mapping[str, object] = field(default_factory=lambda: {"policy": "successive-halving", "eta": 2})
    description: str = "successive halving over ρ"

    def needed(self, grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
               given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
        return successive_halving(grid, seeds, scores, given_up, share=share)
