"""Fits of a target's reward against the update fraction ρ, and a paired bootstrap.

Pure numpy. Three response models, all in x = log ρ (ρ measured, not planned):

    constant    y = a
    log-linear  y = a + b·x            (b: reward gained per unit of log ρ)
    quadratic   y = a + b·x + c·x²     (c < 0: concave; argmax at x* = −b / 2c)

Every fit is ordinary least squares on the grid-point means (one value per grid
point, equally weighted), solved in closed form with a pseudo-inverse of the
design matrix, so the same code fits one curve ``y: (n_points,)`` or a stack of
bootstrap replicates ``y: (n_boot, n_points)`` in one matrix product.

The bootstrap (:func:`bootstrap_response`) is two-way and paired:

- evaluation prompts are resampled once per replicate and the same resample is
  applied to every pilot (the prompt set is shared and index-aligned, so prompt
  difficulty cancels between pilots instead of inflating the noise);
- seeds are resampled with replacement, each seed's deviation from its point
  mean scaled by √(n/(n−1)): with 2 seeds a plain resample gives the point mean
  a variance of s²/(2n), half the s²/n it has. ``seed_resampling="within"``
  draws the deviations inside each grid point; ``"pooled"`` (the default) draws
  them from all grid points, assuming one seed SD across the grid, which turns
  five 1-dof noise estimates (2 seeds per point) into one 5-dof estimate and
  covers a single-seed point too. ``seed_scale`` multiplies the deviations
  (race.stats.regime passes t_df / z for the few degrees of freedom). Measured
  false-verdict rates of each choice are in docs/regime.md.

Inputs are put in a canonical order first (sorted by (rho_target, seed)), so the
result depends on the pilots, not on the order in which they finished.

:func:`target_agreement` compares the verdicts of several targets of one diagnosis (scipy's
Spearman correlation of their grid-point means).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

FIT_DEGREES = {"constant": 0, "loglinear": 1, "quadratic": 2}
_RSS_FLOOR = 1e-24  # keeps log(RSS) finite for an exact fit


# ----------------------------------------------------------------------------- grid data

@dataclass(frozen=True)
class GridScores:
    """Per-prompt scores of one target on a pilot grid, in canonical order.

    Shapes: ``rho_targets``, ``rho``, ``n_seeds``: (n_points,), sorted by target ρ;
    ``point_index``, ``pilot_seeds``, ``pilot_rho``: (n_pilots,), pilots sorted by
    (rho_target, seed); ``scores``: (n_pilots, n_prompts), column j = prompt j.
    ``rho`` is the mean measured ρ of each point's pilots.
    """

    rho_targets: np.ndarray
    rho: np.ndarray
    n_seeds: np.ndarray
    point_index: np.ndarray
    pilot_seeds: np.ndarray
    pilot_rho: np.ndarray
    scores: np.ndarray

    @property
    def n_points(self) -> int:
        return int(self.rho.shape[0])

    @property
    def pilot_means(self) -> np.ndarray:
        """(n_pilots,) mean score of each pilot over all prompts."""
        return self.scores.mean(axis=1)

    @property
    def point_means(self) -> np.ndarray:
        """(n_points,) mean over the seeds of each point of the pilot means."""
        return np.bincount(self.point_index, self.pilot_means, self.n_points) / self.n_seeds

    def seed_sd(self) -> float | None:
        """Pooled within-point SD of pilot means (seed noise + evaluation noise).

        None when no point has two seeds.
        """
        dev = self.pilot_means - self.point_means[self.point_index]
        dof = int(np.sum(self.n_seeds - 1))
        return math.sqrt(float(np.sum(dev ** 2)) / dof) if dof > 0 else None


def canonical_order(*, rho_targets: np.ndarray, pilot_seeds: np.ndarray) -> np.ndarray:
    """(n_pilots,) permutation sorting pilots by (rho_target, seed)."""
    return np.lexsort((np.asarray(pilot_seeds), np.asarray(rho_targets, dtype=float)))


def grid_scores(*, rho_targets: Any, pilot_seeds: Any, pilot_rho: Any, scores: Any) -> GridScores:
    """Validate and sort pilots into a :class:`GridScores`.

    Args:
      rho_targets: (n_pilots,) planned ρ of each pilot's grid point (its group key).
      pilot_seeds: (n_pilots,) integer seeds; unique within a grid point.
      pilot_rho: (n_pilots,) measured ρ (from FLOPs actually spent), in (0, 1].
      scores: (n_pilots, n_prompts) per-prompt scores, prompts index-aligned.
    """
    t = np.asarray(rho_targets, dtype=float)
    s = np.asarray(pilot_seeds, dtype=np.int64)
    r = np.asarray(pilot_rho, dtype=float)
    y = np.asarray(scores, dtype=float)
    if y.ndim != 2 or y.shape[0] != t.shape[0] or y.shape[1] == 0:
        raise ValueError(f"scores must have shape (n_pilots={t.shape[0]}, n_prompts>0), got {y.shape}")
    if not (t.shape == s.shape == r.shape):
        raise ValueError(f"rho_targets {t.shape}, pilot_seeds {s.shape} and pilot_rho {r.shape} "
                         "must have the same shape (n_pilots,)")
    if not np.all(np.isfinite(y)):
        raise ValueError("scores contain NaN or inf; expected finite per-prompt scores")
    if not np.all((r > 0) & np.isfinite(r)):
        raise ValueError(f"measured rho must be > 0, got {r[~((r > 0) & np.isfinite(r))][0]}")
    order = canonical_order(rho_targets=t, pilot_seeds=s)
    t, s, r, y = t[order], s[order], r[order], y[order]
    dup = (t[1:] == t[:-1]) & (s[1:] == s[:-1])
    if np.any(dup):
        i = int(np.argmax(dup))
        raise ValueError(f"duplicate pilot (rho_target={t[i]}, seed={s[i]}); expected one result each")
    targets, index, n_seeds = np.unique(t, return_inverse=True, return_counts=True)
    rho = np.bincount(index, r) / n_seeds
    return GridScores(targets, rho, n_seeds, index, s, r, y)


# ----------------------------------------------------------------------------- fits

@dataclass(frozen=True)
class Fit:
    """Least-squares fit of y on powers of x = log ρ.

    ``coef``: (..., degree + 1), lowest power first; ``rss``: (...,) residual sum
    of squares; ``n``: points per fit. Leading dimensions are bootstrap replicates.
    """

    name: str
    coef: np.ndarray
    rss: np.ndarray
    n: int

    @property
    def k(self) -> int:
        return int(self.coef.shape[-1])

    @property
    def rmse(self) -> np.ndarray:
        return np.sqrt(self.rss / self.n)

    @property
    def aic(self) -> np.ndarray:
        """Gaussian AIC up to a constant: n·log(RSS/n) + 2k."""
        return self.n * np.log(np.maximum(self.rss, _RSS_FLOOR) / self.n) + 2 * self.k

    @property
    def aicc(self) -> np.ndarray | None:
        """Small-sample AIC, AIC + 2k(k+1)/(n−k−1); None when n ≤ k + 1."""
        if self.n - self.k - 1 <= 0:
            return None
        return self.aic + 2 * self.k * (self.k + 1) / (self.n - self.k - 1)

    def predict(self, *, rho: Any) -> np.ndarray:
        """Fitted y at ``rho``: (m,) → (..., m)."""
        return self.coef @ design(x=np.log(np.asarray(rho, dtype=float)), degree=self.k - 1).T

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (only for a single fit, not a stack)."""
        aicc = self.aicc
        return {"coef": [float(c) for c in self.coef], "rss": float(self.rss),
                "rmse": float(self.rmse), "aic": float(self.aic),
                "aicc": None if aicc is None else float(aicc)}


def design(*, x: np.ndarray, degree: int) -> np.ndarray:
    """(n, degree + 1) design matrix [1, x, x², …] for x: (n,)."""
    return np.vander(np.asarray(x, dtype=float), degree + 1, increasing=True)


def fit_poly(*, rho: Any, y: Any, degree: int, name: str = "") -> Fit:
    """Fit y = Σ_k coef_k·(log ρ)^k by least squares.

    Args:
      rho: (n_points,) measured ρ; shared by every replicate.
      y: (n_points,) or (n_boot, n_points).
    """
    x = np.log(np.asarray(rho, dtype=float))
    y = np.asarray(y, dtype=float)
    if len(np.unique(x)) <= degree:
        raise ValueError(f"a degree-{degree} fit needs ≥ {degree + 1} distinct ρ, got {len(np.unique(x))}")
    X = design(x=x, degree=degree)
    coef = y @ np.linalg.pinv(X).T
    rss = np.sum((y - coef @ X.T) ** 2, axis=-1)
    return Fit(name or f"degree{degree}", coef, rss, int(x.shape[0]))


def fit_constant(*, rho: Any, y: Any) -> Fit:
    """y = a. Shapes as in :func:`fit_poly`."""
    return fit_poly(rho=rho, y=y, degree=0, name="constant")


def fit_loglinear(*, rho: Any, y: Any) -> Fit:
    """y = a + b·log ρ. Shapes as in :func:`fit_poly`; slope b = coef[..., 1]."""
    return fit_poly(rho=rho, y=y, degree=1, name="loglinear")


def fit_quadratic(*, rho: Any, y: Any) -> Fit:
    """y = a + b·x + c·x², x = log ρ. Shapes as in :func:`fit_poly`; c = coef[..., 2]."""
    return fit_poly(rho=rho, y=y, degree=2, name="quadratic")


def compare_fits(*, rho: Any, y: Any) -> dict[str, Fit]:
    """The three response fits of y: (n_points,) against ρ: (n_points,), by name."""
    return {name: fit_poly(rho=rho, y=y, degree=d, name=name) for name, d in FIT_DEGREES.items()
            if len(np.unique(rho)) > d}


def quadratic_argmax(*, coef: np.ndarray, rho_min: float, rho_max: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where a quadratic in log ρ peaks on the grid interval [rho_min, rho_max].

    Args:
      coef: (..., 3) coefficients (a, b, c) of y = a + b·x + c·x², x = log ρ.
    Returns:
      argmax_rho (...,): the maximiser on the closed interval — the vertex
        exp(−b/2c) when the fit is concave with its vertex inside, else the better
        end of the grid (i.e. clamped);
      concave (...,): c < 0;
      interior (...,): concave and lo < vertex < hi (strictly).
    """
    coef = np.asarray(coef, dtype=float)
    b, c = coef[..., 1], coef[..., 2]
    lo, hi = math.log(rho_min), math.log(rho_max)
    concave = c < 0
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = np.where(concave, -b / (2 * np.where(concave, c, -1.0)), lo)
    interior = concave & (vertex > lo) & (vertex < hi)
    cand = np.stack([np.full_like(b, lo), np.full_like(b, hi), np.clip(vertex, lo, hi)], axis=-1)
    val = coef[..., :1] + b[..., None] * cand + c[..., None] * cand ** 2
    best = np.take_along_axis(cand, np.argmax(val, axis=-1)[..., None], axis=-1)[..., 0]
    return np.exp(best), concave, interior


def t_quantile(*, q: float, df: int) -> float:
    """Student-t quantile without scipy: exact for df ≤ 2, else a 4-term Cornish–Fisher
    expansion (for q ≤ 0.975: error ≤ 0.025 at df = 3, ≤ 0.01 for df ≥ 4)."""
    if df == 1:
        return math.tan(math.pi * (q - 0.5))
    if df == 2:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    z = NormalDist().inv_cdf(q)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def percentile_ci(*, samples: np.ndarray, confidence_level: float) -> tuple[float, float]:
    """Two-sided percentile interval of samples: (n_boot,) at ``confidence_level``."""
    q = (1.0 - confidence_level) / 2.0
    lo, hi = np.quantile(np.asarray(samples, dtype=float), [q, 1.0 - q])
    return float(lo), float(hi)


# ----------------------------------------------------------------------------- bootstrap

@dataclass(frozen=True)
class BootstrapResponse:
    """Bootstrap replicates of the response of one target to ρ.

    Shapes: ``point_means``: (n_boot, n_points); ``loglinear``: (n_boot, 2);
    ``quadratic``: (n_boot, 3); ``argmax_rho``, ``concave``, ``interior``,
    ``best_point``: (n_boot,). ``rho``: (n_points,) the fixed x positions
    (mean measured ρ per point).
    """

    rho: np.ndarray
    point_means: np.ndarray
    loglinear: np.ndarray
    quadratic: np.ndarray
    argmax_rho: np.ndarray
    concave: np.ndarray
    interior: np.ndarray

    @property
    def n_boot(self) -> int:
        return int(self.point_means.shape[0])

    @property
    def slope(self) -> np.ndarray:
        """(n_boot,) slope b of the log-linear fit."""
        return self.loglinear[:, 1]

    @property
    def curvature(self) -> np.ndarray:
        """(n_boot,) curvature c of the quadratic fit (c < 0: concave)."""
        return self.quadratic[:, 2]

    @property
    def best_point(self) -> np.ndarray:
        """(n_boot,) index of the grid point with the highest replicate mean."""
        return np.argmax(self.point_means, axis=1)


SEED_RESAMPLING = ("pooled", "within")


def _seed_noise_within(grid: GridScores, pilot_means: np.ndarray, rng: np.random.Generator,
                       scale: float) -> np.ndarray:
    """(n_boot, n_points) seed resample within each point, deviations scaled by √(n/(n−1)).

    Replicate point mean = 1/n Σ_i [m̄ + √(n/(n−1))·(m_i − m̄)] over n seeds drawn with
    replacement; a single-seed point stays at its one pilot.
    """
    n_boot = pilot_means.shape[0]
    out = np.empty((n_boot, grid.n_points))
    for p in range(grid.n_points):           # canonical order ⇒ deterministic draws
        m = pilot_means[:, grid.point_index == p]
        n = m.shape[1]
        mean = m.mean(axis=1, keepdims=True)
        if n == 1:
            out[:, p] = m[:, 0]
            continue
        pick = rng.integers(0, n, size=(n_boot, n))
        dev = np.take_along_axis(m - mean, pick, axis=1) * (scale * math.sqrt(n / (n - 1)))
        out[:, p] = mean[:, 0] + dev.mean(axis=1)
    return out


def _seed_noise_pooled(grid: GridScores, pilot_means: np.ndarray, rng: np.random.Generator,
                       scale: float) -> np.ndarray:
    """(n_boot, n_points) seed resample from the deviations of all points, pooled.

    Each point of n seeds gets its mean plus the average of n deviations drawn
    with replacement from every pilot of a multi-seed point, each deviation
    (m_i − m̄_point)·√(n_i/(n_i−1)). Assumes one seed SD across the grid; it turns
    5 points × 1 degree of freedom (2 seeds) into one 5-dof noise estimate.
    """
    onehot = np.eye(grid.n_points)[grid.point_index]                  # (n_pilots, n_points)
    mean = pilot_means @ onehot / grid.n_seeds                         # (n_boot, n_points)
    n_i = grid.n_seeds[grid.point_index]
    pool = np.flatnonzero(n_i > 1)
    if pool.size == 0:
        return mean
    dev = (pilot_means - mean[:, grid.point_index])[:, pool] * (scale * np.sqrt(n_i[pool] / (n_i[pool] - 1)))
    pick = rng.integers(0, pool.size, size=(pilot_means.shape[0], grid.point_index.shape[0]))
    return mean + np.take_along_axis(dev, pick, axis=1) @ onehot / grid.n_seeds


def bootstrap_point_means(*, grid: GridScores, n_boot: int = 1000, seed: int = 0,
                          seed_resampling: str = "pooled", seed_scale: float = 1.0) -> np.ndarray:
    """(n_boot, n_points) replicate point means: prompts resampled (paired), then seeds.

    ``seed_resampling``: "pooled" (default) draws seed deviations from all grid
    points; "within" resamples seeds inside each point only. docs/regime.md has
    the false-verdict rates of both. With no multi-seed point, only evaluation
    noise is covered.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be ≥ 1, got {n_boot}")
    if seed_resampling not in SEED_RESAMPLING:
        raise ValueError(f"seed_resampling {seed_resampling!r} is unknown; expected one of {SEED_RESAMPLING}")
    rng = np.random.default_rng(seed)
    pilot_means = _prompt_counts(rng, n_boot, grid.scores.shape[1]) @ grid.scores.T / grid.scores.shape[1]
    noise = _seed_noise_pooled if seed_resampling == "pooled" else _seed_noise_within
    return noise(grid, pilot_means, rng, seed_scale)


def _prompt_counts(rng: np.random.Generator, n_boot: int, n_prompts: int) -> np.ndarray:
    """(n_boot, n_prompts) how often each prompt is drawn in each replicate (a resample with replacement)."""
    draws = rng.integers(0, n_prompts, size=(n_boot, n_prompts))
    flat = (draws + n_prompts * np.arange(n_boot)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n_prompts).reshape(n_boot, n_prompts).astype(float)


def bootstrap_paired_grids(*, grids: Sequence[GridScores], n_boot: int = 1000, seed: int = 0,
                           seed_resampling: str = "pooled", seed_scale: float = 1.0) -> list[np.ndarray]:
    """Replicate point means of several grids scored on the same index-aligned prompts (one
    policy each, race.run.multimodel): one (n_boot, n_points_g) array per grid.

    Paired like :func:`bootstrap_point_means` within a grid, and across grids too: every
    replicate draws one prompt resample that all grids share (prompt difficulty cancels between
    policies); then each grid's seeds are resampled with its own random stream (its pilots are
    its own), ``seed_resampling`` inside that grid only (no seed SD is pooled across policies).
    Deterministic in (grids, n_boot, seed).
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be ≥ 1, got {n_boot}")
    if seed_resampling not in SEED_RESAMPLING:
        raise ValueError(f"seed_resampling {seed_resampling!r} is unknown; expected one of {SEED_RESAMPLING}")
    widths = sorted({g.scores.shape[1] for g in grids})
    if len(widths) != 1:
        raise ValueError(f"grids have prompt counts {widths}: a paired bootstrap needs the same index-aligned "
                         "held-out prompts in every grid")
    streams = np.random.SeedSequence(seed).spawn(len(grids) + 1)
    counts = _prompt_counts(np.random.default_rng(streams[0]), n_boot, widths[0])
    noise = _seed_noise_pooled if seed_resampling == "pooled" else _seed_noise_within
    return [noise(g, counts @ g.scores.T / widths[0], np.random.default_rng(st), seed_scale)
            for g, st in zip(grids, streams[1:])]


def bootstrap_response(*, grid: GridScores, n_boot: int = 1000, seed: int = 0,
                       seed_resampling: str = "pooled", seed_scale: float = 1.0) -> BootstrapResponse:
    """Bootstrap the fits of ``grid`` (see the module docstring for the scheme).

    Deterministic in (grid, n_boot, seed). Cost: one (n_boot × n_prompts) by
    (n_prompts × n_pilots) product plus three (n_boot × n_points) fits.
    """
    means = bootstrap_point_means(grid=grid, n_boot=n_boot, seed=seed, seed_resampling=seed_resampling,
                                  seed_scale=seed_scale)
    return response_of_means(rho=grid.rho, means=means)


def response_of_means(*, rho: Any, means: Any) -> BootstrapResponse:
    """The ρ fits of replicate point means ``means``: (n_boot, n_points) at ``rho``: (n_points,),
    however the replicates were drawn (race.stats.forecast passes predicted rewards at a full-run budget)."""
    rho = np.asarray(rho, dtype=float)
    means = np.asarray(means, dtype=float)
    lin = fit_loglinear(rho=rho, y=means).coef
    if rho.shape[0] >= 3:
        quad = fit_quadratic(rho=rho, y=means).coef
    else:
        quad = np.concatenate([lin, np.zeros((means.shape[0], 1))], axis=1)
    argmax, concave, interior = quadratic_argmax(coef=quad, rho_min=float(rho.min()), rho_max=float(rho.max()))
    return BootstrapResponse(rho, means, lin, quad, argmax, concave, interior)


def target_agreement(diag: Diagnosis) -> list[dict[str, Any]]:
    """How each target's verdict compares with the primary target's, primary first: its regime and
    whether it is the primary's (``same_regime``), whether the two recommended ρ ranges overlap,
    its best grid point, and the Spearman rank correlation of its grid-point means with the
    primary's (``rank_corr``: 1 = the targets order the grid alike; None when either is constant).
    This is the disagreement table of the reports: a native reward and a downstream benchmark that
    pick different ρ are the case the paper warns of (better training reward, no better held-out)."""
    from scipy.stats import spearmanr

    p = diag.primary
    base = {pt.rho_target: pt.reward_mean for pt in p.points}
    rows = []
    for name in [diag.primary_target] + [t for t in diag.verdicts if t != diag.primary_target]:
        v = diag.verdicts[name]
        means = {pt.rho_target: pt.reward_mean for pt in v.points}
        common = sorted(set(base) & set(means))
        xs, ys = [base[r] for r in common], [means[r] for r in common]
        corr = None
        if len(common) >= 3 and len(set(xs)) > 1 and len(set(ys)) > 1:
            corr = float(spearmanr(xs, ys).statistic)
        rows.append({"target": name, "regime": v.regime.value, "same_regime": v.regime is p.regime,
                     "rho_range": list(v.rho_range), "open_side": v.open_side,
                     "ranges_overlap": v.bounds[0] <= p.bounds[1] and p.bounds[0] <= v.bounds[1],
                     "best_rho": v.best_rho, "rank_corr": corr})
    return rows
