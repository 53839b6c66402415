"""The forecast's curve models, their fits, and the backtests that choose one and bound the
extrapolation (race.stats.forecast uses them at the full-run budget). Pure: numpy and scipy (scipy
imported at call time; ``import race`` does not import this module).

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

The supported factor (``supported_factor``) is what race.stats.forecast's refusal rests on.

Invariants: deterministic (fixed starts, no random draws); a fit that cannot be made is a
``ForecastError`` (race.stats.curves) or a ValueError / LinAlgError, which the forecast turns into
a note or a refusal; the public functions a planning script calls (``model_value``, ``fit_surface``,
``SurfaceFit.predict`` / ``described``, ``backtest_cuts``, ``run_backtest``, ``choose_model``,
``supported_factor``) check their arguments on entry (race.core.arguments: a ``ForecastError``
naming the argument, its value and what was expected).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from race.core import arguments as A
from race.core.records import Backtest
from race.stats.curves import Curves, ForecastError, base_score, checked_curves, fit_data, pilot_ends

MODELS = ("sigmoid", "loglinear")
BACKTEST_CUT = 0.5           # the model is chosen by the backtest fitted up to this fraction of the budget
MIN_PREFIX_POINTS = 3        # checkpoints after the base per ρ that a backtest fit needs
HOLD_SHARE = 0.5             # a backtest holds when its contrast error < this share of the ρ spread
B_BOUNDS = (0.05, 10.0)      # the sigmoid's slope B
MID_SPAN = math.log(1000.0)  # C_mid within 1000× of the checkpoints' FLOPs
# evaluations per parameter before a sigmoid fit stops (was 200 until 2026-12-02): on the validation
# study's pilot grids every fit of a grid that gets a forecast converged within 74 evaluations in all;
# only flat or collapsed grids (lr-x3, hard, reasoner: refused at either cap) ran past 600, 7–15 s
# per forecast at 200 (research/probes/forecast_fit_cost.py)
MAX_NFEV_PER_PARAM = 50
TIE = 1e-3                   # backtest errors closer than this are a tie (→ loglinear)


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
        x = _finite_array("x", x, shape=(self.params.shape[0],))
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
        n = self.params.shape[0]
        point = A.whole("point", point, ge=0, le=n - 1, floats=False, error=ForecastError,
                        expected=f"a grid point's index, 0 to {n - 1}")
        budget = A.number("budget", budget, gt=0, error=ForecastError, expected="a positive finite FLOP count")
        p = self.params[point]
        if self.model == "loglinear":   # a + b·ln(C / budget) = (a − b·ln budget) + b·ln C
            return {"a": float(p[0] - p[1] * math.log(budget)), "b": float(p[1])}
        return {"A": float(p[0]), "c_mid": float(budget * math.exp(p[1])), "B": float(p[2])}


_PARAMS = {"loglinear": ("a", "b"), "sigmoid": ("A", "c_mid", "B")}     # a stored fit's parameters, by model


def _finite_array(name: str, value: Any, *, gt: float | None = None, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``value`` (a number or an array of them) as a float array, every entry finite (and > ``gt``),
    broadcast to ``shape`` when given; else a ForecastError naming it."""
    want = "finite numbers" + (f" > {gt:g}" if gt is not None else "") + (f", a scalar or {shape[0]} of them"
                                                                          if shape else "")
    if isinstance(value, (bool, str, bytes)):
        raise ForecastError(f"{name} {A.shown(value)} must be {want}")
    try:
        a = np.asarray(value, dtype=float)
        if shape is not None:
            a = np.broadcast_to(a, shape)
    except (TypeError, ValueError, OverflowError):
        raise ForecastError(f"{name} {A.shown(value)} must be {want}") from None
    if not np.all(np.isfinite(a)) or (gt is not None and not np.all(a > gt)):
        raise ForecastError(f"{name} {A.shown(value)} must be {want}")
    return a


def model_value(model: str, params: Mapping[str, float], r0: float, flops: Any) -> np.ndarray:
    """A stored fit (``ForecastPoint.params``, report units) at FLOPs ``flops`` > 0; numpy only."""
    model = A.one_of("model", model, MODELS, error=ForecastError)
    params = A.mapping("params", params, error=ForecastError)
    for key in _PARAMS[model]:
        if key not in params:
            raise ForecastError(f"params {str(dict(params))[:80]} has no {key!r}: a {model} fit stores "
                                f"{', '.join(_PARAMS[model])}")
        A.number(f"params[{key!r}]", params[key], gt=0 if key == "c_mid" else None, error=ForecastError)
    A.number("r0", r0, error=ForecastError)
    c = _finite_array("flops", flops, gt=0)
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
    return _fit_sigmoid(data, r0, bounds_a=bounds_a, shared=shared, init=init)


def _fit_sigmoid(data: Sequence[tuple[np.ndarray, np.ndarray]], r0: float, *, bounds_a: tuple[float, float],
                 shared: bool, init: SurfaceFit | None) -> SurfaceFit:
    """The sigmoid with one B (``shared``) or one per ρ: the lowest-cost least-squares fit over its
    starts, within the bounds of the module docstring. Parameters θ = (A per ρ, m per ρ, B)."""
    from scipy.optimize import least_squares        # looked up at call time (research/probes/forecast_fit_cost.py)

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
    resid, jac = _sigmoid_residuals(xs, ys, idx, bidx, r0, n_p, k)
    best = None
    for th0 in _sigmoid_starts(data, r0, xs, n_p, n_b, shared, init):
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


def _sigmoid_residuals(xs: np.ndarray, ys: np.ndarray, idx: np.ndarray, bidx: np.ndarray, r0: float, n_p: int,
                       k: int) -> tuple[Any, Any]:
    """The residuals θ → fitted − observed over the stacked points and their analytic Jacobian;
    ``idx``: each point's ρ, ``bidx``: its B (all 0 when B is shared)."""
    from scipy.special import expit

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

    return resid, jac


def _sigmoid_starts(data: Sequence[tuple[np.ndarray, np.ndarray]], r0: float, xs: np.ndarray, n_p: int, n_b: int,
                    shared: bool, init: SurfaceFit | None) -> list[np.ndarray]:
    """Where the fit starts: ``init``'s parameters when it is a sigmoid of the same B sharing (a
    bootstrap refit), else three starts with A a tenth past each ρ's extreme score and C_mid at the
    median, the largest and ten times the largest checkpoint FLOPs."""
    if init is not None and init.model == "sigmoid" and init.shared == shared:
        b0 = init.params[:1, 2] if shared else init.params[:, 2]
        return [np.concatenate([init.params[:, 0], init.params[:, 1], b0])]
    starts = []
    top = np.array([float(y.max()) if float(y[-1]) >= r0 else float(y.min()) for _, y in data])
    a0 = top + 0.1 * (top - r0)
    for m0 in (float(np.median(xs)), float(xs.max()), float(xs.max()) + math.log(10.0)):
        starts.append(np.concatenate([a0, np.full(n_p, m0), np.full(n_b, 1.0)]))
    return starts


def fit_surface(model: str, data: Sequence[tuple[np.ndarray, np.ndarray]], r0: float, *, unit: bool,
                init: SurfaceFit | None = None) -> SurfaceFit:
    """``model`` (MODELS) fitted to per-ρ data (x, y); ``init`` fixes the sigmoid's B sharing and start."""
    model = A.one_of("model", model, MODELS, error=ForecastError)
    data = _checked_data(data)
    r0 = A.number("r0", r0, error=ForecastError)
    A.flag("unit", unit, error=ForecastError)
    if init is not None:
        A.instance("init", init, SurfaceFit, error=ForecastError, expected="None or a SurfaceFit (fit_surface's)")
    if model == "loglinear":
        return fit_loglinear_curves(data, r0)
    if model == "sigmoid":
        ys = np.concatenate([d[1] for d in data])
        return fit_sigmoid_curves(data, r0, bounds_a=a_bounds(unit, ys, r0),
                                  shared=None if init is None else init.shared, init=init)
    raise ForecastError(f"model {model!r} is unknown: expected one of {', '.join(MODELS)}")


def _checked_data(data: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """``data``: per ρ a pair (x, y) of equal-length 1-D arrays of finite numbers (``fit_data``'s)."""
    pairs = A.items("data", data, error=ForecastError, what="(x, y) pairs, one per ρ")
    if not pairs:
        raise ForecastError("data is empty: expected one (x, y) pair per ρ (race.stats.curves.fit_data)")
    out = []
    for i, pair in enumerate(pairs):
        xy = A.items(f"data[{i}]", pair, error=ForecastError, what="arrays (x, y)")
        if len(xy) != 2:
            raise ForecastError(f"data[{i}] has {len(xy)} items: expected (x, y)")
        x, y = (_finite_array(f"data[{i}][{j}]", v) for j, v in enumerate(xy))
        if x.ndim != 1 or x.shape != y.shape:
            raise ForecastError(f"data[{i}]: x of shape {x.shape} and y of shape {y.shape}: expected two 1-D arrays "
                                "of one length")
        out.append((x, y))
    return out


# ----------------------------------------------------------------------------- backtests

def backtest_cuts(curves: Curves) -> list[float]:
    """Fractions of the pilot budget a backtest can be cut at: every checkpoint fraction of the
    largest-budget runs below 1 with ≥ MIN_PREFIX_POINTS checkpoints per ρ at or below it."""
    checked_curves(curves)
    fracs = sorted({float(f) for g in curves.groups if curves.primary(g) for f in g.fractions if 0 < f < 1})
    means = [g.mean for g in curves.groups]
    return [f for f in fracs if all(x.shape[0] >= MIN_PREFIX_POINTS for x, _ in fit_data(curves, means, f))]


def run_backtest(curves: Curves, model: str, cut: float) -> Backtest:
    """Fit ``model`` on the checkpoints up to ``cut``, predict each point's end (module docstring)."""
    checked_curves(curves)
    model = A.one_of("model", model, MODELS, error=ForecastError)
    cut = A.number("cut", cut, gt=0, lt=1, error=ForecastError, expected="a fraction of the pilot budget in (0, 1)")
    means = [g.mean for g in curves.groups]
    data = fit_data(curves, means, cut)
    fit = fit_surface(model, data, float(base_score(curves, means)), unit=curves.unit)
    c_end, y_end = pilot_ends(curves)
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
    backtests = _checked_backtests(backtests)
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
    backtests = _checked_backtests(backtests)
    model = A.one_of("model", model, MODELS, error=ForecastError)
    out = None
    for b in sorted((b for b in backtests if b.model == model), key=lambda b: b.factor):
        if not b.held:
            break
        out = b.factor
    return out


def _checked_backtests(backtests: Any) -> list[Backtest]:
    out = A.items("backtests", backtests, error=ForecastError, what="race.core.records.Backtest")
    for i, b in enumerate(out):
        A.instance(f"backtests[{i}]", b, Backtest, error=ForecastError)
    return out
