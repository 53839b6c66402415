"""Seed 0 everywhere, then the seeds that sharpen the leading verdict most: ``--adaptive-policy
informative``, what ``--adaptive`` runs. Pure."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from race.run.adaptive.base import DEFAULT_SHARE, Key, adaptive_cap


def informative_seeds(grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
                      given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
    """The pilots an adaptive grid needs so far, and whether that list is final.

    Rung 0 runs seed 0 at every grid point. Rung 1 (the last) spends the rest of the adaptive
    budget (``adaptive_cap``: ``share`` of the full grid's pilots) at once, one seed at a time, where an
    extra seed most sharpens the statistic the leading verdict of rung 0 rests on
    (``allocate_seeds``): the curvature and the argmax of the quadratic in log ρ when rung 0 is
    concave with its vertex inside the grid, else the log-linear slope. Every pilot has the
    full per-pilot budget, so the fit stays IsoFLOP.
    """
    grid = sorted(grid)
    keys: list[Key] = [(r, 0) for r in grid]
    if any(key not in scores and key not in given_up for key in keys):
        return keys, False
    rung0 = {r: scores[(r, 0)] for r in grid if (r, 0) in scores}
    n = allocate_seeds(grid, rung0, extra=adaptive_cap(len(grid), seeds, share) - len(grid), max_seeds=seeds)
    keys += [(r, k) for r in grid for k in range(1, n[r])]
    return keys, True


def allocate_seeds(grid: Sequence[float], rung0: Mapping[float, float], *, extra: int,
                   max_seeds: int) -> dict[float, int]:
    """Seeds per grid point after giving ``extra`` seeds, one at a time, to the points whose
    next seed most reduces ``J`` (points without a rung-0 score get none).

    The regime rule fits unweighted least squares to the point means, so a coefficient is
    Σ wᵢ·ȳᵢ with fixed weights w (a row of the design's pseudo-inverse) and its variance is
    σ²·Σ wᵢ²/nᵢ (seed and evaluation noise both shrink as 1/nᵢ). J is the largest
    variance / margin² over the conditions the leading verdict needs — a squared inverse
    z-score of its weakest condition:

    - concave with the vertex v = −b/2c strictly inside the grid (a *balanced* candidate): the
      curvature c (margin |c|) and v (delta method; margin: its distance to the nearer end);
    - otherwise (a trend, or noise): the log-linear slope (margin 1: its variance alone).

    Ties go to the better-scoring point, then the lower ρ. Deterministic; no randomness.
    """
    import numpy as np

    grid = sorted(grid)
    n = {r: (1 if r in rung0 else 0) for r in grid}
    pts = [r for r in grid if r in rung0]
    if len(pts) < 2 or extra <= 0:
        return n
    x = np.log(np.asarray(pts, dtype=float))
    y = np.asarray([rung0[r] for r in pts], dtype=float)
    conditions: list[tuple[np.ndarray, float]] = []
    if len(pts) >= 3:
        wq = np.linalg.pinv(np.vander(x, 3, increasing=True))      # rows: weights of a, b, c
        _, b, c = wq @ y
        if c < 0:
            v = -b / (2 * c)
            margin = min(v - x.min(), x.max() - v)
            if margin > 0:
                conditions = [(wq[2], abs(c)), (-wq[1] / (2 * c) + b / (2 * c * c) * wq[2], margin)]
    if not conditions:
        conditions = [(np.linalg.pinv(np.vander(x, 2, increasing=True))[1], 1.0)]

    def J(counts: np.ndarray) -> float:
        return max(float(np.sum(w * w / counts)) / (m * m) for w, m in conditions)

    counts = np.ones(len(pts))
    for _ in range(extra):
        free = [i for i in range(len(pts)) if counts[i] < max_seeds]
        if not free:
            break

        def after(i: int) -> float:
            trial = counts.copy()
            trial[i] += 1
            return J(trial)

        i = min(free, key=lambda i: (round(after(i), 12), -y[i], x[i]))
        counts[i] += 1
    n.update({r: int(k) for r, k in zip(pts, counts)})
    return n


@dataclass(frozen=True)
class Informative:
    """``informative_seeds`` as an adaptive policy."""

    name: str = "informative"
    stored: Mapping[str, object] = field(default_factory=lambda: {"policy": "informative", "rungs": 2})
    description: str = "seed 0 everywhere, then the seeds that sharpen the leading verdict most"

    def needed(self, grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
               given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
        return informative_seeds(grid, seeds, scores, given_up, share=share)
