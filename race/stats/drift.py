"""How the optimal update fraction moves with budget: the joint response surface and the range at F.

A pilot grid locates the best ρ at its own budget B; a full run spends F = 10–1000 × B, and the
validation study found the optimum lower there (research/validation-log.md, "What the failures teach").
This module models that move:

- ``fit_joint``: the held-out reward surface R(ρ, x), x = log10(C / B), fitted to every budget level
  at once (a pilot's checkpoints at budget fractions 1/64 … 1 are IsoFLOP points of a constant-rate
  run): R = α_level − k · (ρ − c(x))², c(x) = c0 + d · x. One curvature k and one moving centre are
  shared by all levels, each level keeps its own height α. Fitting jointly rather than one parabola
  per budget avoids the bias of per-budget fits on narrow, off-centre grids (Czech et al., "Problems
  with Chinchilla Approach 2", arXiv 2603.22339). ``d`` is the drift of the optimum in ρ per decade
  of budget, with its SE from the fit's Jacobian.
- ``shrink``: the setting's own drift pulled toward the population's by precision weights (an
  empirical-Bayes normal-normal shrinkage); a pilot grid's checkpoints span under two decades and
  alone give a noisy drift.
- ``range_at``: the recommended range at F, the range at B moved by the drift over log10(F / B)
  and widened by its 90 % CI. Up to ``VALIDATED_FACTOR`` that is the validated statement; past it,
  up to ``MAX_FACTOR``, the range widens further (the CI grows with the decades past the validated
  factor) and says so; past ``MAX_FACTOR`` it is refused in one line.
- ``range_for_pilots``: all of it from one pilot grid (its checkpoints → its own drift, shrunk).

The population figures below are pooled from both validation rounds' development data by
``research/scripts/drift.py population`` (its leave-one-setting-out backtest chose the model; docs/drift.md).
Round 2 was scored by the figures frozen from round 1 (-0.055, SD 0.052, 11 settings), which its scorer
passes as ``population``. Invariants:
nothing here runs a pilot or imports torch; ``range_at`` never returns a range outside (0, 1) and
never a guess past the validated factor; every public function checks its arguments on entry
(race.core.arguments: a ``DriftError`` naming the argument, its value and what was expected).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from race.core import arguments as A
from race.stats.instability import find_instability
from race.core.errors import RaceError
from race.core.records import PilotResult

# Both validation rounds pooled (research/scripts/drift.py population --suite research/validation/suite.yaml
# --suite research/validation/round2.yaml prints them): the population drift of the optimal ρ per decade of
# budget, the between-setting SD of the per-setting drift, the number of settings behind them, and the
# largest full-run / pilot budget factor the backtest scored.
POPULATION_DRIFT = -0.066
POPULATION_SPREAD = 0.049
POPULATION_SETTINGS = 22
VALIDATED_FACTOR = 30.0
MAX_FACTOR = 1000.0      # past it no range at all: more than 1.5 decades beyond what was validated
MODEL_NAME = "shrunk joint-surface drift"
Z90 = 1.6449


class DriftError(RaceError):
    """The range at the full-run budget cannot be given (past the validated factor, no data)."""


@dataclass(frozen=True)
class Observation:
    """One budget level's grid point: mean held-out reward over seeds, its SE, at log10(C / B)."""

    level: int
    x: float
    rho: float
    y: float
    se: float


@dataclass(frozen=True)
class JointFit:
    c0: float            # the optimum's ρ at x = 0 (budget B)
    d: float             # its drift per decade of budget
    d_se: float          # the SE of d (Jacobian); inf when the surface does not identify it
    k: float             # curvature (reward per ρ²)
    levels: int
    n: int

    def centre(self, x: float) -> float:
        return self.c0 + self.d * x


def fit_joint(obs: Sequence[Observation], *, se_floor: float = 0.005) -> JointFit:
    """Least squares on R = α_level − k (ρ − c0 − d x)², each point weighted by 1 / max(se, se_floor).
    Levels with fewer than 3 distinct ρ identify no curvature and are left out."""
    import numpy as np
    from scipy.optimize import least_squares

    obs = A.items("obs", obs, error=DriftError, what="Observation")
    for i, o in enumerate(obs):
        if not isinstance(o, Observation):
            raise DriftError(f"obs[{i}] {str(o)[:60]!r} must be a race.stats.drift.Observation")
        for field_name, lo in (("x", None), ("rho", 0.0), ("y", None), ("se", None)):
            A.number(f"obs[{i}].{field_name}", getattr(o, field_name), gt=lo, lt=1.0 if field_name == "rho" else None,
                     ge=0.0 if field_name == "se" else None, error=DriftError)
    se_floor = A.number("se_floor", se_floor, gt=0, error=DriftError)
    by_level: dict[int, list[Observation]] = {}
    for o in obs:
        by_level.setdefault(o.level, []).append(o)
    keep = [lv for lv, os in sorted(by_level.items()) if len({round(o.rho, 6) for o in os}) >= 3]
    if not keep:
        raise DriftError("no budget level has 3 or more ρ points: the surface cannot be fitted")
    pts = [o for lv in keep for o in by_level[lv]]
    li = {lv: i for i, lv in enumerate(keep)}
    L = np.array([li[o.level] for o in pts])
    x = np.array([o.x for o in pts])
    r = np.array([o.rho for o in pts])
    y = np.array([o.y for o in pts])
    w = 1.0 / np.maximum(np.array([o.se for o in pts]), se_floor)
    nl = len(keep)

    resid, jac = _surface(L, x, r, y, w, nl)
    a0 = np.array([max(o.y for o in by_level[lv]) for lv in keep])
    best = None
    for c_start in (float(np.mean(r)), float(r.min()), float(r.max())):
        for k_start in (0.5, 5.0):
            p0 = np.concatenate([a0, [k_start, c_start, 0.0]])
            lo = np.concatenate([np.full(nl, -np.inf), [1e-6, -0.5, -1.0]])
            hi = np.concatenate([np.full(nl, np.inf), [1e3, 1.5, 1.0]])
            res = least_squares(resid, p0, jac=jac, bounds=(lo, hi), method="trf", max_nfev=2000)
            if best is None or res.cost < best.cost:
                best = res
    p = best.x
    if len({round(v, 6) for v in x}) < 2:           # one budget: the drift is not identified
        return JointFit(c0=float(p[nl + 1]), d=0.0, d_se=math.inf, k=float(p[nl]), levels=nl, n=len(pts))
    dof = max(1, len(pts) - len(p))
    s2 = 2 * best.cost / dof
    try:
        cov = np.linalg.pinv(best.jac.T @ best.jac) * max(s2, 1.0)
        d_se = float(math.sqrt(max(cov[nl + 2, nl + 2], 0.0)))
    except np.linalg.LinAlgError:
        d_se = math.inf
    if not math.isfinite(d_se) or d_se == 0.0:
        d_se = math.inf
    return JointFit(c0=float(p[nl + 1]), d=float(p[nl + 2]), d_se=d_se, k=float(p[nl]), levels=nl, n=len(pts))


def _surface(L, x, r, y, w, nl: int):  # noqa: ANN001, ANN202 — numpy arrays
    """The weighted residuals of R = α_level − k (ρ − c0 − d x)² at parameters p = (α…, k, c0, d), and their
    exact Jacobian (scipy's numerical one was half of a fit's time)."""
    import numpy as np

    rows = np.arange(len(y))

    def resid(p):  # noqa: ANN001, ANN202
        alpha, k, c0, d = p[:nl], p[nl], p[nl + 1], p[nl + 2]
        return w * (alpha[L] - k * (r - c0 - d * x) ** 2 - y)

    def jac(p):  # noqa: ANN001, ANN202
        k, c0, d = p[nl], p[nl + 1], p[nl + 2]
        u = r - c0 - d * x
        J = np.zeros((len(y), nl + 3))
        J[rows, L] = w
        J[:, nl] = -w * u ** 2
        J[:, nl + 1] = 2 * w * k * u
        J[:, nl + 2] = 2 * w * k * u * x
        return J

    return resid, jac


def shrink(d_own: float, se_own: float, d_pop: float = POPULATION_DRIFT,
           spread: float = POPULATION_SPREAD) -> tuple[float, float]:
    """The setting's drift shrunk toward the population's: precision-weighted mean of its own
    estimate (SE ``se_own``) and the population drift (between-setting SD ``spread``); returns the
    estimate and its SE. An unidentified own drift (SE inf, or a NaN drift) gives the population's."""
    d_own = A.number("d_own", d_own, finite=False, error=DriftError)
    se_own = A.number("se_own", se_own, finite=False, error=DriftError)
    if math.isinf(d_own):
        raise DriftError(f"d_own {d_own!r}: expected a finite drift, or NaN for one the grid did not identify")
    if se_own < 0:
        raise DriftError(f"se_own {se_own!r}: expected a standard error ≥ 0 (inf or NaN: unidentified)")
    d_pop = A.number("d_pop", d_pop, error=DriftError)
    spread = A.number("spread", spread, gt=0, error=DriftError)
    if not math.isfinite(se_own) or se_own <= 0 or not math.isfinite(d_own):
        return d_pop, spread
    # the precision weights as the ratio r = se_own / spread (no overflow at extreme SEs)
    r = se_own / spread
    if r > 1e150:
        return d_pop, spread
    if r < 1e-150:
        return d_own, se_own
    k = 1.0 / (1.0 + r * r)                  # = w_own / (w_own + w_pop)
    return k * d_own + (1.0 - k) * d_pop, se_own / math.sqrt(1.0 + r * r)


@dataclass(frozen=True)
class RangeAtBudget:
    """The recommended range at the full-run budget: a second statement beside the verdict at B."""

    full_run_budget: float
    pilot_budget: float
    factor: float
    rho_range: tuple[float, float]
    recommended_rho: float
    shift: float                 # ρ moved from the range at B
    shift_ci: tuple[float, float]
    drift: float                 # ρ per decade used
    drift_se: float
    model: str = MODEL_NAME
    validated_factor: float = VALIDATED_FACTOR
    range_at_b: tuple[float, float] | None = None   # the verdict's range at B, which this one moves
    own_drift: float | None = None        # the grid's own drift and SE before shrinkage (None: not identified)
    own_drift_se: float | None = None

    @property
    def validated(self) -> bool:
        return self.factor <= self.validated_factor * (1 + 1e-9)

    def line(self) -> str:
        lo, hi = self.rho_range
        past = "" if self.validated else (f"; PAST the validated {self.validated_factor:g} × B: widened, "
                                          "an extrapolation")
        return (f"range at F = {self.full_run_budget:.3g} FLOPs ({self.factor:.3g} × B): ρ ∈ [{lo:.2f}, {hi:.2f}], "
                f"recommended {self.recommended_rho:.2f} (moved {self.shift:+.2f} from the range at B"
                + (f" [{self.range_at_b[0]:.2f}, {self.range_at_b[1]:.2f}]" if self.range_at_b else "") + ", 90% CI "
                f"{self.shift_ci[0]:+.2f} … {self.shift_ci[1]:+.2f}; {self.model}, {self.drift:+.3f} ρ per decade "
                f"± {self.drift_se:.3f}; validated up to {self.validated_factor:g} × B{past})")

    def to_dict(self) -> dict:
        return {"full_run_budget": self.full_run_budget, "pilot_budget": self.pilot_budget, "factor": self.factor,
                "rho_range": list(self.rho_range), "recommended_rho": self.recommended_rho, "shift": self.shift,
                "shift_ci": list(self.shift_ci), "range_at_b": list(self.range_at_b) if self.range_at_b else None,
                "drift": self.drift, "drift_se": self.drift_se, "model": self.model,
                "validated_factor": self.validated_factor, "validated": self.validated,
                "own_drift": self.own_drift, "own_drift_se": self.own_drift_se, "line": self.line()}


def range_at(rho_range: tuple[float, float], recommended_rho: float, *, pilot_budget: float,
             full_run_budget: float, drift: float = POPULATION_DRIFT, drift_se: float = POPULATION_SPREAD,
             validated_factor: float = VALIDATED_FACTOR) -> RangeAtBudget:
    """The range at F: the closed range at B (``rho_range``, a range open at a grid edge included:
    the drift says where past the edge) moved by ``drift`` × log10(F / B), widened on each side by
    the 90 % CI of that move, clipped to [0.01, 0.99]. Refused (DriftError) past
    ``validated_factor`` or for F < B; every argument is checked first (an inverted range, a recommended ρ
    outside it, NaN, a negative SE, a budget that is not a positive finite FLOP count: DriftError naming it)."""
    rho_range = A.interval("rho_range", rho_range, gt=0.0, lt=1.0, error=DriftError)
    recommended_rho = A.number("recommended_rho", recommended_rho, gt=0.0, lt=1.0, error=DriftError)
    if not rho_range[0] - 1e-6 <= recommended_rho <= rho_range[1] + 1e-6:     # a verdict's ρ lies in its range
        raise DriftError(f"recommended_rho {recommended_rho:g} is outside rho_range [{rho_range[0]:g}, {rho_range[1]:g}]: "
                         "expected the ρ the verdict recommends, inside its range at B")
    pilot_budget = A.number("pilot_budget", pilot_budget, gt=0, error=DriftError, expected="a positive finite FLOP count")
    full_run_budget = A.number("full_run_budget", full_run_budget, gt=0, error=DriftError,
                               expected="a positive finite FLOP count")
    drift = A.number("drift", drift, error=DriftError)
    drift_se = A.number("drift_se", drift_se, ge=0, error=DriftError)
    validated_factor = A.number("validated_factor", validated_factor, ge=1, error=DriftError)
    factor = full_run_budget / pilot_budget
    if factor < 1.0:
        raise DriftError(f"F = {full_run_budget:.3g} FLOPs is smaller than a pilot ({pilot_budget:.3g}): "
                         "the verdict at B already covers it")
    if factor > MAX_FACTOR * (1 + 1e-9):
        raise DriftError(f"F = {full_run_budget:.3g} FLOPs is {factor:.3g} × the pilot budget, past "
                         f"the {MAX_FACTOR:g} × RACE extrapolates to (validated up to {validated_factor:g} ×); run "
                         f"pilots at ≥ {full_run_budget / validated_factor:.3g} FLOPs each")
    dx = math.log10(factor)
    shift = drift * dx
    # the CI of the move; past the validated factor each further decade counts double
    dv = math.log10(validated_factor)
    half = Z90 * drift_se * (dx if dx <= dv else dv + 2 * (dx - dv))
    lo, hi = rho_range

    def clip(v: float) -> float:
        return min(0.99, max(0.01, v))

    rng = (clip(lo + shift - half), clip(hi + shift + half))
    rec = min(rng[1], max(rng[0], recommended_rho + shift))
    return RangeAtBudget(full_run_budget=full_run_budget, pilot_budget=pilot_budget, factor=factor,
                         rho_range=rng, recommended_rho=rec, shift=shift, range_at_b=(float(lo), float(hi)), shift_ci=(shift - half, shift + half),
                         drift=drift, drift_se=drift_se, validated_factor=validated_factor)


def _pilots(pilots: Sequence[PilotResult]) -> list[PilotResult]:
    out = A.items("pilots", pilots, error=DriftError, what="PilotResult")
    for i, p in enumerate(out):
        if not isinstance(p, PilotResult):
            raise DriftError(f"pilots[{i}] {str(p)[:60]!r} must be a race.core.records.PilotResult")
    return out


def _population(population: tuple[float, float]) -> tuple[float, float]:
    """``(drift per decade, between-setting SD)``: two finite numbers, the SD > 0."""
    pair = A.items("population", population, error=DriftError, what="two numbers (drift, spread)")
    if len(pair) != 2:
        raise DriftError(f"population {str(population)[:60]!r} must be two numbers (drift per decade, spread)")
    return (A.number("population[0]", pair[0], error=DriftError),
            A.number("population[1]", pair[1], gt=0, error=DriftError))


def observations_from_pilots(pilots: Sequence[PilotResult], pilot_budget: float, target: str, *,
                             constant_rate: bool = True) -> list[Observation]:
    """A grid's budget levels from its pilots' held-out checkpoints: one level per checkpoint
    fraction (all the pilots of a grid share them), ρ the point's measured ρ, y the mean over seeds
    of the checkpoint score. A pilot that fell back is left out; a decaying rate gives only the end
    (its earlier checkpoints are not IsoFLOP points: the rate had not decayed yet)."""
    import statistics

    pilots = _pilots(pilots)
    pilot_budget = A.number("pilot_budget", pilot_budget, gt=0, error=DriftError, expected="a positive finite FLOP count")
    target = A.text("target", target, error=DriftError)
    constant_rate = A.flag("constant_rate", constant_rate, error=DriftError)
    cells: dict[tuple[float, float], list[float]] = {}
    flops: dict[float, list[float]] = {}
    rho_of: dict[float, list[float]] = {}
    for p in pilots:
        if p.status != "complete" or not p.checkpoints or find_instability(p.checkpoints, target) is not None:
            continue
        rho_of.setdefault(p.rho_target, []).append(p.flops.rho)
        for c in p.checkpoints:
            if c.fraction <= 0 or not c.evals.get(target) or (not constant_rate and c.fraction < 1):
                continue
            f = round(c.fraction, 6)
            cells.setdefault((f, p.rho_target), []).append(statistics.fmean(c.evals[target]))
            flops.setdefault(f, []).append(c.flops.total)
    levels = sorted(flops)
    out = []
    for i, f in enumerate(levels):
        here = {t: v for (ff, t), v in cells.items() if ff == f}
        var = [statistics.variance(v) for v in here.values() if len(v) > 1]
        sd = math.sqrt(statistics.fmean(var)) if var else 0.05
        x = math.log10(statistics.fmean(flops[f]) / pilot_budget)
        for t, v in here.items():
            out.append(Observation(level=i, x=x, rho=statistics.fmean(rho_of[t]), y=statistics.fmean(v),
                                   se=sd / math.sqrt(len(v))))
    return out


def range_for_pilots(pilots: Sequence[PilotResult], *, target: str, pilot_budget: float, full_run_budget: float,
                     rho_range: tuple[float, float], recommended_rho: float,
                     constant_rate: bool = True,
                     population: tuple[float, float] = (POPULATION_DRIFT, POPULATION_SPREAD)) -> RangeAtBudget:
    """The range at F for one pilot grid: its own drift (``fit_joint`` on its checkpoints), shrunk
    toward the population's (``population``: its drift per decade and between-setting SD), applied to
    its range at B (``range_at``; DriftError past MAX_FACTOR)."""
    population = _population(population)
    pilots = _pilots(pilots)             # argument errors before the fit, whose own DriftError is caught below
    A.number("pilot_budget", pilot_budget, gt=0, error=DriftError, expected="a positive finite FLOP count")
    A.text("target", target, error=DriftError)
    A.flag("constant_rate", constant_rate, error=DriftError)
    try:
        own = fit_joint(observations_from_pilots(pilots, pilot_budget, target, constant_rate=constant_rate))
    except DriftError:
        own = None
    d_own = own.d if own is not None and math.isfinite(own.d_se) else float("nan")
    se_own = own.d_se if own is not None else math.inf
    d, se = shrink(d_own, se_own, *population)
    from dataclasses import replace

    r = range_at(rho_range, recommended_rho, pilot_budget=pilot_budget, full_run_budget=full_run_budget,
                 drift=d, drift_se=se)
    return replace(r, own_drift=None if math.isnan(d_own) else d_own,
                   own_drift_se=None if not math.isfinite(se_own) else se_own)


def init_line(pilot_budget: float, full_run_budget: float) -> str:
    """What ``race init``'s header says before any pilot: how far the population drift moves the
    range at B to F, and whether F is within the validated factor."""
    pilot_budget = A.number("pilot_budget", pilot_budget, gt=0, error=DriftError, expected="a positive finite FLOP count")
    full_run_budget = A.number("full_run_budget", full_run_budget, gt=0, error=DriftError,
                               expected="a positive finite FLOP count")
    factor = full_run_budget / pilot_budget
    head = (f"Range at F: the pilots' range at B will be moved by the budget drift ({MODEL_NAME}; "
            f"population {POPULATION_DRIFT:+.3f} ρ per decade, between-setting SD {POPULATION_SPREAD:.3f}, "
            f"{POPULATION_SETTINGS} settings), validated up to {VALIDATED_FACTOR:g} × B")
    if factor > MAX_FACTOR * (1 + 1e-9):
        return (f"{head}; F is {factor:.3g} × B, past the {MAX_FACTOR:g} × RACE extrapolates to: no range at F "
                f"(pilots of ≥ {full_run_budget / VALIDATED_FACTOR:.3g} FLOPs each would give one)")
    r = range_at((0.5, 0.5), 0.5, pilot_budget=pilot_budget, full_run_budget=full_run_budget)
    tail = (f"; at F = {factor:.3g} × B: about {r.shift:+.2f} in ρ (90% CI {r.shift_ci[0]:+.2f} … "
            f"{r.shift_ci[1]:+.2f}, before the pilots' own drift refines it)")
    if not r.validated:
        tail += (f"; past the validated factor the range is widened, an extrapolation (pilots of "
                 f"≥ {full_run_budget / VALIDATED_FACTOR:.3g} FLOPs each, a larger --share, keep it validated)")
    return head + tail


def range_record(pilots: Sequence[PilotResult], diagnosis, *, pilot_budget: float, full_run_budget: float,
                 constant_rate: bool = True,
                 population: tuple[float, float] = (POPULATION_DRIFT, POPULATION_SPREAD)) -> dict:
    """``range_for_pilots`` on a diagnosis' primary verdict, as a record: ``RangeAtBudget.to_dict()``,
    or ``{"refused": the one-line reason}`` (what the forecast and race recipe both store)."""
    if not hasattr(diagnosis, "primary") or not hasattr(diagnosis, "primary_target"):
        raise DriftError(f"diagnosis {str(diagnosis)[:60]!r} must be a race.core.records.Diagnosis")
    A.flag("constant_rate", constant_rate, error=DriftError)
    population = _population(population)
    v = diagnosis.primary
    try:
        return range_for_pilots(pilots, target=diagnosis.primary_target, pilot_budget=pilot_budget,
                                full_run_budget=full_run_budget, rho_range=tuple(v.rho_range),
                                recommended_rho=v.recommended_rho, constant_rate=constant_rate,
                                population=population).to_dict()
    except DriftError as e:
        return {"refused": str(e)}
