"""The pilots' held-out curves as the forecast reads them (race.stats.forecast): every complete pilot
with checkpoints of the target, grouped and aligned, and the per-ρ points the curve fits take. Pure:
numpy only (``import race`` does not import this module).

**Data.** Every complete pilot with held-out checkpoints of the target (race.stats.instability) gives
per-prompt scores at several FLOP counts C, the base policy at C = 0 first. Pilots of one grid
point in one results file form a *group*; its checkpoints are aligned by budget fraction (those
every pilot of the group has). Several results files of one setup at different budgets can be
pooled (``runs``): their groups add points at smaller C to the same ρ. The *pilot budget* B is the
largest pooled budget; x = ln(C / B).

**Fit inputs.** Per ρ, the mean curve over seeds (each checkpoint after the base one point, equally
weighted; ``fit_data``), with R0 the mean base-policy score over all pilots (``base_score``: one
base policy, so R0 is shared by every ρ and never fitted), and the observed end of each ρ's pilots
at the largest budget (``pilot_ends``), which the backtests predict.

Invariants: groups in canonical order (run, ρ), pilots sorted by seed, so everything here is
independent of the order of the pilots; data it cannot use is a ``ForecastError`` or a note, never
another exception; every public function checks its arguments on entry (race.core.arguments: a
``ForecastError`` naming the argument, its value and what was expected).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from race.core import arguments as A
from race.core.errors import RaceError
from race.core.records import PilotResult

_FRACTION_DIGITS = 6


class ForecastError(RaceError):
    """Pilots a forecast cannot be made from (no or too few checkpoints); the report turns it
    into its one-line refusal."""


@dataclass(frozen=True)
class CurveGroup:
    """The pilots of one grid point in one results file. Shapes: ``fractions``, ``flops``:
    (n_k,), checkpoint k's budget fraction (0: base, 1: end) and mean FLOPs over the pilots;
    ``scores``: (n_pilots, n_k, K) per-prompt scores; pilots sorted by seed."""

    run: int
    rho_target: float
    rho: float
    budget: float
    reward_share: float
    seeds: tuple[int, ...]
    fractions: np.ndarray
    flops: np.ndarray
    scores: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        """(n_k,) mean score over prompts and pilots at each checkpoint."""
        return self.scores.mean(axis=(0, 2))


@dataclass(frozen=True)
class Curves:
    """Every group of the pooled runs, in canonical order (run, ρ); ``points``: the ρ targets
    forecast (those of the runs at the largest budget, ``budget``), ``rho`` their mean measured ρ,
    ``reward_share`` their C_reward / C_total; ``unit``: every score lies in [0, 1]."""

    groups: tuple[CurveGroup, ...]
    points: np.ndarray
    rho: np.ndarray
    reward_share: np.ndarray
    budget: float
    budgets: tuple[float, ...]
    unit: bool
    warnings: tuple[str, ...] = ()

    def point_of(self, g: CurveGroup) -> int | None:
        hit = np.flatnonzero(np.isclose(self.points, g.rho_target))
        return int(hit[0]) if hit.size else None

    def primary(self, g: CurveGroup) -> bool:
        return math.isclose(g.budget, self.budget, rel_tol=1e-9)


def _fraction_key(f: float) -> float:
    """A checkpoint's budget fraction as the key that aligns pilots (rounded: as stored, not as run)."""
    return round(float(f), _FRACTION_DIGITS)


def check_runs(runs: Any) -> None:
    """``runs``: a list of (pilots, pilot budget) pairs, each budget a positive finite FLOP count."""
    items = A.items("runs", runs, error=ForecastError, what="(pilots, pilot budget) pairs")
    if not items:
        raise ForecastError("runs []: expected at least one (pilots, pilot budget) pair to forecast from")
    for i, run in enumerate(items):
        pair = A.items(f"runs[{i}]", run, error=ForecastError, what="(pilots, pilot budget)")
        if len(pair) != 2:
            raise ForecastError(f"runs[{i}] has {len(pair)} items: expected (pilots, pilot budget)")
        for j, p in enumerate(A.items(f"runs[{i}][0]", pair[0], error=ForecastError, what="PilotResult")):
            if not isinstance(p, PilotResult):
                raise ForecastError(f"runs[{i}][0][{j}] {str(p)[:60]!r} must be a race.core.records.PilotResult")
        A.number(f"runs[{i}][1]", pair[1], gt=0, error=ForecastError, expected="a positive finite FLOP count")


def checked_curves(curves: Any, name: str = "curves") -> "Curves":
    """``curves`` when it is a ``Curves`` (``collect_curves``'s), else a ForecastError naming it."""
    return A.instance(name, curves, Curves, error=ForecastError,
                      expected="a race.stats.curves.Curves (from collect_curves)")


def _checked_means(curves: Curves, means: Any) -> list[np.ndarray]:
    """``means``: one array per group of ``curves`` whose last axis is the group's checkpoints, finite."""
    ms = A.items("means", means, error=ForecastError, what="arrays, one per group of curves")
    if len(ms) != len(curves.groups):
        raise ForecastError(f"means has {len(ms)} items, curves {len(curves.groups)} groups: expected one mean "
                            "curve per group ([g.mean for g in curves.groups])")
    out = []
    for i, (m, g) in enumerate(zip(ms, curves.groups)):
        try:
            a = np.asarray(m, dtype=float)
        except (TypeError, ValueError):
            raise ForecastError(f"means[{i}] {str(m)[:60]!r} must be an array of numbers") from None
        if a.ndim < 1 or a.shape[-1] != g.scores.shape[1] or not np.all(np.isfinite(a)):
            raise ForecastError(f"means[{i}] of shape {a.shape} must hold {g.scores.shape[1]} finite scores on its "
                                "last axis, one per checkpoint of its group")
        out.append(a)
    return out


def collect_curves(runs: Sequence[tuple[Sequence[PilotResult], float]], target: str) -> Curves:
    """Group the complete pilots of ``runs`` (each: pilots, pilot budget) with checkpoints of
    ``target``. Raises ForecastError when no grid point at the largest budget has any."""
    check_runs(runs)
    A.text("target", target, error=ForecastError)
    if not runs:
        raise ForecastError("no pilots to forecast from")
    notes: list[str] = []
    groups: list[CurveGroup] = []
    for r, (pilots, budget) in enumerate(runs):
        by_rho: dict[float, list[PilotResult]] = {}
        for p in pilots:
            if p.status == "complete" and any(target in c.evals for c in p.checkpoints):
                by_rho.setdefault(p.rho_target, []).append(p)
        for rho_t in sorted(by_rho):
            g = _group(r, rho_t, sorted(by_rho[rho_t], key=lambda p: p.seed), float(budget), target, notes)
            if g is not None:
                groups.append(g)
    if not groups:
        raise ForecastError(f"the pilots have no held-out checkpoints of {target!r} (eval.checkpoints off, or "
                            "results written before checkpoints): re-run the pilots with eval.checkpoints on")
    budget = max(g.budget for g in groups)
    prim = [g for g in groups if math.isclose(g.budget, budget, rel_tol=1e-9)]
    points = np.array(sorted({g.rho_target for g in prim}))
    extra = sorted({g.rho_target for g in groups} - set(points.tolist()))
    if extra:
        notes.append(f"pooled runs' ρ {', '.join(f'{x:g}' for x in extra)} are not in the grid at the largest "
                     "budget and were left out")
        groups = [g for g in groups if g.rho_target in set(points.tolist())]
    rho = np.array([np.average([g.rho for g in prim if g.rho_target == t],
                               weights=[len(g.seeds) for g in prim if g.rho_target == t]) for t in points])
    share = np.array([np.average([g.reward_share for g in prim if g.rho_target == t],
                                 weights=[len(g.seeds) for g in prim if g.rho_target == t]) for t in points])
    unit = all(float(g.scores.min()) >= 0.0 and float(g.scores.max()) <= 1.0 for g in groups)
    return Curves(tuple(groups), points, rho, share, budget, tuple(sorted({g.budget for g in groups})), unit,
                  tuple(notes))


def _group(run: int, rho_t: float, pilots: list[PilotResult], budget: float, target: str,
           notes: list[str]) -> CurveGroup | None:
    """Align the pilots' checkpoints by fraction; None (with a note) when they share no base and end."""
    per: list[dict[float, Any]] = []
    k_prompts = None
    kept: list[PilotResult] = []
    for p in pilots:
        cps = {_fraction_key(c.fraction): c for c in p.checkpoints if c.evals.get(target)}
        base = cps.get(0.0)
        if base is None:
            continue
        k = len(base.evals[target])
        cps = {f: c for f, c in cps.items() if len(c.evals[target]) == k}
        if k_prompts is None:
            k_prompts = k
        if k != k_prompts:
            notes.append(f"ρ={rho_t:g} seed {p.seed}: {k} checkpoint prompts, others {k_prompts}; left out")
            continue
        per.append(cps)
        kept.append(p)
    if not per:
        return None
    common = sorted(set.intersection(*(set(c) for c in per)))
    if 0.0 not in common or 1.0 not in common or len(common) < 3:
        notes.append(f"ρ={rho_t:g}: its pilots share no base, end and middle checkpoint; left out of the forecast")
        return None
    scores = np.array([[c[f].evals[target] for f in common] for c in per], dtype=float)
    flops = np.array([[c[f].flops.total for f in common] for c in per], dtype=float).mean(axis=0)
    share = float(np.mean([p.flops.shares()["reward"] for p in kept]))
    fractions = np.array([per[0][f].fraction for f in common], dtype=float)     # as run, not rounded
    return CurveGroup(run, rho_t, float(np.mean([p.rho for p in kept])), budget, share,
                      tuple(p.seed for p in kept), fractions, flops, scores)


def base_score(curves: Curves, means: Sequence[np.ndarray]) -> np.ndarray:
    """Mean base-policy score over every pilot: means[g] (..., n_k), column 0 the base."""
    means = _checked_means(checked_curves(curves), means)
    w = np.array([len(g.seeds) for g in curves.groups], dtype=float)
    return sum(wi * m[..., 0] for wi, m in zip(w, means)) / w.sum()


def fit_data(curves: Curves, means: Sequence[np.ndarray], cut: float | None = None
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per point (x, y) of the checkpoints after the base, those at or below ``cut`` (a fraction of
    the pilot budget; None: all): by fraction in the largest-budget runs, by FLOPs in the others."""
    means = _checked_means(checked_curves(curves), means)
    if cut is not None:
        cut = A.number("cut", cut, gt=0, le=1, error=ForecastError, expected="a fraction of the pilot budget in (0, 1]")
    xs: list[list[np.ndarray]] = [[] for _ in curves.points]
    ys: list[list[np.ndarray]] = [[] for _ in curves.points]
    for g, m in zip(curves.groups, means):
        p = curves.point_of(g)
        keep = g.fractions > 0
        if cut is not None:
            keep &= (g.fractions <= cut + 1e-9) if curves.primary(g) else (g.flops <= cut * curves.budget * (1 + 1e-9))
        xs[p].append(np.log(g.flops[keep] / curves.budget))
        ys[p].append(m[keep])
    return [(np.concatenate(x), np.concatenate(y)) for x, y in zip(xs, ys)]


def pilot_ends(curves: Curves) -> tuple[np.ndarray, np.ndarray]:
    """(P,) mean FLOPs and mean score at the end of each point's pilots at the largest budget."""
    checked_curves(curves)
    c_end, y_end = np.zeros(len(curves.points)), np.zeros(len(curves.points))
    w = np.zeros(len(curves.points))
    for g in curves.groups:
        if curves.primary(g):
            p = curves.point_of(g)
            n = len(g.seeds)
            c_end[p] += n * g.flops[-1]
            y_end[p] += n * g.mean[-1]
            w[p] += n
    return c_end / w, y_end / w


def point_curve(curves: Curves, point: int) -> tuple[tuple[float, float], ...]:
    """(FLOPs, mean score) of every checkpoint after the base of grid point ``point``, its groups in
    order: the held-out curve a forecast stores per ρ (``ForecastPoint.curve``)."""
    checked_curves(curves)
    point = A.whole("point", point, ge=0, le=len(curves.points) - 1, floats=False, error=ForecastError,
                    expected=f"a grid point's index, 0 to {len(curves.points) - 1}")
    out: list[tuple[float, float]] = []
    for g in curves.groups:
        if curves.point_of(g) == point:
            out += [(float(c), float(y)) for c, y, f in zip(g.flops, g.mean, g.fractions) if f > 0]
    return tuple(out)
