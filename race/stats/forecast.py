"""From the pilots' held-out curves to the full run: the prediction at the full-run budget per ρ, or
its one-line refusal. Pure: numpy and scipy (imported at call time; ``import race`` does not import
this module).

The data (the pilots' checkpoints grouped per ρ, pooled over runs; B the pilot budget, x = ln(C / B))
are race.stats.curves'; the models (``sigmoid``, ``loglinear``), their fits, and the backtests that
choose the model and bound the extrapolation are race.stats.curvefit's.

**Refusal.** The supported factor f* is the largest backtest factor up to which every backtest of
the chosen model held (none held: no f*). A full run F below the pilots' first held-out checkpoint
is refused (no curve reaches back there; ``force`` does not change that). A full run F with
F / B ≤ 1, or ≤ f*, is predicted;
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
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

from race.core import arguments as A
from race.core.errors import RaceError
from race.core.records import Backtest, Forecast, ForecastPoint, PilotResult, Regime, Stability
from race.stats.curvefit import (BACKTEST_CUT, HOLD_SHARE, MIN_PREFIX_POINTS, MODELS, SurfaceFit, backtest_cuts,
                                 choose_model, fit_surface, run_backtest, supported_factor)
from race.stats.curves import (Curves, ForecastError, base_score, check_runs, checked_curves, collect_curves, fit_data,
                               pilot_ends, point_curve)
from race.stats.instability import stability, stability_at

SCALERL_FACTOR = 2.0         # ScaleRL's prefix fits held to about 2×: the advice when no backtest held
FORECAST_N_BOOT = 1000       # bootstrap replicates (race.stats.fit's convention)
MAX_N_BOOT = 100_000         # more replicates are refused on entry: memory and time grow with them, the CIs do not


# ----------------------------------------------------------------------------- bootstrap

def replicate_means(curves: Curves, *, n_boot: int, seed: int, level: float) -> list[np.ndarray]:
    """Per group (n_boot, n_k) replicate mean curves: prompts resampled (paired across pilots and
    checkpoints of one prompt set), then the group's pilots with replacement, deviations scaled by
    √(n/(n−1))·t_df/z (df = Σ (pilots − 1) over groups), as race.stats.fit does for point means."""
    from race.stats.fit import t_quantile

    checked_curves(curves)
    n_boot = A.whole("n_boot", n_boot, ge=1, le=MAX_N_BOOT, error=ForecastError)
    seed = A.whole("seed", seed, ge=0, error=ForecastError)
    level = A.number("level", level, gt=0, lt=1, error=ForecastError)
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


@dataclass(frozen=True)
class _Ask:
    """One forecast's checked arguments, and the settings its record stores."""

    runs: Sequence[tuple[Sequence[PilotResult], float]]
    target: str
    full_run_budget: float
    pilot_regime: Regime
    pilot_best_rho: float
    force: bool
    n_boot: int
    seed: int
    level: float
    tau: float
    settings: dict[str, Any]

    @property
    def head(self) -> str:
        return f"forecast at {_fmt(self.full_run_budget)} FLOPs"


def forecast(runs: Sequence[tuple[Sequence[PilotResult], float]], *, target: str, full_run_budget: float,
             pilot_regime: Regime, pilot_best_rho: float, force: bool = False, n_boot: int = FORECAST_N_BOOT,
             seed: int = 0, confidence_level: float = 0.9, reward_share_threshold: float = 0.2) -> Forecast:
    """The forecast at ``full_run_budget`` from the pilots of ``runs`` (each: pilots, pilot budget;
    several runs of one setup are pooled). Never raises for data it cannot forecast from: the
    result is then ``status == "refused"`` with a one-line ``message``. Raises ``ForecastError``
    (a RaceError) only for arguments that fail their checks on entry, in one line naming the argument."""
    ask = _checked(runs, target=target, full_run_budget=full_run_budget, pilot_regime=pilot_regime,
                   pilot_best_rho=pilot_best_rho, force=force, n_boot=n_boot, seed=seed,
                   confidence_level=confidence_level, reward_share_threshold=reward_share_threshold)
    try:
        curves = collect_curves(runs, target)
    except ForecastError as e:
        return _refused(ask, str(e))
    notes = list(curves.warnings)
    r0 = float(base_score(curves, [g.mean for g in curves.groups]))
    if len(curves.points) < 2:
        return _refused(ask, f"only {len(curves.points)} grid point has checkpoints: a forecast compares ρ", curves,
                        r0=r0)
    first = min(float(g.flops[g.fractions > 0].min()) for g in curves.groups)
    if ask.full_run_budget < first * (1 - 1e-9):
        return _refused(ask, f"F is below the pilots' first held-out checkpoint ({_fmt(first)} FLOPs, "
                        f"{first / curves.budget:.2g} × the pilot budget): a forecast there would extrapolate back "
                        "from the checkpoints, not between them; a run that short is shorter than a pilot, whose "
                        "verdict at the pilot budget applies", curves, r0=r0)
    cuts = backtest_cuts(curves)
    if not cuts:
        return _refused(ask, f"no grid point has {MIN_PREFIX_POINTS} checkpoints after the base before its end, so "
                        "no backtest can be run: re-run the pilots with more eval.checkpoints (8, the default, or more)",
                        curves, r0=r0)
    backtests = _backtests(curves, cuts, notes)
    model, chosen = choose_model(backtests)
    if chosen is None:
        return _refused(ask, "every backtest fit failed", curves, backtests, r0=r0, warnings=notes)
    f_star = supported_factor(backtests, model)
    factor = ask.full_run_budget / curves.budget
    try:
        fit = fit_surface(model, fit_data(curves, [g.mean for g in curves.groups]), r0, unit=curves.unit)
    except (ForecastError, ValueError, np.linalg.LinAlgError) as e:
        return _refused(ask, f"the {model} fit on all checkpoints failed ({e})", curves, backtests, model, f_star,
                        r0=r0, warnings=notes)
    ok = factor <= 1.0 + 1e-9 or (f_star is not None and factor <= f_star * (1 + 1e-9))
    points = _points(curves, fit)
    if not ok and not force:
        reason, needed = _refusal(ask, curves, backtests, model, f_star)
        return _refused(ask, reason, curves, backtests, model, f_star, needed, points,
                        fit.shared if model == "sigmoid" else None, r0, notes)
    return _predicted(ask, curves, fit, backtests, points, f_star=f_star, ok=ok, r0=r0, notes=notes)


def _checked(runs: Any, *, target: Any, full_run_budget: Any, pilot_regime: Regime, pilot_best_rho: Any,
             force: Any, n_boot: Any, seed: Any, confidence_level: Any, reward_share_threshold: Any) -> _Ask:
    """``forecast``'s arguments checked, in the order its errors name them."""
    full_run_budget = A.number("full_run_budget", full_run_budget, gt=0, error=ForecastError,
                               expected="a positive finite FLOP count, e.g. 6e12")
    n_boot = A.whole("n_boot", n_boot, ge=1, le=MAX_N_BOOT, error=ForecastError)
    seed = A.whole("seed", seed, ge=0, error=ForecastError)
    A.flag("force", force, error=ForecastError)
    A.text("target", target, error=ForecastError)
    confidence_level = A.number("confidence_level", confidence_level, gt=0, lt=1, error=ForecastError)
    reward_share_threshold = A.number("reward_share_threshold", reward_share_threshold, ge=0, le=1,
                                      error=ForecastError)
    pilot_best_rho = A.number("pilot_best_rho", pilot_best_rho, gt=0, lt=1, error=ForecastError)
    A.instance("pilot_regime", pilot_regime, Regime, error=ForecastError,
               expected="a race.core.records.Regime (the pilot verdict's regime)")
    check_runs(runs)
    settings = {"n_boot": n_boot, "seed": seed, "confidence_level": confidence_level,
                "reward_share_threshold": reward_share_threshold, "backtest_cut": BACKTEST_CUT,
                "min_prefix_points": MIN_PREFIX_POINTS, "hold_share": HOLD_SHARE, "scalerl_factor": SCALERL_FACTOR,
                "force": bool(force)}
    return _Ask(runs, target, float(full_run_budget), pilot_regime, pilot_best_rho, force, n_boot, seed,
                confidence_level, reward_share_threshold, settings)


def _refused(ask: _Ask, reason: str, curves: Curves | None = None, backtests: Sequence[Backtest] = (),
             model: str | None = None, f_star: float | None = None, needed: float | None = None,
             points: Sequence[ForecastPoint] = (), shared: bool | None = None, r0: float | None = None,
             warnings: Sequence[str] = ()) -> Forecast:
    """The refusal's record: ``reason`` in its one line, and what was learned before it."""
    F = ask.full_run_budget
    budget = curves.budget if curves else max((float(b) for _, b in ask.runs), default=0.0)
    return Forecast(target=ask.target, full_run_budget=F, pilot_budget=budget, factor=F / budget if budget > 0 else 0.0,
                    status="refused",
                    message=f"no {ask.head}: {reason}", model=model, shared_slope=shared, r0=r0, points=tuple(points),
                    backtests=tuple(backtests), supported_factor=f_star, needed_budget=needed, regime=None,
                    best_rho=None, rho_range=None, confidence=None, pilot_regime=ask.pilot_regime,
                    pilot_best_rho=ask.pilot_best_rho, differs=False,
                    budgets=curves.budgets if curves else (), settings=ask.settings, warnings=tuple(warnings))


def _backtests(curves: Curves, cuts: Sequence[float], notes: list[str]) -> list[Backtest]:
    """Every model's backtest at every cut; one that fails is a note, not a backtest."""
    backtests: list[Backtest] = []
    for model in MODELS:
        for cut in cuts:
            try:
                backtests.append(run_backtest(curves, model, cut))
            except (ForecastError, ValueError, np.linalg.LinAlgError) as e:
                notes.append(f"{model} backtest at {cut:.2f} of the budget failed: {e}")
    return backtests


def _points(curves: Curves, fit: SurfaceFit) -> list[ForecastPoint]:
    """Per grid point: its pilots' end, the fit there and its parameters, the curve; no prediction yet."""
    c_end, y_end = pilot_ends(curves)
    fitted_end = fit.predict(np.log(c_end / curves.budget))
    return [ForecastPoint(rho_target=float(t), rho_measured=float(curves.rho[i]),
                          pilots=sum(len(g.seeds) for g in curves.groups if curves.primary(g) and curves.point_of(g) == i),
                          pilot_flops=float(c_end[i]), pilot_score=float(y_end[i]), fitted_end=float(fitted_end[i]),
                          predicted=None, predicted_ci=None, params=fit.described(i, curves.budget),
                          curve=point_curve(curves, i)) for i, t in enumerate(curves.points)]


def _refusal(ask: _Ask, curves: Curves, backtests: Sequence[Backtest], model: str,
             f_star: float | None) -> tuple[str, float | None]:
    """Why F is past what the backtests support, and the pilot budget that would support it (None:
    none would, by the rule)."""
    F = ask.full_run_budget
    factor = F / curves.budget
    model_bt = sorted((b for b in backtests if b.model == model), key=lambda b: b.factor)
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
        return reason, needed
    nxt = next((b for b in model_bt if b.factor > f_star), None)
    beyond = (f"; at {nxt.factor:.2g}× its error {nxt.contrast_mae:.3f} ≥ half the ρ spread {nxt.spread / 2:.3f}"
              if nxt is not None else "; no backtest reaches further with these checkpoints")
    needed = F / f_star
    reason = (f"{factor:.3g}× the pilot budget {_fmt(curves.budget)} is past the {f_star:.2g}× that the "
              f"{model} backtests support{beyond}; a pilot budget ≥ {_fmt(needed)} FLOPs would support it; "
              "--force-forecast prints it anyway")
    return reason, needed


def _predicted(ask: _Ask, curves: Curves, fit: SurfaceFit, backtests: Sequence[Backtest],
               points: Sequence[ForecastPoint], *, f_star: float | None, ok: bool, r0: float,
               notes: list[str]) -> Forecast:
    """The prediction at F (supported, or forced): the fit there with its bootstrap CIs, and the
    regime rule on the predicted scores."""
    from race.stats.regime import response_verdict

    F = ask.full_run_budget
    factor = F / curves.budget
    preds = _replicate_predictions(ask, curves, fit, notes)
    point = fit.predict(math.log(F / curves.budget))
    q = (1 - ask.level) / 2
    lo, hi = np.quantile(preds, [q, 1 - q], axis=0) if preds.shape[0] else (point, point)
    points = [_with_prediction(p, float(point[i]), (float(lo[i]), float(hi[i]))) for i, p in enumerate(points)]
    verdict = response_verdict(rho=curves.rho, scores=point, replicates=preds if preds.shape[0] else point[None],
                               reward_shares=curves.reward_share,
                               seeds_measured=any(len(g.seeds) > 1 for g in curves.groups),
                               tau=ask.tau, level=ask.level)
    best_rho = float(curves.points[verdict.best])
    differs = verdict.regime is not ask.pilot_regime or not math.isclose(best_rho, ask.pilot_best_rho)
    return Forecast(target=ask.target, full_run_budget=F, pilot_budget=curves.budget, factor=factor,
                    status="predicted" if ok else "forced", message=_message(ask, verdict, best_rho, differs,
                                                                             factor=factor, f_star=f_star, ok=ok),
                    model=fit.model, shared_slope=fit.shared if fit.model == "sigmoid" else None, r0=r0,
                    points=tuple(points), backtests=tuple(backtests), supported_factor=f_star,
                    needed_budget=None if ok else (F / f_star if f_star else
                                                   F / SCALERL_FACTOR if F / SCALERL_FACTOR > curves.budget else None),
                    regime=verdict.regime, best_rho=best_rho, rho_range=tuple(float(r) for r in verdict.rho_range),
                    open_side=verdict.open_side, confidence=verdict.confidence, pilot_regime=ask.pilot_regime,
                    pilot_best_rho=ask.pilot_best_rho, differs=differs, budgets=curves.budgets, settings=ask.settings,
                    warnings=tuple(notes))


def _replicate_predictions(ask: _Ask, curves: Curves, fit: SurfaceFit, notes: list[str]) -> np.ndarray:
    """(replicates, P) predictions at F: each bootstrap replicate refitted from the point fit; the
    replicates whose refit failed left out (a note when more than a tenth did)."""
    reps = replicate_means(curves, n_boot=ask.n_boot, seed=ask.seed, level=ask.level)
    x_f = math.log(ask.full_run_budget / curves.budget)
    preds = np.full((ask.n_boot, len(curves.points)), np.nan)
    for b in range(ask.n_boot):
        rep = [m[b] for m in reps]
        try:
            preds[b] = fit_surface(fit.model, fit_data(curves, rep), float(base_score(curves, rep)), unit=curves.unit,
                                   init=fit).predict(x_f)
        except (ForecastError, ValueError, np.linalg.LinAlgError):
            continue
    good = np.all(np.isfinite(preds), axis=1)
    if good.mean() < 0.9:
        notes.append(f"{int((~good).sum())} of {ask.n_boot} bootstrap refits failed and were left out")
    return preds[good]


def _message(ask: _Ask, verdict: Any, best_rho: float, differs: bool, *, factor: float, f_star: float | None,
             ok: bool) -> str:
    """The prediction's one line: how far past the pilot budget, the verdict, and whether it differs
    from the pilot budget's."""
    scope = ("interpolated inside the pilot budget" if factor <= 1 + 1e-9 else
             f"{factor:.3g}× the pilot budget, within the {f_star:.2g}× the backtests support" if ok else
             f"FORCED: {factor:.3g}× the pilot budget, past the "
             + (f"{f_star:.2g}× the backtests support" if f_star else "factor any backtest supports")
             + ", a guess, not a supported prediction")
    return (f"{ask.head} ({scope}): best ρ {best_rho:.2f}, {verdict.regime.value}"
            + (f"; DIFFERS from the pilot-budget verdict ({ask.pilot_regime.value}, best ρ {ask.pilot_best_rho:.2f})"
               if differs else "; as at the pilot budget"))


def _with_prediction(p: ForecastPoint, value: float, ci: tuple[float, float]) -> ForecastPoint:
    return replace(p, predicted=value, predicted_ci=ci)


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


def _no_pilot_twice(runs: Sequence[tuple[Sequence[Any], float]]) -> None:
    """Pooled runs hold other pilots than the run and each other (another budget, or other seeds): a pilot counted
    twice (the same budget, ρ and seed: the same file given again) would narrow every interval of the forecast."""
    seen: dict[tuple[float, float, int], int] = {}
    for i, (pilots, budget) in enumerate(runs):
        for p in pilots:
            key = (float(budget), float(p.rho_target), int(p.seed))
            if p.status == "complete" and seen.setdefault(key, i) != i:
                first = "the run" if seen[key] == 0 else f"pool[{seen[key] - 1}]"
                raise RaceError(f"pool[{i - 1}] holds the pilot ρ={key[1]:g} seed {key[2]} at {key[0]:.3g} FLOPs that "
                                f"{first} holds: pool other runs of the setup (another budget or other seeds), each once")


def with_forecast(results: Any, *, full_run_budget: float | str | None = None, force: bool = False,
                  pool: Sequence[Any] = (), refit: bool = False, n_boot: int | None = None) -> Any:
    """The diagnosis of ``results`` (race.stats.results.Results) with its forecast at ``full_run_budget``
    (default: the config's ``full_run_budget``), pooling the pilots of the ``pool`` results (other
    budgets of the same setup). Without a full-run budget: the diagnosis as stored, its forecast
    (if any) kept. The bootstrap follows the diagnosis's classify settings (seed, confidence
    level, reward-share threshold; n_boot unless given). Its arguments are checked on entry
    (``ForecastError`` or, for the budget, ``ConfigError``: one line naming the argument)."""
    from race.config.configfile import LearningRate, parse_flops
    from race.stats.results import diagnose_results

    _results(results, "results")
    A.flag("force", force, error=ForecastError)
    A.flag("refit", refit, error=ForecastError)
    for i, other in enumerate(A.items("pool", pool, error=ForecastError, what="Results")):
        _results(other, f"pool[{i}]")
    if n_boot is not None:
        A.whole("n_boot", n_boot, ge=1, le=MAX_N_BOOT, error=ForecastError)
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
    stored = diag.meta.get("classify") if isinstance(diag.meta, Mapping) else None
    settings = dict(stored if isinstance(stored, Mapping) else results.classify or {})
    for other in pool:
        same = {k: (other.config or {}).get(k) for k in ("model", "task")}
        mine = {k: (results.config or {}).get(k) for k in ("model", "task")}
        if same != mine:
            raise RaceError(f"a pooled results file ran {same['model']} on {same['task']}, this one "
                            f"{mine['model']} on {mine['task']}: pool runs of one setup only")
    runs = [(results.pilots, results_budget(results))] + [(o.pilots, results_budget(o)) for o in pool]
    _no_pilot_twice(runs)
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
    full_run_budget = A.number("full_run_budget", full_run_budget, gt=0, error=ForecastError,
                               expected="a positive finite FLOP count, e.g. 6e12")
    if st is not None:
        A.instance("st", st, Stability, error=ForecastError,
                   expected="None or a race.core.records.Stability (race.stats.instability.stability)")
    probe = probe_for(results, full_run_budget)
    at_f = stability_at(st, full_run_budget=full_run_budget, pilot_budget=budget, probe=probe)
    lr, full_lr = configured_lr(results.config or {})
    rate = full_run_rate(lr, status=at_f["status"], factor=full_run_budget / budget if budget else float("inf"),
                         full_lr=full_lr, probe=probe, cause=at_f.get("cause"))
    return {"status": at_f["status"], "line": at_f["line"], "rate": rate["line"]}


def budget_range(results: Any, diag: Any, full_run_budget: float, schedule: str) -> dict[str, Any]:
    """The budget-drift model's range at F for these results (race.stats.drift), or ``{"refused": why}``;
    beside a range, under ``prior_start``, the prior-start recommendation (race.stats.design.prior_start:
    the range's ρ shrunk toward the population prior by the pilots' seed and drift uncertainty)."""
    from race.config.rules import LR_SCHEDULES
    from race.stats.design import DesignError, prior_start
    from race.stats.drift import range_record

    _results(results, "results")
    full_run_budget = A.number("full_run_budget", full_run_budget, gt=0, error=ForecastError,
                               expected="a positive finite FLOP count, e.g. 6e12")
    A.one_of("schedule", schedule, LR_SCHEDULES, error=ForecastError)
    rec = range_record(results.pilots, diag, pilot_budget=results_budget(results), full_run_budget=full_run_budget,
                       constant_rate=schedule == "constant")
    if "refused" in rec:
        return rec
    try:
        return {**rec, "prior_start": prior_start(results.pilots, rec, target=diag.primary_target).to_dict()}
    except DesignError:                 # no complete pilot scored on the target: the range alone
        return rec
