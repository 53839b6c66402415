"""Simulated reruns of a pilot grid: what a verdict's confidence predicts (issue 54). Pure.

A verdict's confidence is the predicted share of reruns (the same grid, other seed sets) that
state the same regime. A rerun differs from this grid by seed noise, so this module draws
reruns from a model of that noise fitted to this grid alone; race.stats.regime classifies each
draw with the rule itself and counts agreement (``regime.rerun_confidence``). The model:

- **Seed noise.** A point's mean over n seeds varies between reruns with variance σ²/n (σ: the
  SD of a pilot's mean between seeds; held-out prompts are fixed across reruns, so the prompt
  resample is not rerun noise). σ is known only through the pooled seed SD s on
  ν = Σ (n_p − 1) degrees of freedom: each simulated rerun draws σ² = ν s² / χ²_ν (its
  posterior under the reference prior 1/σ), so a 3-seed SD's uncertainty enters.
- **The truth.** Taken as this grid's point means: a rerun's means are drawn from
  N(means, σ²/n) (a parametric bootstrap of the grid). Two alternatives were compared on
  synthetic grids before this was chosen (research/scripts/reruns.py ``calibration``, on grids
  apart from the ones that validate it; docs/regime.md): drawing the truth from its flat-prior
  posterior as well (reruns differ by twice the noise variance), and shrinking the grid's profile
  towards flat by a James–Stein factor B = max(0, 1 − k·v̄/‖c‖²) (``shrink`` = k; v̄ = σ²·mean(1/n),
  c the point means minus their mean). Both missed their reruns by more in some confidence bin.
- **A rerun's own bootstrap.** A rerun resamples its own prompts and seeds; its replicates are
  its means plus this grid's replicate deviations, the prompt part as it is and the seed part
  scaled by s′/s, s′² = σ² χ²_ν / ν the rerun's own seed-SD estimate (so its CIs widen and
  narrow as a rerun's would).

- **Collapses** (the fat tail of the seed noise; ``simulate_mixture``, the default since the
  normal model above missed its real reruns by 0.11–0.25 a bin): a pilot that fell far below its
  point's other seeds (``collapsed_pilots``: by ≥ COLLAPSE_FLOOR, ≥ 30 % of their median and
  ≥ 4 seed SDs) is left out of the truth and of the seed SD, and each simulated rerun pilot
  collapses with probability COLLAPSE_RATE to (1 − COLLAPSE_FALL) of its score. The rate and
  fall are counted on every committed pilot (4 of 696; research/scripts/rerun_models.py
  ``collapses``); the floor was chosen leave-one-setting-out on the committed reruns
  (``loso``). A grid that shows a collapse is predicted to be rerun without it (its reruns mostly
  disagree with a collapse-driven verdict), and every grid's reruns carry the rare collapse.
  ``simulate_reruns(collapses=False)`` is the normal model alone (docs/regime.md compares them).

Invariants: deterministic in its inputs (``seed``); numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from race.core import arguments as A
from race.core.errors import RaceError
from race.stats.fit import GridScores, bootstrap_point_means, grid_scores

N_RERUNS = 400            # simulated reruns per verdict: Monte Carlo SE of the share ≤ 0.025
RERUN_REPLICATES = 500    # bootstrap replicates per simulated rerun (its CIs and support gate)
_STREAM = 54              # the simulation's random stream, apart from the bootstrap's own


@dataclass(frozen=True)
class SimulatedReruns:
    """Reruns drawn from the noise model. Shapes: ``means``: (n_reruns, n_points) each rerun's
    point means; ``replicates``: (n_reruns, n_rep, n_points) its bootstrap replicate means;
    ``shrinkage``: (n_reruns,) the factor B each draw used (1: none); ``sigma2``: (n_reruns,) its
    draw of σ²; ``seed_sd``, ``dof``: s and ν."""

    means: np.ndarray
    replicates: np.ndarray
    shrinkage: np.ndarray
    sigma2: np.ndarray
    seed_sd: float
    dof: int


class _SeedNoise(NamedTuple):
    s: float                # the grid's pooled seed SD …
    dof: int                # … on this many degrees of freedom
    prompt: np.ndarray      # (n_boot, n_points): the bootstrap point means with the seed part scaled to zero
    n_rep: int              # the replicates every rerun uses: min(n_rep, n_boot)
    d_prompt: np.ndarray    # (n_rep, n_points): their prompt deviations from the grid's point means


def _seed_noise(grid: GridScores, *, n_boot: int, seed: int, seed_resampling: str, n_rep: int) -> _SeedNoise | None:
    """What both rerun models start from (``simulate_reruns``, ``simulate_mixture``): ``grid``'s seed
    noise and the prompt part of its bootstrap, redrawn with the rule's seed; None when seed noise is
    not measured."""
    s = grid.seed_sd()
    dof = int(np.sum(grid.n_seeds - 1))
    if s is None or not s > 0 or dof < 1:
        return None
    prompt = bootstrap_point_means(grid=grid, n_boot=n_boot, seed=seed, seed_resampling=seed_resampling,
                                   seed_scale=0.0)
    n_rep = min(n_rep, n_boot)
    return _SeedNoise(s, dof, prompt, n_rep, (prompt - grid.point_means)[:n_rep])


def simulate_reruns(*, grid: GridScores, replicates: np.ndarray, seed_scale: float, seed: int = 0,
                    seed_resampling: str = "pooled", n_reruns: int = N_RERUNS,
                    n_rep: int = RERUN_REPLICATES, shrink: int = 0,
                    truth_noise: bool = False, collapses: bool = True) -> SimulatedReruns | None:
    """Draw ``n_reruns`` reruns of ``grid`` (the model in the module docstring).

    ``replicates``: (n_boot, n_points) this grid's bootstrap point means as the rule drew them
    (race.stats.fit.bootstrap_point_means with ``seed``, ``seed_resampling`` and ``seed_scale``);
    their prompt part is redrawn here with the same seed and the seed part scaled to zero, so
    the two parts separate exactly. The first ``n_rep`` replicates serve as every rerun's
    deviations. ``shrink`` > 0 (the James–Stein k) and ``truth_noise`` True (the truth drawn
    from its posterior about the shrunk means, not taken at them) are the alternatives
    research/scripts/reruns.py ``calibration`` compared; the defaults are the rule's. ``collapses``
    (with neither alternative): the collapse mixture (``simulate_mixture`` with the module's
    COLLAPSE_* constants), else the normal model alone. None when seed noise is not measured (no
    point with two seeds, or seeds that agree exactly): there is no noise to simulate.
    """
    if collapses and shrink <= 0 and not truth_noise:
        return simulate_mixture(grid=grid, replicates=replicates, seed_scale=seed_scale, seed=seed,
                                seed_resampling=seed_resampling, n_reruns=n_reruns, n_rep=n_rep, robust=True,
                                q=COLLAPSE_RATE, kappa=COLLAPSE_FALL, floor=COLLAPSE_FLOOR)
    noise = _seed_noise(grid, n_boot=replicates.shape[0], seed=seed, seed_resampling=seed_resampling, n_rep=n_rep)
    if noise is None:
        return None
    s, dof, prompt, n_rep, d_prompt = noise
    centre = grid.point_means
    d_seed = (replicates - prompt)[:n_rep]
    rng = np.random.default_rng([int(seed), _STREAM])
    n = grid.n_seeds.astype(float)
    sigma2 = dof * s * s / rng.chisquare(dof, size=n_reruns)              # posterior draws of σ²
    contrast = centre - centre.mean()
    norm2 = float(contrast @ contrast)
    v_bar = sigma2 * float(np.mean(1.0 / n))                              # one point mean's noise variance
    if shrink <= 0:
        b = np.ones(n_reruns)
    else:
        b = np.clip(1.0 - shrink * v_bar / norm2, 0.0, 1.0) if norm2 > 0 else np.zeros(n_reruns)
    sd = np.sqrt(sigma2[:, None] / n[None, :])                            # (n_reruns, n_points)
    spread = np.sqrt(b)[:, None] * sd if truth_noise else np.zeros_like(sd)
    truth = centre.mean() + b[:, None] * contrast + spread * rng.standard_normal(sd.shape)
    means = truth + sd * rng.standard_normal(sd.shape)
    ratio = np.sqrt(sigma2 * rng.chisquare(dof, size=n_reruns) / dof) / s   # the rerun's own s′ / s
    reps = means[:, None, :] + d_prompt[None] + ratio[:, None, None] * d_seed[None]
    return SimulatedReruns(means=means, replicates=reps, shrinkage=b, sigma2=sigma2, seed_sd=float(s), dof=dof)


# ---------------------------------------------------------------- a rerun model with fat tails (issue 54 item 2)

COLLAPSE_SHARE = 0.3      # a collapsed pilot kept at most 1 − this share of its point's other seeds' median …
COLLAPSE_SD = 4.0         # … fell this many seed SDs (the grid's, without the collapsed pilots) below it …
COLLAPSE_FLOOR = 0.2      # … and at least this far (a score); chosen leave-one-setting-out on the reruns
COLLAPSE_RATE = 4 / 696   # a rerun pilot's collapse probability: such pilots among all committed ones
COLLAPSE_FALL = 0.61      # the share of its score a collapsed pilot loses (their mean fall, 0.44–0.99)


class ConfidenceError(RaceError):
    """A bad argument to a rerun model (race.stats.confidence); the message names it."""


def collapsed_pilots(grid: GridScores, *, share: float = COLLAPSE_SHARE, sds: float = COLLAPSE_SD,
                     floor: float = COLLAPSE_FLOOR) -> np.ndarray:
    """(n_pilots,) bool, canonical order: the pilots that collapsed — at a point of ≥ 3 seeds, its
    lowest pilot when it lies below the median of the point's other seeds by at least ``share`` of
    that median, by at least ``sds`` pooled seed SDs (the SD of the grid without such pilots) and
    by at least ``floor`` (an absolute score).

    A fall of one seed that its point's other seeds do not share, far outside the seed noise: the
    default grid's two collapses in 132 fresh pilots (0.30 and 0.27 against 0.51–0.59) are
    found; a point where every seed fell (a systematic collapse, part of the response) is not,
    nor a low-reward setting's seed scatter (scores near 0 fall by less than ``sds`` SDs)."""
    A.instance("grid", grid, GridScores, error=ConfidenceError)
    share = A.number("share", share, gt=0.0, lt=1.0, error=ConfidenceError)
    sds = A.number("sds", sds, gt=0.0, error=ConfidenceError)
    floor = A.number("floor", floor, ge=0.0, error=ConfidenceError)
    x = grid.pilot_means
    cand = np.zeros(x.shape[0], dtype=bool)
    drop = np.zeros(x.shape[0])
    for p in range(grid.n_points):
        idx = np.flatnonzero(grid.point_index == p)
        if idx.size < 3:
            continue
        low = idx[int(np.argmin(x[idx]))]
        med = float(np.median(x[idx[idx != low]]))
        if med > 0 and med - x[low] >= max(share * med, floor):
            cand[low], drop[low] = True, med - x[low]
    if not cand.any():
        return cand
    keep = ~cand
    n = np.bincount(grid.point_index[keep], minlength=grid.n_points).astype(float)
    mean = np.bincount(grid.point_index[keep], x[keep], grid.n_points) / np.maximum(n, 1)
    dof = float(np.sum(np.maximum(n - 1, 0)))
    if dof < 1:
        return np.zeros_like(cand)
    s = math.sqrt(float(np.sum((x[keep] - mean[grid.point_index[keep]]) ** 2)) / dof)
    return cand & (drop >= sds * s)


def _subgrid(grid: GridScores, keep: np.ndarray) -> GridScores:
    return grid_scores(rho_targets=grid.rho_targets[grid.point_index[keep]], pilot_seeds=grid.pilot_seeds[keep],
                       pilot_rho=grid.pilot_rho[keep], scores=grid.scores[keep])


def _own_collapse_rate(grid: GridScores, found: np.ndarray, *, q: float, kappa: float,
                       q_weight: float) -> tuple[float, float]:
    """(q, kappa) for ``simulate_mixture``'s ``q_weight``: the population rate ``q`` worth ``q_weight``
    pilots pooled with the grid's own k of n collapsed pilots (``found``), and their mean fall from their
    point's other seeds' median when k > 0 (else ``kappa``)."""
    k, n_pilots = int(found.sum()), int(found.shape[0])
    q = (k + q_weight * q) / (n_pilots + q_weight)
    if k:
        x0 = grid.pilot_means
        falls = [1.0 - x0[i] / float(np.median(x0[(grid.point_index == grid.point_index[i]) & ~found]))
                 for i in np.flatnonzero(found)]
        kappa = float(np.clip(np.mean(falls), 0.0, 1.0))
    return q, kappa


def _draw_pilots(grid: GridScores, centre: np.ndarray, rng: np.random.Generator, *, s2: float, nu: int,
                 n_reruns: int, q: float, kappa: float, tau: float,
                 w: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point means (n_reruns, n_points), σ² (n_reruns,), each rerun's own pooled seed SD s′) of
    ``n_reruns`` reruns at ``grid``'s design, drawn pilot by pilot about ``centre`` in
    ``simulate_mixture``'s model (σ² = s2 ν/χ²_ν; ``q``, ``kappa``, ``tau``, ``w`` as there)."""
    n_full = grid.n_seeds.astype(float)
    sigma2 = s2 * nu / rng.chisquare(nu, size=n_reruns)
    sigma = np.sqrt(sigma2)
    sd = sigma[:, None] / np.sqrt(n_full)[None, :]
    truth = centre[None, :] + math.sqrt(w) * sd * rng.standard_normal(sd.shape)
    idx = grid.point_index                                               # the rerun's design: this grid's
    x = truth[:, idx] + sigma[:, None] * rng.standard_normal((n_reruns, idx.shape[0]))
    if q > 0:
        x = np.where(rng.random(x.shape) < q, (1.0 - kappa) * x, x)
    onehot = np.eye(grid.n_points)[idx]
    means = x @ onehot / n_full[None, :]
    dev = x - means[:, idx]
    s_own = np.sqrt(np.sum(dev ** 2, axis=1) / float(np.sum(n_full - 1)))
    return means + tau * sd * rng.standard_normal(sd.shape), sigma2, s_own


def simulate_mixture(*, grid: GridScores, replicates: np.ndarray, seed_scale: float, seed: int = 0,
                     seed_resampling: str = "pooled", n_reruns: int = N_RERUNS, n_rep: int = RERUN_REPLICATES,
                     robust: bool = False, q: float = 0.0, kappa: float = 0.5, q_weight: float | None = None,
                     floor: float = COLLAPSE_FLOOR, nu: int | None = None, lam: float = 1.0, tau: float = 0.0,
                     w: float = 0.0) -> SimulatedReruns | None:
    """Draw ``n_reruns`` reruns of ``grid`` pilot by pilot, with the fat tails the real reruns show
    (research/scripts/rerun_models.py compares these switches; all off: ``simulate_reruns``'s model).

    - ``robust``: the truth and the seed SD are this grid's without its collapsed pilots
      (``collapsed_pilots``), and the rerun's bootstrap deviations those of the grid without them;
    - ``q``, ``kappa``: each simulated pilot collapses with probability ``q`` to (1 − ``kappa``) of
      its score (its point mean moves by −kappa·score/n, and the rerun's own seed SD sees it);
      with ``q_weight`` = m (pilots' worth), ``q`` is a population rate and the grid's own is
      (k + m·q)/(n + m), k of its n pilots collapsed, and ``kappa`` its own collapses' mean fall
      when it has any; ``floor``: collapsed_pilots' smallest absolute fall;
    - ``nu``, ``lam``: σ² = ``lam`` · s² ν′/χ²_ν′ with ν′ = ``nu`` (None: this grid's ν) — a
      seed SD less trusted than its own degrees of freedom say;
    - ``tau``: a between-run offset per point, N(0, ``tau``² σ²/n), that the rerun's seeds do not see;
    - ``w``: the truth drawn about this grid's means with variance ``w`` σ²/n (0: at them).

    The rerun's own seed SD s′ is its simulated pilots' pooled SD (so a simulated collapse widens
    its CIs as a real one does). None when seed noise is not measured."""
    A.instance("grid", grid, GridScores, error=ConfidenceError)
    n_reruns = A.whole("n_reruns", n_reruns, ge=1, error=ConfidenceError, floats=False)
    n_rep = A.whole("n_rep", n_rep, ge=1, error=ConfidenceError, floats=False)
    robust = A.flag("robust", robust, error=ConfidenceError)
    q = A.number("q", q, ge=0.0, lt=1.0, error=ConfidenceError)
    kappa = A.number("kappa", kappa, ge=0.0, le=1.0, error=ConfidenceError)
    if nu is not None:
        nu = A.whole("nu", nu, ge=1, error=ConfidenceError, floats=False)
    lam = A.number("lam", lam, gt=0.0, error=ConfidenceError)
    tau = A.number("tau", tau, ge=0.0, error=ConfidenceError)
    w = A.number("w", w, ge=0.0, error=ConfidenceError)
    if q_weight is not None:
        q_weight = A.number("q_weight", q_weight, gt=0.0, error=ConfidenceError)
    reps_in = np.asarray(replicates, dtype=float)
    if reps_in.ndim != 2 or reps_in.shape[1] != grid.n_points or reps_in.shape[0] < 1:
        raise ConfidenceError(f"replicates of shape {reps_in.shape} must be (n_boot, {grid.n_points})")
    found = collapsed_pilots(grid, floor=floor)
    hit = found if robust else np.zeros_like(found)
    if q_weight is not None:
        q, kappa = _own_collapse_rate(grid, found, q=q, kappa=kappa, q_weight=q_weight)
    clean = _subgrid(grid, ~hit) if hit.any() else grid
    n_boot = reps_in.shape[0]
    noise = _seed_noise(clean, n_boot=n_boot, seed=seed, seed_resampling=seed_resampling, n_rep=n_rep)
    if noise is None:
        return None
    s, dof, prompt, n_rep, d_prompt = noise
    reps = reps_in if clean is grid else bootstrap_point_means(grid=clean, n_boot=n_boot, seed=seed,
                                                               seed_resampling=seed_resampling, seed_scale=seed_scale)
    # the seed part at the rerun's design (this grid's seeds a point, not the clean grid's fewer)
    d_seed = (reps - prompt)[:n_rep] * np.sqrt(clean.n_seeds / grid.n_seeds.astype(float))[None, :]
    rng = np.random.default_rng([int(seed), _STREAM, 2])
    means, sigma2, s_own = _draw_pilots(grid, clean.point_means, rng, s2=lam * s * s, nu=dof if nu is None else nu,
                                        n_reruns=n_reruns, q=q, kappa=kappa, tau=tau, w=w)
    ratio = s_own / s
    out = means[:, None, :] + d_prompt[None] + ratio[:, None, None] * d_seed[None]
    return SimulatedReruns(means=means, replicates=out, shrinkage=np.ones(n_reruns), sigma2=sigma2,
                           seed_sd=float(s), dof=dof)
