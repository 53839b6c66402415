"""From the pilots' held-out curves to the full run: reward against compute per ρ, a backtest that
chooses the model and bounds the extrapolation, and the prediction at the full-run budget. Pure:
numpy and scipy (imported here, and ``import race`` does not import this module).

**Data.** Every complete pilot with held-out checkpoints of the target (race.stats.instability) gives
per-prompt scores at several FLOP counts C, the base policy at C = 0 first. Pilots of one grid
point in one results file form a *group*; its checkpoints are aligned by budget fraction (those
every pilot of the group has). Several results files of one setup at different budgets can be
pooled (``runs``): their groups add points at smaller C to the same ρ. The *pilot budget* B is the
largest pooled budget; x = ln(C / B).

**Models**, fitted per ρ to the mean curve over seeds (each checkpoint after the base one point,
equally weighted), with R0 the mean base-policy score over all pilots (one base policy: R0 is
shared by every ρ and never fitted):

- ``sigmoid``, ScaleRL's R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) = R0 + (A − R0)·expit(B·(x − m)),
  m = ln(C_mid / B); per ρ A and C_mid, and a slope B shared by all ρ unless one B per ρ has the
  lower AICc (the data tell the slopes apart); least squares by ``scipy.optimize.least_squares``
  (trust-region reflective, analytic Jacobian) within bounds: B ∈ B_BOUNDS, C_mid within
  MID_SPAN (1000×) of the checkpoints' FLOPs either side, and A ∈ [0, 1] when every per-prompt
  score is in [0, 1] (a rate), else within twice the observed range beyond it; three starts;
- ``loglinear``: R(C) = a + b·ln C per ρ (ordinary least squares), the simpler baseline.

**Backtest.** For each checkpoint fraction f of the pilot budget with at least MIN_PREFIX_POINTS
checkpoints per ρ at or below it: fit on those (and on pooled runs' checkpoints with C ≤ f·B),
predict the end of every ρ's pilots, and compare with the observed end (same checkpoint prompts).
Its *factor* is the geometric mean over ρ of end FLOPs / last fitted FLOPs. Errors: ``mae``
(mean absolute error over ρ) and ``contrast_mae`` (after removing the mean error over ρ: the part
of the error that can reorder ρ). A backtest *holds* when contrast_mae < HOLD_SHARE × the spread
(max − min) of the observed end scores over ρ: errors that small cannot swap the best and the
worst ρ. The model is the one with the lower ``mae`` at the half-budget backtest (the largest
f ≤ BACKTEST_CUT); a tie goes to ``loglinear``, the simpler one.

**Refusal.** The supported factor f* is the largest backtest factor up to which every backtest of
the chosen model held (none held: no f*). A full run F with F / B ≤ 1, or ≤ f*, is predicted;
otherwise the forecast is refused in one line that names the pilot budget that would support it
(F / f*, or F / SCALERL_FACTOR when no backtest held), unless ``force``, which predicts anyway and
marks it forced. Missing checkpoints or too few of them are refused the same way, never raised.

**Prediction.** The chosen model fitted on all checkpoints, evaluated at F per ρ, with percentile
CIs from a paired bootstrap as race.stats.fit's: checkpoint prompts resampled once per replicate
(index-aligned across pilots and checkpoints), whole pilot curves resampled within their group
with deviations scaled by √(n/(n−1))·t_df/z; each replicate refitted from the point fit. The
regime at F is race.stats.regime's rule on the predicted scores and their replicates
(``response_verdict``), the reward share at the best point being the schedule's, as at the pilot
budget. Deterministic in (pilots, F, n_boot, seed); pilots in any order.

**Stability is not forecast.** The curves assume each run keeps rising; a run that collapses
late (none of its pilots fell back) is outside what checkpoints can extrapolate. So every
forecast carries the stability line at F (``race.stats.instability.stability_at``: stable, at risk with
its evidence, or not tested), whatever its status, beside the range at F (``race.stats.drift``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

from race.core import arguments as A
from race.stats.instability import stability, stability_at
from race.core.errors import RaceError
from race.core.records import Backtest, Forecast, ForecastPoint, PilotResult, Regime

MODELS = ("sigmoid", "loglinear")
BACKTEST_CUT = 0.5           # the model is chosen by the backtest fitted up to this fraction of the budget
MIN_PREFIX_POINTS = 3        # checkpoints after the base per ρ that a backtest fit needs
HOLD_SHARE = 0.5             # a backtest holds when its contrast error < this share of the ρ spread
SCALERL_FACTOR = 2.0         # ScaleRL's prefix fits held to about 2×: the advice when no backtest held
FORECAST_N_BOOT = 1000       # bootstrap replicates (race.stats.fit's convention)
B_BOUNDS = (0.05, 10.0)      # the sigmoid's slope B
MID_SPAN = math.log(1000.0)  # C_mid within 1000× of the checkpoints' FLOPs
# evaluations per parameter before a sigmoid fit stops (was 200 until 2026-12-02): on the validation
# study's pilot grids every fit of a grid that gets a forecast converged within 74 evaluations in all;
# only flat or collapsed grids (lr-x3, hard, reasoner: refused at either cap) ran past 600, 7–15 s
# per forecast at 200 (research/probes/forecast_fit_cost.py)
MAX_NFEV_PER_PARAM = 50
TIE = 1e-3                   # backtest errors closer than this are a tie (→ loglinear)
_FRACTION_DIGITS = 6


class ForecastError(RaceError):
    """Pilots a forecast cannot be made from (no or too few checkpoints); the report turns it
    into its one-line refusal."""


# ----------------------------------------------------------------------------- data

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
    return round(float(f), _FRACTION_DIGITS)


def _runs(runs: Any) -> None:
    """``runs``: a list of (pilots, pilot budget) pairs, each budget a positive finite FLOP count."""
    for i, run in enumerate(A.items("runs", runs, error=ForecastError, what="(pilots, pilot budget) pairs")):
        pair = A.items(f"runs[{i}]", run, error=ForecastError, what="(pilots, pilot budget)")
        if len(pair) != 2:
            raise ForecastError(f"runs[{i}] has {len(pair)} items: expected (pilots, pilot budget)")
        for j, p in enumerate(A.items(f"runs[{i}][0]", pair[0], error=ForecastError, what="PilotResult")):
            if not isinstance(p, PilotResult):
                raise ForecastError(f"runs[{i}][0][{j}] {str(p)[:60]!r} must be a race.core.records.PilotResult")
        A.number(f"runs[{i}][1]", pair[1], gt=0, error=ForecastError, expected="a positive finite FLOP count")


def collect_curves(runs: Sequence[tuple[Sequence[PilotResult], float]], target: str) -> Curves:
    """Group the complete pilots of ``runs`` (each: pilots, pilot budget) with checkpoints of
    ``target``. Raises ForecastError when no grid point at the largest budget has any."""
    _runs(runs)
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


# ----------------------------------------------------------------------------- models

@dataclass(frozen=True)
class SurfaceFit:
    """One model fitted to every ρ at once. ``params``: (P, 3) sigmoid (A, m, B) with
    m = ln(C_mid / budget), or (P, 2) loglinear (a, b) in x = ln(C / budget); ``shared``: one B."""

    model: str
    r0: float
    params: np.ndarray
    shared: bool
    rss: float
    n: int
    k: int

    def predict(self, x: Any) -> np.ndarray:
        """Fitted score per ρ at x = ln(C / budget): x (P,) or scalar → (P,)."""
        x = np.broadcast_to(np.asarray(x, dtype=float), (self.params.shape[0],))
        if self.model == "loglinear":
            return self.params[:, 0] + self.params[:, 1] * x
        from scipy.special import expit

        a, m, b = self.params.T
        return self.r0 + (a - self.r0) * expit(b * (x - m))

    @property
    def aicc(self) -> float:
        aic = self.n * math.log(max(self.rss, 1e-24) / self.n) + 2 * self.k
        return aic + (2 * self.k * (self.k + 1) / (self.n - self.k - 1) if self.n - self.k - 1 > 0 else math.inf)

    def described(self, point: int, budget: float) -> dict[str, float]:
        """The parameters of ρ ``point`` in the report's units (C in FLOPs)."""
        p = self.params[point]
        if self.model == "loglinear":   # a + b·ln(C / budget) = (a − b·ln budget) + b·ln C
            return {"a": float(p[0] - p[1] * math.log(budget)), "b": float(p[1])}
        return {"A": float(p[0]), "c_mid": float(budget * math.exp(p[1])), "B": float(p[2])}


def model_value(model: str, params: Mapping[str, float], r0: float, flops: Any) -> np.ndarray:
    """A stored fit (``ForecastPoint.params``, report units) at FLOPs ``flops`` > 0; numpy only."""
    c = np.asarray(flops, dtype=float)
    if model == "loglinear":
        return params["a"] + params["b"] * np.log(c)
    return r0 + (params["A"] - r0) / (1.0 + (params["c_mid"] / c) ** params["B"])


def _stack(data: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xs = np.concatenate([d[0] for d in data])
    ys = np.concatenate([d[1] for d in data])
    idx = np.concatenate([np.full(d[0].shape[0], i) for i, d in enumerate(data)])
    return xs, ys, idx


def fit_loglinear_curves(data: Sequence[tuple[np.ndarray, np.ndarray]], r0: float) -> SurfaceFit:
    """y = a + b·x per ρ by least squares; ``data``: per ρ (x, y), ≥ 2 distinct x each."""
    params, rss, n = [], 0.0, 0
    for x, y in data:
        if np.unique(x).size < 2:
            raise ForecastError("a loglinear fit needs 2 distinct FLOP counts per ρ")
        X = np.stack([np.ones_like(x), x], axis=1)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        params.append(coef)
        rss += float(np.sum((y - X @ coef) ** 2))
        n += x.shape[0]
    return SurfaceFit("loglinear", r0, np.array(params), False, rss, n, 2 * len(data))


def a_bounds(curves_unit: bool, ys: np.ndarray, r0: float) -> tuple[float, float]:
    """Bounds of the asymptote A: [0, 1] for rates, else twice the observed range beyond it."""
    if curves_unit:
        return 0.0, 1.0
    lo, hi = min(float(ys.min()), r0), max(float(ys.max()), r0)
    span = max(hi - lo, 1e-6)
    return lo - 2 * span, hi + 2 * span


def fit_sigmoid_curves(data: Sequence[tuple[np.ndarray, np.ndarray]], r0: float, *, bounds_a: tuple[float, float],
                       shared: bool | None = None, init: SurfaceFit | None = None) -> SurfaceFit:
    """ScaleRL's sigmoid per ρ with R0 fixed (module docstring). ``shared`` None: one B for all ρ
    unless one B per ρ has the lower AICc; ``init``: start from that fit only (bootstrap)."""
    if shared is None:
        one = fit_sigmoid_curves(data, r0, bounds_a=bounds_a, shared=True)
        if len(data) < 2:
            return one
        try:
            each = fit_sigmoid_curves(data, r0, bounds_a=bounds_a, shared=False)
        except ForecastError:
            return one
        return each if each.aicc < one.aicc else one
    from scipy.optimize import least_squares
    from scipy.special import expit

    xs, ys, idx = _stack(data)
    n_p = len(data)
    n_b = 1 if shared else n_p
    k = 2 * n_p + n_b
    if xs.shape[0] < k:
        raise ForecastError(f"a sigmoid with {k} parameters needs ≥ {k} checkpoints, got {xs.shape[0]}")
    bidx = np.zeros_like(idx) if shared else idx
    lo_a, hi_a = bounds_a
    lo = np.concatenate([np.full(n_p, lo_a), np.full(n_p, float(xs.min()) - MID_SPAN), np.full(n_b, B_BOUNDS[0])])
    hi = np.concatenate([np.full(n_p, hi_a), np.full(n_p, float(xs.max()) + MID_SPAN), np.full(n_b, B_BOUNDS[1])])
    rows = np.arange(xs.shape[0])

    def unpack(th: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return th[:n_p][idx], th[n_p:2 * n_p][idx], th[2 * n_p:][bidx]

    def resid(th: np.ndarray) -> np.ndarray:
        a, m, b = unpack(th)
        return r0 + (a - r0) * expit(b * (xs - m)) - ys

    def jac(th: np.ndarray) -> np.ndarray:
        a, m, b = unpack(th)
        s = expit(b * (xs - m))
        ds = (a - r0) * s * (1 - s)
        J = np.zeros((xs.shape[0], k))
        J[rows, idx] = s
        J[rows, n_p + idx] = -ds * b
        J[rows, 2 * n_p + bidx] = ds * (xs - m)
        return J

    if init is not None and init.model == "sigmoid" and init.shared == shared:
        b0 = init.params[:1, 2] if shared else init.params[:, 2]
        starts = [np.concatenate([init.params[:, 0], init.params[:, 1], b0])]
    else:
        starts = []
        top = np.array([float(y.max()) if float(y[-1]) >= r0 else float(y.min()) for _, y in data])
        a0 = top + 0.1 * (top - r0)
        for m0 in (float(np.median(xs)), float(xs.max()), float(xs.max()) + math.log(10.0)):
            starts.append(np.concatenate([a0, np.full(n_p, m0), np.full(n_b, 1.0)]))
    best = None
    for th0 in starts:
        th0 = np.clip(th0, lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        res = least_squares(resid, th0, jac=jac, bounds=(lo, hi), method="trf", x_scale="jac",
                            max_nfev=MAX_NFEV_PER_PARAM * k)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    th = best.x
    b = np.broadcast_to(th[2 * n_p:], (n_p,)) if shared else th[2 * n_p:]
    params = np.stack([th[:n_p], th[n_p:2 * n_p], b], axis=1)
    return SurfaceFit("sigmoid", r0, params, bool(shared), float(2 * best.cost), int(xs.shape[0]), k)


def fit_surface(model: str, data: Sequence[tuple[np.ndarray, np.ndarray]], r0: float, *, unit: bool,
                init: SurfaceFit | None = None) -> SurfaceFit:
    """``model`` (MODELS) fitted to per-ρ data (x, y); ``init`` fixes the sigmoid's B sharing and start."""
    if model == "loglinear":
        return fit_loglinear_curves(data, r0)
    if model == "sigmoid":
        ys = np.concatenate([d[1] for d in data])
        return fit_sigmoid_curves(data, r0, bounds_a=a_bounds(unit, ys, r0),
                                  shared=None if init is None else init.shared, init=init)
    raise ValueError(f"model {model!r} is unknown: expected one of {', '.join(MODELS)}")


# ----------------------------------------------------------------------------- data → fits

def _r0(curves: Curves, means: Sequence[np.ndarray]) -> np.ndarray:
    """Mean base-policy score over every pilot: means[g] (..., n_k), column 0 the base."""
    w = np.array([len(g.seeds) for g in curves.groups], dtype=float)
    return sum(wi * m[..., 0] for wi, m in zip(w, means)) / w.sum()


def _data(curves: Curves, means: Sequence[np.ndarray], cut: float | None = None
          ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per point (x, y) of the checkpoints after the base, those at or below ``cut`` (a fraction of
    the pilot budget; None: all): by fraction in the largest-budget runs, by FLOPs in the others."""
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


def _ends(curves: Curves) -> tuple[np.ndarray, np.ndarray]:
    """(P,) mean FLOPs and mean score at the end of each point's pilots at the largest budget."""
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


# ----------------------------------------------------------------------------- backtests

def backtest_cuts(curves: Curves) -> list[float]:
    """Fractions of the pilot budget a backtest can be cut at: every checkpoint fraction of the
    largest-budget runs below 1 with ≥ MIN_PREFIX_POINTS checkpoints per ρ at or below it."""
    fracs = sorted({float(f) for g in curves.groups if curves.primary(g) for f in g.fractions if 0 < f < 1})
    means = [g.mean for g in curves.groups]
    return [f for f in fracs if all(x.shape[0] >= MIN_PREFIX_POINTS for x, _ in _data(curves, means, f))]


def run_backtest(curves: Curves, model: str, cut: float) -> Backtest:
    """Fit ``model`` on the checkpoints up to ``cut``, predict each point's end (module docstring)."""
    means = [g.mean for g in curves.groups]
    data = _data(curves, means, cut)
    fit = fit_surface(model, data, float(_r0(curves, means)), unit=curves.unit)
    c_end, y_end = _ends(curves)
    errors = fit.predict(np.log(c_end / curves.budget)) - y_end
    last = np.array([float(np.exp(x.max())) * curves.budget for x, _ in data])
    factor = float(np.exp(np.mean(np.log(c_end / last))))
    spread = float(y_end.max() - y_end.min())
    contrast = float(np.mean(np.abs(errors - errors.mean())))
    return Backtest(model, float(cut), factor, tuple(float(e) for e in errors), float(np.mean(np.abs(errors))),
                    contrast, spread, bool(contrast < HOLD_SHARE * spread))


def choose_model(backtests: Sequence[Backtest]) -> tuple[str, Backtest | None]:
    """The model with the lower mae at the half-budget backtest (a tie, or no sigmoid: loglinear),
    and that backtest; the backtest closest to BACKTEST_CUT when none is at or below it."""
    cuts = sorted({b.cut_fraction for b in backtests})
    if not cuts:
        return "loglinear", None
    below = [c for c in cuts if c <= BACKTEST_CUT + 1e-9]
    cut = below[-1] if below else min(cuts, key=lambda c: abs(math.log(c / BACKTEST_CUT)))
    at = {b.model: b for b in backtests if b.cut_fraction == cut}
    lin, sig = at.get("loglinear"), at.get("sigmoid")
    if sig is not None and (lin is None or sig.mae < lin.mae - TIE):
        return "sigmoid", sig
    return "loglinear", lin if lin is not None else sig


def supported_factor(backtests: Sequence[Backtest], model: str) -> float | None:
    """The largest factor up to which every backtest of ``model`` held; None when the first failed."""
    out = None
    for b in sorted((b for b in backtests if b.model == model), key=lambda b: b.factor):
        if not b.held:
            break
        out = b.factor
    return out


# ----------------------------------------------------------------------------- bootstrap

def replicate_means(curves: Curves, *, n_boot: int, seed: int, level: float) -> list[np.ndarray]:
    """Per group (n_boot, n_k) replicate mean curves: prompts resampled (paired across pilots and
    checkpoints of one prompt set), then the group's pilots with replacement, deviations scaled by
    √(n/(n−1))·t_df/z (df = Σ (pilots − 1) over groups), as race.stats.fit does for point means."""
    from race.stats.fit import t_quantile

    rng = np.random.default_rng(seed)
    counts: dict[int, np.ndarray] = {}
    for k in sorted({g.scores.shape[2] for g in curves.groups}):
        draws = rng.integers(0, k, size=(n_boot, k))
        flat = (draws + k * np.arange(n_boot)[:, None]).ravel()
        counts[k] = np.bincount(flat, minlength=n_boot * k).reshape(n_boot, k).astype(float)
    df = sum(len(g.seeds) - 1 for g in curves.groups)
    q = (1 + level) / 2
    scale = t_quantile(q=q, df=df) / NormalDist().inv_cdf(q) if df >= 1 else 1.0
    out = []
    for g in curves.groups:
        n_p, n_k, k = g.scores.shape
        m = (counts[k] @ g.scores.reshape(n_p * n_k, k).T / k).reshape(n_boot, n_p, n_k)
        if n_p == 1:
            out.append(m[:, 0])
            continue
        mean = m.mean(axis=1)
        pick = rng.integers(0, n_p, size=(n_boot, n_p))
        dev = np.take_along_axis(m - mean[:, None, :], pick[:, :, None], axis=1) * (scale * math.sqrt(n_p / (n_p - 1)))
        out.append(mean + dev.mean(axis=1))
    return out


# ----------------------------------------------------------------------------- the forecast

def _fmt(x: float) -> str:
    return f"{x:.3g}"


def forecast(runs: Sequence[tuple[Sequence[PilotResult], float]], *, target: str, full_run_budget: float,
             pilot_regime: Regime, pilot_best_rho: float, force: bool = False, n_boot: int = FORECAST_N_BOOT,
             seed: int = 0, confidence_level: float = 0.9, reward_share_threshold: float = 0.2) -> Forecast:
    """The forecast at ``full_run_budget`` from the pilots of ``runs`` (each: pilots, pilot budget;
    several runs of one setup are pooled). Never raises for data it cannot forecast from: the
    result is then ``status == "refused"`` with a one-line ``message``. Raises RaceError only for
    a non-positive budget or n_boot."""
    full_run_budget = A.number("full_run_budget", full_run_budget, gt=0, error=ForecastError,
                               expected="a positive finite FLOP count, e.g. 6e12")
    n_boot = A.whole("n_boot", n_boot, ge=1, error=ForecastError)
    seed = A.whole("seed", seed, ge=0, error=ForecastError)
    A.flag("force", force, error=ForecastError)
    A.text("target", target, error=ForecastError)
    confidence_level = A.number("confidence_level", confidence_level, gt=0, lt=1, error=ForecastError)
    reward_share_threshold = A.number("reward_share_threshold", reward_share_threshold, ge=0, le=1,
                                      error=ForecastError)
    pilot_best_rho = A.number("pilot_best_rho", pilot_best_rho, gt=0, lt=1, error=ForecastError)
    _runs(runs)
    settings = {"n_boot": n_boot, "seed": seed, "confidence_level": confidence_level,
                "reward_share_threshold": reward_share_threshold, "backtest_cut": BACKTEST_CUT,
                "min_prefix_points": MIN_PREFIX_POINTS, "hold_share": HOLD_SHARE, "scalerl_factor": SCALERL_FACTOR,
                "force": bool(force)}
    F = float(full_run_budget)
    head = f"forecast at {_fmt(F)} FLOPs"

    def refused(reason: str, curves: Curves | None = None, backtests: Sequence[Backtest] = (),
                model: str | None = None, f_star: float | None = None, needed: float | None = None,
                points: Sequence[ForecastPoint] = (), shared: bool | None = None, r0: float | None = None,
                warnings: Sequence[str] = ()) -> Forecast:
        budget = curves.budget if curves else max((float(b) for _, b in runs), default=0.0)
        return Forecast(target=target, full_run_budget=F, pilot_budget=budget, factor=F / budget if budget > 0 else 0.0,
                        status="refused",
                        message=f"no {head}: {reason}", model=model, shared_slope=shared, r0=r0, points=tuple(points),
                        backtests=tuple(backtests), supported_factor=f_star, needed_budget=needed, regime=None,
                        best_rho=None, rho_range=None, confidence=None, pilot_regime=pilot_regime,
                        pilot_best_rho=pilot_best_rho, differs=False,
                        budgets=curves.budgets if curves else (), settings=settings, warnings=tuple(warnings))

    try:
        curves = collect_curves(runs, target)
    except ForecastError as e:
        return refused(str(e))
    notes = list(curves.warnings)
    r0 = float(_r0(curves, [g.mean for g in curves.groups]))
    if len(curves.points) < 2:
        return refused(f"only {len(curves.points)} grid point has checkpoints: a forecast compares ρ", curves, r0=r0)
    cuts = backtest_cuts(curves)
    if not cuts:
        return refused(f"no grid point has {MIN_PREFIX_POINTS} checkpoints after the base before its end, so no "
                       "backtest can be run: re-run the pilots with more eval.checkpoints (8, the default, or more)",
                       curves, r0=r0)
    backtests: list[Backtest] = []
    for model in MODELS:
        for cut in cuts:
            try:
                backtests.append(run_backtest(curves, model, cut))
            except (ForecastError, ValueError, np.linalg.LinAlgError) as e:
                notes.append(f"{model} backtest at {cut:.2f} of the budget failed: {e}")
    model, chosen = choose_model(backtests)
    if chosen is None:
        return refused("every backtest fit failed", curves, backtests, r0=r0, warnings=notes)
    f_star = supported_factor(backtests, model)
    factor = F / curves.budget
    means = [g.mean for g in curves.groups]
    try:
        fit = fit_surface(model, _data(curves, means), r0, unit=curves.unit)
    except (ForecastError, ValueError, np.linalg.LinAlgError) as e:
        return refused(f"the {model} fit on all checkpoints failed ({e})", curves, backtests, model, f_star,
                       r0=r0, warnings=notes)
    c_end, y_end = _ends(curves)
    fitted_end = fit.predict(np.log(c_end / curves.budget))
    ok = factor <= 1.0 + 1e-9 or (f_star is not None and factor <= f_star * (1 + 1e-9))
    model_bt = sorted((b for b in backtests if b.model == model), key=lambda b: b.factor)
    points = [ForecastPoint(rho_target=float(t), rho_measured=float(curves.rho[i]),
                            pilots=sum(len(g.seeds) for g in curves.groups if curves.primary(g) and curves.point_of(g) == i),
                            pilot_flops=float(c_end[i]), pilot_score=float(y_end[i]), fitted_end=float(fitted_end[i]),
                            predicted=None, predicted_ci=None, params=fit.described(i, curves.budget),
                            curve=_curve_of(curves, i)) for i, t in enumerate(curves.points)]
    if not ok and not force:
        if f_star is None:
            first = model_bt[0]
            needed = F / SCALERL_FACTOR if F / SCALERL_FACTOR > curves.budget else None
            advice = ("add seeds, or pilot at ≥ " + _fmt(needed) + f" FLOPs (F / {SCALERL_FACTOR:g}: ScaleRL's prefix "
                      f"fits held to about {SCALERL_FACTOR:g}×)" if needed else
                      "add seeds: the error is noise at this budget, which a larger one alone need not fix")
            reason = (f"the {model} backtest's error on the differences between ρ ({first.contrast_mae:.3f} at "
                      f"{first.factor:.2g}×, the shortest backtest) is not below half their spread "
                      f"({first.spread / 2:.3f}): these pilots cannot rank ρ past their budget; {advice}; "
                      "--force-forecast prints it anyway")
        else:
            nxt = next((b for b in model_bt if b.factor > f_star), None)
            beyond = (f"; at {nxt.factor:.2g}× its error {nxt.contrast_mae:.3f} ≥ half the ρ spread {nxt.spread / 2:.3f}"
                      if nxt is not None else "; no backtest reaches further with these checkpoints")
            needed = F / f_star
            reason = (f"{factor:.3g}× the pilot budget {_fmt(curves.budget)} is past the {f_star:.2g}× that the "
                      f"{model} backtests support{beyond}; a pilot budget ≥ {_fmt(needed)} FLOPs would support it; "
                      "--force-forecast prints it anyway")
        return refused(reason, curves, backtests, model, f_star, needed, points,
                       fit.shared if model == "sigmoid" else None, r0, notes)

    reps = replicate_means(curves, n_boot=n_boot, seed=seed, level=confidence_level)
    x_f = math.log(F / curves.budget)
    preds = np.full((n_boot, len(curves.points)), np.nan)
    for b in range(n_boot):
        rep = [m[b] for m in reps]
        try:
            preds[b] = fit_surface(model, _data(curves, rep), float(_r0(curves, rep)), unit=curves.unit,
                                   init=fit).predict(x_f)
        except (ForecastError, ValueError, np.linalg.LinAlgError):
            continue
    good = np.all(np.isfinite(preds), axis=1)
    if good.mean() < 0.9:
        notes.append(f"{int((~good).sum())} of {n_boot} bootstrap refits failed and were left out")
    preds = preds[good]
    point = fit.predict(x_f)
    q = (1 - confidence_level) / 2
    lo, hi = np.quantile(preds, [q, 1 - q], axis=0) if preds.shape[0] else (point, point)
    points = [_with_prediction(p, float(point[i]), (float(lo[i]), float(hi[i]))) for i, p in enumerate(points)]
    from race.stats.regime import response_verdict

    verdict = response_verdict(rho=curves.rho, scores=point, replicates=preds if preds.shape[0] else point[None],
                               reward_shares=curves.reward_share,
                               seeds_measured=any(len(g.seeds) > 1 for g in curves.groups),
                               tau=reward_share_threshold, level=confidence_level)
    best_rho = float(curves.points[verdict.best])
    differs = verdict.regime is not pilot_regime or not math.isclose(best_rho, pilot_best_rho)
    scope = ("interpolated inside the pilot budget" if factor <= 1 + 1e-9 else
             f"{factor:.3g}× the pilot budget, within the {f_star:.2g}× the backtests support" if ok else
             f"FORCED: {factor:.3g}× the pilot budget, past the "
             + (f"{f_star:.2g}× the backtests support" if f_star else "factor any backtest supports")
             + ", a guess, not a supported prediction")
    message = (f"{head} ({scope}): best ρ {best_rho:.2f}, {verdict.regime.value}"
               + (f"; DIFFERS from the pilot-budget verdict ({pilot_regime.value}, best ρ {pilot_best_rho:.2f})"
                  if differs else "; as at the pilot budget"))
    return Forecast(target=target, full_run_budget=F, pilot_budget=curves.budget, factor=factor,
                    status="predicted" if ok else "forced", message=message, model=model,
                    shared_slope=fit.shared if model == "sigmoid" else None, r0=r0, points=tuple(points),
                    backtests=tuple(backtests), supported_factor=f_star,
                    needed_budget=None if ok else (F / f_star if f_star else
                                                   F / SCALERL_FACTOR if F / SCALERL_FACTOR > curves.budget else None),
                    regime=verdict.regime, best_rho=best_rho, rho_range=tuple(float(r) for r in verdict.rho_range),
                    open_side=verdict.open_side, confidence=verdict.confidence, pilot_regime=pilot_regime, pilot_best_rho=pilot_best_rho,
                    differs=differs, budgets=curves.budgets, settings=settings, warnings=tuple(notes))


def _with_prediction(p: ForecastPoint, value: float, ci: tuple[float, float]) -> ForecastPoint:
    from dataclasses import replace

    return replace(p, predicted=value, predicted_ci=ci)


def _curve_of(curves: Curves, point: int) -> tuple[tuple[float, float], ...]:
    out: list[tuple[float, float]] = []
    for g in curves.groups:
        if curves.point_of(g) == point:
            out += [(float(c), float(y)) for c, y, f in zip(g.flops, g.mean, g.fractions) if f > 0]
    return tuple(out)


# ----------------------------------------------------------------------------- results files

def _results(results: Any, name: str) -> None:
    if not all(hasattr(results, k) for k in ("pilots", "diagnosis", "config")):
        raise ForecastError(f"{name} {str(results)[:60]!r} must be a race.stats.results.Results (race.stats.results.load_results)")


def results_budget(results: Any) -> float:
    """The pilot budget of a ``race.stats.results.Results``: its config's, else the diagnosis meta's, else
    the largest FLOPs a complete pilot spent."""
    _results(results, "results")
    meta = results.diagnosis.meta if results.diagnosis is not None else {}
    budget = (results.config or {}).get("budget") or meta.get("budget_per_pilot") \
        or max((p.flops.total for p in results.pilots if p.status == "complete"), default=0.0)
    return float(budget)


def with_forecast(results: Any, *, full_run_budget: float | str | None = None, force: bool = False,
                  pool: Sequence[Any] = (), refit: bool = False, n_boot: int | None = None) -> Any:
    """The diagnosis of ``results`` (race.stats.results.Results) with its forecast at ``full_run_budget``
    (default: the config's ``full_run_budget``), pooling the pilots of the ``pool`` results (other
    budgets of the same setup). Without a full-run budget: the diagnosis as stored, its forecast
    (if any) kept. The bootstrap follows the diagnosis's classify settings (seed, confidence
    level, reward-share threshold; n_boot unless given)."""
    from dataclasses import replace

    from race.config.configfile import LearningRate, parse_flops
    from race.stats.results import diagnose_results

    _results(results, "results")
    A.flag("force", force, error=ForecastError)
    A.flag("refit", refit, error=ForecastError)
    for i, other in enumerate(A.items("pool", pool, error=ForecastError, what="Results")):
        _results(other, f"pool[{i}]")
    if n_boot is not None:
        A.whole("n_boot", n_boot, ge=1, error=ForecastError)
    if full_run_budget is not None:
        parse_flops(full_run_budget, "full_run_budget")
    diag = diagnose_results(results, refit=refit)
    stored = diag.forecast
    raw = full_run_budget if full_run_budget is not None else (results.config or {}).get("full_run_budget")
    if full_run_budget is None and stored is not None and not pool and (not force or stored.status == "forced"):
        return diag                                    # as stored (race pilot wrote it)
    if raw is None and stored is not None:
        raw = stored.full_run_budget
    if raw is None:
        if force or pool:
            raise RaceError("--force-forecast and --pool need a full-run budget: give --full-run F (FLOPs of one "
                            "full run), or full_run_budget in the config")
        return diag
    F = parse_flops(raw, "--full-run" if full_run_budget is not None else "full_run_budget")
    settings = dict(diag.meta.get("classify") or results.classify or {})
    for other in pool:
        same = {k: (other.config or {}).get(k) for k in ("model", "task")}
        mine = {k: (results.config or {}).get(k) for k in ("model", "task")}
        if same != mine:
            raise RaceError(f"a pooled results file ran {same['model']} on {same['task']}, this one "
                            f"{mine['model']} on {mine['task']}: pool runs of one setup only")
    runs = [(results.pilots, results_budget(results))] + [(o.pilots, results_budget(o)) for o in pool]
    v = diag.primary
    fc = forecast(runs, target=diag.primary_target, full_run_budget=F, pilot_regime=v.regime,
                  pilot_best_rho=v.best_rho, force=force,
                  n_boot=int(n_boot or settings.get("n_boot") or FORECAST_N_BOOT), seed=int(settings.get("seed", 0)),
                  confidence_level=float(settings.get("confidence_level", 0.9)),
                  reward_share_threshold=float(settings.get("reward_share_threshold", 0.2)))
    lr = (results.config or {}).get("learning_rate")
    schedule = lr.get("schedule", LearningRate.schedule) if isinstance(lr, Mapping) else LearningRate.schedule
    st = diag.stability if diag.stability is not None else stability(results.pilots, diag.primary_target)
    at_f = stability_at_with_rate(results, st, F)
    return replace(diag, forecast=replace(fc, range_at_budget=budget_range(results, diag, F, schedule),
                                          stability_at_budget=at_f))


def stability_at_with_rate(results: Any, st: Any, full_run_budget: float) -> dict[str, Any]:
    """The stability line at F (with the length probe at F, if one is stored) and the rate RACE
    recommends for F (race.stats.rate): ``{"status", "line", "rate"}``."""
    from race.stats.results import probe_for
    from race.stats.rate import configured_lr, full_run_rate

    budget = results_budget(results)
    probe = probe_for(results, full_run_budget)
    at_f = stability_at(st, full_run_budget=full_run_budget, pilot_budget=budget, probe=probe)
    lr, full_lr = configured_lr(results.config or {})
    rate = full_run_rate(lr, status=at_f["status"], factor=full_run_budget / budget if budget else float("inf"),
                         full_lr=full_lr, probe=probe, cause=at_f.get("cause"))
    return {"status": at_f["status"], "line": at_f["line"], "rate": rate["line"]}


def budget_range(results: Any, diag: Any, full_run_budget: float, schedule: str) -> dict[str, Any]:
    """The budget-drift model's range at F for these results (race.stats.drift), or ``{"refused": why}``."""
    from race.stats.drift import range_record

    return range_record(results.pilots, diag, pilot_budget=results_budget(results), full_run_budget=full_run_budget,
                        constant_rate=schedule == "constant")
