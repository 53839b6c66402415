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

Collapsed pilots (a fat tail of the seed noise) are outside this normal model: a grid's
confidence cannot foresee a collapse that its own seeds did not show (docs/regime.md).

Invariants: deterministic in its inputs (``seed``); numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from race.stats.fit import GridScores, bootstrap_point_means

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


def simulate_reruns(*, grid: GridScores, replicates: np.ndarray, seed_scale: float, seed: int = 0,
                    seed_resampling: str = "pooled", n_reruns: int = N_RERUNS,
                    n_rep: int = RERUN_REPLICATES, shrink: int = 0,
                    truth_noise: bool = False) -> SimulatedReruns | None:
    """Draw ``n_reruns`` reruns of ``grid`` (the model in the module docstring).

    ``replicates``: (n_boot, n_points) this grid's bootstrap point means as the rule drew them
    (race.stats.fit.bootstrap_point_means with ``seed``, ``seed_resampling`` and ``seed_scale``);
    their prompt part is redrawn here with the same seed and the seed part scaled to zero, so
    the two parts separate exactly. The first ``n_rep`` replicates serve as every rerun's
    deviations. ``shrink`` > 0 (the James–Stein k) and ``truth_noise`` True (the truth drawn
    from its posterior about the shrunk means, not taken at them) are the alternatives
    research/scripts/reruns.py ``calibration`` compared; the defaults are the rule's. None when seed noise is not measured (no point with two seeds, or seeds that
    agree exactly): there is no noise to simulate.
    """
    s = grid.seed_sd()
    dof = int(np.sum(grid.n_seeds - 1))
    if s is None or not s > 0 or dof < 1:
        return None
    n_boot = replicates.shape[0]
    prompt = bootstrap_point_means(grid=grid, n_boot=n_boot, seed=seed, seed_resampling=seed_resampling,
                                   seed_scale=0.0)
    centre = grid.point_means
    n_rep = min(n_rep, n_boot)
    d_prompt = (prompt - centre)[:n_rep]
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
