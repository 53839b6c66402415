"""From pilot results to a regime verdict: ``classify(results) -> Diagnosis``. Pure.

The rule (docs/regime.md has the reasoning and the measured false-verdict rates).
CIs are two-sided percentile intervals at ``confidence_level`` of the paired
seed × prompt bootstrap in :mod:`race.stats.fit`; x = log ρ with ρ measured.

1. reward-heavy  if C_reward / C_total at the pilot-best grid point ≥ reward_share_threshold;
2. else the trend, the first of these whose CI condition holds —
   balanced      the quadratic fit is concave (ĉ < 0), the curvature CI lies below 0,
                 and the argmax-ρ CI lies strictly inside (ρ_min, ρ_max) of the grid;
   update-heavy  the log-linear slope CI lies above 0;
   search-heavy  the log-linear slope CI lies below 0 —
   provided ≥ MIN_SUPPORT of the bootstrap replicates show an effect of at least
   REPLICATE_BAND_SE contrast SEs (the support gate; see ``replicate_trends``);
3. inconclusive  otherwise, and always when no grid point has two seeds.

A grid where at least ``UNSTABLE_GRID_SHARE`` of the pilots fell back on their held-out checkpoints
gets an "unstable grid" warning naming it (race.stats.instability ``unstable_grid``): its regime describes
runs that diverge (docs/validation.md decided this on the validation study's development half).
A grid with fewer fallen pilots, but some, gets a "pilots fell back" warning: in that study a grid
with 2 of 12 (a decaying rate) came before full runs that all collapsed. Neither enters the verdict.

The ρ range is the region whose fitted reward lies within RANGE_WITHIN_SE SEs of the fitted best,
inside the grid. A search-heavy verdict whose pilot-best point is the grid's lowest ρ opens it
below (``TargetVerdict.open_side`` "below": recommend ρ ≤ its top, run at that edge point); an
update-heavy one whose best is the highest ρ opens it above (``open_side``; decided on the
validation study's development half, docs/validation.md).

A reward-heavy verdict still computes the trend, which sets its ρ range and is
reported in ``fits["trend_regime"]``. Pilots with held-out checkpoints also get the
instability rule of :mod:`race.stats.instability` on the primary target (``Diagnosis.stability``);
it flags pilots, it does not enter the verdict. ``response_verdict`` applies steps 1–3 to point
scores and replicates from elsewhere (race.stats.forecast: rewards predicted at a full-run budget).

A verdict's confidence is the predicted share of reruns (the same grid, other seed sets) that state
its regime: ``rerun_confidence`` classifies reruns simulated by race.stats.confidence with this rule
(issue 54; docs/regime.md, "Does a verdict survive a rerun?", has its reliability on real reruns).
``fits["bootstrap_share"]`` keeps the share of this grid's replicates that agree, the number stated
before; it is the confidence where seed noise is not measured (``fits["confidence_method"]``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, Mapping, Sequence

import numpy as np

from race.stats.classify_input import ClassifyError, checked
from race.stats.confidence import SimulatedReruns, simulate_reruns
from race.stats.instability import learned, stability, stability_notes
from race.stats.fit import (BootstrapResponse, GridScores, bootstrap_response, compare_fits, grid_scores,
                      percentile_ci, quadratic_argmax, response_of_means, t_quantile)
from race.core.records import Diagnosis, FlopBreakdown, PilotResult, PointSummary, Regime, TargetVerdict

REWARD_SHARE_THRESHOLD = 0.2   # default τ: feedback share of C_total at the best point
MIN_GRID_POINTS = 3            # a quadratic needs 3 distinct ρ
MIN_SEEDS_PER_POINT = 2        # below this, seed noise at that point is not measured
RANGE_WITHIN_SE = 1.0          # ρ range: predicted reward within this many SEs of the best
REPLICATE_BAND_SE = 2.0        # a replicate is decisive when its effect ≥ this many contrast SEs
SEED_RESAMPLING = "pooled"     # how the bootstrap resamples seeds (see race.stats.fit)
SEED_DF_CORRECTION = True      # scale seed deviations by t_df / z (see seed_scale)
MIN_SUPPORT = 0.7              # a trend verdict needs this share of decisive replicates
CONFIDENCE_METHOD = "rerun"    # TargetVerdict.confidence: "rerun" (fits["rerun_confidence"]) or "bootstrap" share
SEED_ADVICE_POWER = 0.8        # power assumed when estimating how many seeds are needed
MAX_SEEDS_ADVICE = 100         # cap on the "add seeds" estimate
_RANGE_STEPS = 401             # resolution of the ρ-range search (log-spaced)
_TRENDS = (Regime.BALANCED, Regime.UPDATE_HEAVY, Regime.SEARCH_HEAVY, Regime.INCONCLUSIVE)


def classify(results: Sequence[PilotResult], *, targets: Sequence[str] | None = None,
             primary_target: str = "reward", reward_share_threshold: float = REWARD_SHARE_THRESHOLD,
             n_boot: int = 1000, confidence_level: float = 0.9, seed: int = 0,
             meta: Mapping[str, Any] | None = None, rerun_confidence: bool | None = None) -> Diagnosis:
    """Classify a pilot grid into a regime per evaluation target.

    Only results with ``status == "complete"`` count; pilots are grouped into
    grid points by ``rho_target``. ``targets=None`` means every target that all
    complete pilots report. The output does not depend on the order of
    ``results``. Raises ValueError on: no complete result, < 3 grid points, a
    requested target missing from a pilot, misaligned prompt counts. ``rerun_confidence``: simulate
    reruns for ``fits["rerun_confidence"]`` (race.stats.confidence; 0.15–0.9 s per target on 2
    shared cores, docs/benchmarks.md); None: when ``CONFIDENCE_METHOD`` is ``"rerun"`` (the default), and then the confidence is
    it; False: the confidence is the bootstrap share, and ``fits["rerun_confidence"]`` is None.
    """
    results, targets = checked(results, targets, primary_target, reward_share_threshold, n_boot, confidence_level,
                                seed, meta, rerun_confidence)
    simulate = CONFIDENCE_METHOD == "rerun" if rerun_confidence is None else rerun_confidence
    complete = _complete_results(results, confidence_level)
    names, notes = _resolve_targets(complete, targets, primary_target)
    verdicts = {name: _verdict(complete, name, tau=reward_share_threshold, n_boot=n_boot,
                               level=confidence_level, seed=seed, simulate=simulate) for name in names}
    notes += _disagreement_notes(verdicts)
    notes += _pilot_notes(results, complete)
    st = stability(complete, primary_target)
    notes += stability_notes(st)
    got = learned(complete, primary_target)
    if got is not None and not got[0]:
        notes.append(f"nothing learned: no grid point's held-out {primary_target} rose above the base policy's (best "
                     f"gain {got[1]:+.4f}, seed SE {got[2]:.4f}): the grid says nothing about allocation; give each "
                     "pilot more budget, a larger learning rate or an easier task (more seeds will not help)")
        v = verdicts[primary_target]          # seeds cannot resolve a change that did not happen
        verdicts[primary_target] = replace(v, fits={**dict(v.fits), "learned": False},
                                           warnings=tuple(w for w in v.warnings
                                                          if not w.startswith("noise dominates: add seeds")))
    settings = {"primary_target": primary_target, "targets": names, "n_boot": n_boot, "seed": seed,
                "confidence_level": confidence_level, "reward_share_threshold": reward_share_threshold}
    return Diagnosis(primary_target=primary_target, verdicts=verdicts, warnings=tuple(notes),
                     meta={**dict(meta or {}), "classify": settings}, stability=st)


def _complete_results(results: Sequence[PilotResult], confidence_level: float) -> list[PilotResult]:
    """The complete pilots in canonical order (ρ, seed); ValueError when there are none, or they
    cover fewer than MIN_GRID_POINTS grid points, or the confidence level is outside (0, 1)."""
    if not 0.0 < confidence_level < 1.0:
        raise ClassifyError(f"confidence_level must be in (0, 1), got {confidence_level}")
    complete = sorted((r for r in results if r.status == "complete"), key=lambda r: (r.rho_target, r.seed))
    if not complete:
        statuses = sorted({r.status for r in results})
        raise ClassifyError(f"no complete results among {len(results)} (statuses: {statuses}); "
                         "expected at least one with status 'complete'")
    grid_rhos = sorted({r.rho_target for r in complete})
    if len(grid_rhos) < MIN_GRID_POINTS:
        raise ClassifyError(f"complete results cover {len(grid_rhos)} grid points (ρ={grid_rhos}); "
                         f"expected ≥ {MIN_GRID_POINTS}")
    return complete


def _disagreement_notes(verdicts: Mapping[str, TargetVerdict]) -> list[str]:
    """Notes when the targets' regimes disagree, and when the reward-heavy ones' trends do."""
    notes = []
    regimes = {name: v.regime.value for name, v in verdicts.items()}
    if len(set(regimes.values())) > 1:
        notes.append("targets disagree: " + ", ".join(f"{k} → {v}" for k, v in regimes.items()))
    trends = {name: v.fits["trend_regime"] for name, v in verdicts.items() if v.regime is Regime.REWARD_HEAVY}
    if len(set(trends.values())) > 1:
        notes.append("trends under the feedback cost disagree: " + ", ".join(f"{k} → {v}" for k, v in trends.items()))
    return notes


def _pilot_notes(results: Sequence[PilotResult], complete: list[PilotResult]) -> list[str]:
    """Notes on how the pilots ran: a training reward that never varied, reward and held-out
    evaluation errors, sampler / trainer log-prob gaps, and pilots left out as not complete."""
    notes = []
    seen = {v for r in complete for _, v in r.curve}
    if len(seen) == 1 and all(r.curve for r in complete):
        notes.append(f"the training reward was {seen.pop():g} at every step of every pilot: GRPO had no signal "
                     "(a group whose rollouts all score alike has zero advantages); check the reward function")
    failing = [r for r in complete if r.extra.get("reward_errors")]
    if failing:
        first = next((r.extra["reward_first_error"] for r in failing if r.extra.get("reward_first_error")), None)
        notes.append(f"the reward failed {sum(int(r.extra['reward_errors']) for r in failing)} times in training "
                     f"(raised, or returned no finite number: those samples scored 0) in {len(failing)} of "
                     f"{len(complete)} pilots" + (f"; first: {first}" if first else ""))
    notes += _sync_notes(complete)
    failed_targets: dict[str, list] = {}
    for r in complete:
        for name, e in (r.extra.get("eval_errors") or {}).items():
            failed_targets.setdefault(name, []).append(e)
    for name, errs in sorted(failed_targets.items()):
        notes.append(f"target {name!r} failed {sum(int(e['count']) for e in errs)} times in held-out evaluation "
                     f"(those samples scored 0) in {len(errs)} of {len(complete)} pilots; first: {errs[0].get('first')}")
    skipped = len(results) - len(complete)
    if skipped:
        notes.append(f"{skipped} of {len(results)} pilots are not complete and were left out")
    return notes


def _sync_notes(complete: list[PilotResult]) -> list[str]:
    """A note when the sync check flagged pilots (the sampler's log-probs off the trainer's), naming the worst."""
    synced = [r for r in complete if (r.extra.get("sync") or {}).get("n_flagged")]
    if not synced:
        return []
    worst = max(synced, key=lambda r: r.extra["sync"]["gap_max"])
    ws = worst.extra["sync"]
    return [f"the sync check flagged {len(synced)} of {len(complete)} pilots: the sampler's log-probs of the "
            f"sampled tokens differed from the training model's by up to {ws['gap_max']:.3g} per token "
            f"(warning level {ws['warn_at']:g}) in {sum(r.extra['sync']['n_flagged'] for r in synced)} steps "
            f"(worst: ρ={worst.rho_target:g}, seed {worst.seed}, first at step {ws['flagged_steps'][0]}): "
            "rollouts may come from stale weights"]


def open_side(regime: Regime, best: int, n_points: int) -> str | None:
    """Where the recommended range opens past the grid: "below" for a search-heavy verdict whose
    pilot-best point is the grid's lowest ρ (recommend ρ ≤ the range's top: the optimum may lie
    lower, and the best point measured is that edge), "above" for an update-heavy one whose best is
    the highest ρ; None otherwise. Adopted on the validation study's development half
    (docs/validation.md, 2026-12-02): in all three edge verdicts there, the full runs' best ρ lay
    below the pilot grid, outside the closed range the rule gave before."""
    if regime is Regime.SEARCH_HEAVY and best == 0:
        return "below"
    if regime is Regime.UPDATE_HEAVY and best == n_points - 1:
        return "above"
    return None


def edge_point(side: str | None, grid: Sequence[float]) -> float | None:
    """The next ρ past the grid's edge on ``side`` (``open_side``): one geometric step of the grid's
    own outermost ratio, ρ₀² / ρ₁ below, 1 − (1 − ρₙ)² / (1 − ρₙ₋₁) above (in 1 − ρ), rounded to
    two decimals; None for no side, or when that leaves (0, 1) or lands on a grid point."""
    t = sorted(float(r) for r in grid)
    if side is None or len(t) < 2:
        return None
    p = round(t[0] * t[0] / t[1] if side == "below" else 1.0 - (1.0 - t[-1]) ** 2 / (1.0 - t[-2]), 2)
    return p if 0.0 < p < 1.0 and all(abs(p - r) > 1e-9 for r in t) else None


def _resolve_targets(complete: list[PilotResult], targets: Sequence[str] | None,
                     primary: str) -> tuple[list[str], list[str]]:
    """Targets to classify (primary first) and notes about targets left out."""
    common = set.intersection(*(set(r.evals) for r in complete))
    notes: list[str] = []
    if targets is None:
        every = set.union(*(set(r.evals) for r in complete))
        if every - common:
            notes.append(f"targets {sorted(every - common)} are missing from some pilots and were left out")
        names = sorted(common)
        if primary not in names:
            raise ClassifyError(f"primary_target {primary!r} is not reported by every complete pilot; "
                             f"expected one of {names}")
    else:
        names = list(dict.fromkeys(targets))
        if primary not in names:
            raise ClassifyError(f"primary_target {primary!r} is not in targets {names}")
        for name in names:
            if name not in common:
                bad = next(r for r in complete if name not in r.evals)
                raise ClassifyError(f"target {name!r} is missing from pilot (rho_target={bad.rho_target}, "
                                 f"seed={bad.seed}); expected one of {sorted(bad.evals)}")
    return [primary] + [n for n in names if n != primary], notes


def _grid(complete: list[PilotResult], target: str) -> GridScores:
    lengths = {len(r.evals[target]) for r in complete}
    if len(lengths) > 1:
        raise ClassifyError(f"target {target!r} has prompt counts {sorted(lengths)} across pilots; "
                         "expected the same index-aligned prompt set in every pilot")
    return grid_scores(rho_targets=[r.rho_target for r in complete], pilot_seeds=[r.seed for r in complete],
                       pilot_rho=[r.rho for r in complete], scores=[r.evals[target] for r in complete])


def _point_seconds(complete: list[PilotResult], grid: GridScores) -> list[dict[str, float]]:
    """Mean wall seconds per phase over the seeds of each grid point (canonical order)."""
    sums: list[dict[str, float]] = [{} for _ in range(grid.n_points)]
    for i, r in enumerate(complete):
        acc = sums[grid.point_index[i]]
        for phase, sec in r.wall_seconds.items():
            acc[phase] = acc.get(phase, 0.0) + float(sec)
    return [{k: v / n for k, v in acc.items()} for acc, n in zip(sums, grid.n_seeds)]


def _point_flops(complete: list[PilotResult], grid: GridScores) -> list[FlopBreakdown]:
    """Mean FLOP breakdown over the seeds of each grid point (canonical order)."""
    sums = [FlopBreakdown() for _ in range(grid.n_points)]
    for i, r in enumerate(complete):
        sums[grid.point_index[i]] = sums[grid.point_index[i]] + r.flops
    return [s.scaled(1.0 / n) for s, n in zip(sums, grid.n_seeds)]


@dataclass(frozen=True)
class _Evidence:
    """What the bootstrap says about one target's trend (steps 2–4 of the rule)."""

    trend: Regime
    slope_ci: tuple[float, float]
    curvature_ci: tuple[float, float]
    argmax_ci: tuple[float, float] | None
    replicates: np.ndarray          # (n_boot,) index into _TRENDS
    contrast_se: float              # median bootstrap SD of (point mean − grid mean)
    support: dict[str, float]       # share of replicates per trend class


def _evidence(grid: GridScores, boot: BootstrapResponse, quadratic: Any, level: float) -> _Evidence:
    return _trend_evidence(grid.rho, boot, quadratic, level, seeds_measured=grid.seed_sd() is not None)


def _trend_evidence(rho: np.ndarray, boot: BootstrapResponse, quadratic: Any, level: float, *,
                    seeds_measured: bool) -> _Evidence:
    slope_ci = percentile_ci(samples=boot.slope, confidence_level=level)
    curv_ci = percentile_ci(samples=boot.curvature, confidence_level=level)
    rho_min, rho_max = float(rho.min()), float(rho.max())
    _, concave, _ = quadratic_argmax(coef=quadratic.coef, rho_min=rho_min, rho_max=rho_max)
    argmax_ci = percentile_ci(samples=boot.argmax_rho, confidence_level=level) if concave else None
    # Shape statistics are contrasts between points: measure the band on point means minus
    # the replicate's grid mean, so that a prompt resample shifting every point alike does not count.
    contrasts = boot.point_means - boot.point_means.mean(axis=1, keepdims=True)
    contrast_se = float(np.median(contrasts.std(axis=0)))
    reps = replicate_trends(boot=boot, band=REPLICATE_BAND_SE * contrast_se)
    support = {r.value: float(np.mean(reps == i)) for i, r in enumerate(_TRENDS)}
    passed = ci_trends(slope_ci=slope_ci, curvature_ci=curv_ci, argmax_ci=argmax_ci,
                       rho_min=rho_min, rho_max=rho_max)
    decisive = 1.0 - support[Regime.INCONCLUSIVE.value]
    trend = passed[0] if passed and decisive >= MIN_SUPPORT else Regime.INCONCLUSIVE
    if not seeds_measured:              # seed noise unmeasured: every CI would be too narrow
        trend = Regime.INCONCLUSIVE
    return _Evidence(trend, slope_ci, curv_ci, argmax_ci, reps, contrast_se, support)


def _verdict(complete: list[PilotResult], target: str, *, tau: float, n_boot: int, level: float,
             seed: int, simulate: bool = False) -> TargetVerdict:
    grid = _grid(complete, target)
    boot = bootstrap_response(grid=grid, n_boot=n_boot, seed=seed, seed_resampling=SEED_RESAMPLING,
                              seed_scale=seed_scale(grid=grid, level=level))
    flops = _point_flops(complete, grid)
    seconds = _point_seconds(complete, grid)
    shares = np.array([f.shares()["reward"] for f in flops])
    means = grid.point_means
    best = int(np.argmax(means))
    fits = compare_fits(rho=grid.rho, y=means)
    ev = _evidence(grid, boot, fits["quadratic"], level)
    regime = Regime.REWARD_HEAVY if shares[best] >= tau else ev.trend
    reward_reps = shares[boot.best_point] >= tau
    if regime is Regime.REWARD_HEAVY:
        agree = reward_reps
    else:
        agree = ~reward_reps & (ev.replicates == _TRENDS.index(regime))
    share = float(np.mean(agree))
    sims = simulate_reruns(grid=grid, replicates=boot.point_means, seed_scale=seed_scale(grid=grid, level=level),
                           seed=seed, seed_resampling=SEED_RESAMPLING) if simulate else None
    rerun = None if sims is None else rerun_confidence(sims, rho=grid.rho, regime=regime, shares=shares, tau=tau,
                                                       level=level)
    use_rerun = CONFIDENCE_METHOD == "rerun" and rerun is not None
    confidence = rerun if use_rerun else share
    chosen = {Regime.BALANCED: "quadratic", Regime.UPDATE_HEAVY: "loglinear",
              Regime.SEARCH_HEAVY: "loglinear"}.get(ev.trend)
    points = tuple(
        PointSummary(rho_target=float(grid.rho_targets[p]), rho_measured=float(grid.rho[p]),
                     n_seeds=int(grid.n_seeds[p]), flops=flops[p], reward_mean=float(means[p]),
                     reward_ci=percentile_ci(samples=boot.point_means[:, p], confidence_level=level),
                     schedule=next(r.schedule for r, i in zip(complete, grid.point_index) if i == p),
                     seconds=seconds[p])
        for p in range(grid.n_points))
    slope = float(fits["loglinear"].coef[1])
    return TargetVerdict(
        target=target, regime=regime, rho_range=_rho_range(grid.rho, boot, chosen, fits, best),
        open_side=open_side(regime, best, grid.n_points),
        confidence=confidence, best_rho=float(grid.rho_targets[best]),
        best_reward=float(means[best]), slope=slope, slope_ci=ev.slope_ci, argmax_ci=ev.argmax_ci,
        points=points, warnings=tuple(_warnings(grid, regime=regime, trend=ev.trend, best=best,
                                                share=float(shares[best]), tau=tau, slope=slope, level=level)
                                      + feedback_advice(flops[best], regime=regime)),
        fits={**_fit_info(fits, grid, ev, chosen=chosen, share=float(shares[best]), n_boot=n_boot, level=level),
              "bootstrap_share": share, "rerun_confidence": rerun,
              "confidence_method": "rerun" if use_rerun else "bootstrap share"})


def rerun_confidence(sims: SimulatedReruns, *, rho: np.ndarray, regime: Regime, shares: np.ndarray, tau: float,
                     level: float) -> float:
    """The share of simulated reruns (race.stats.confidence) that state ``regime``: each is
    classified by this module's rule itself (reward-heavy at its own best point, else its
    trend: the CI conditions and the support gate on its own replicates). Deterministic."""
    n_runs, n_rep, n_points = sims.replicates.shape
    boot = response_of_means(rho=rho, means=sims.replicates.reshape(-1, n_points))
    quad = compare_fits(rho=rho, y=sims.means)["quadratic"].coef            # each rerun's point-estimate fit
    want = _TRENDS.index(regime) if regime in _TRENDS else None
    agree = 0
    for m in range(n_runs):
        rows = slice(m * n_rep, (m + 1) * n_rep)
        rerun = BootstrapResponse(rho, boot.point_means[rows], boot.loglinear[rows], boot.quadratic[rows],
                                  boot.argmax_rho[rows], boot.concave[rows], boot.interior[rows])
        heavy = bool(shares[int(np.argmax(sims.means[m]))] >= tau)
        if regime is Regime.REWARD_HEAVY:
            agree += heavy
        elif not heavy:
            ev = _trend_evidence(rho, rerun, _Coef(quad[m]), level, seeds_measured=True)
            agree += _TRENDS.index(ev.trend) == want
    return agree / n_runs


@dataclass(frozen=True)
class _Coef:
    """A fit's coefficients where the rule reads only ``.coef``."""

    coef: np.ndarray


@dataclass(frozen=True)
class ResponseVerdict:
    """The rule applied to replicate point scores that did not come from one grid's bootstrap
    (race.stats.forecast: predicted rewards at a full-run budget). Fields as in TargetVerdict."""

    regime: Regime
    trend: Regime
    rho_range: tuple[float, float]
    confidence: float
    best: int                       # index of the best point (highest point score)
    slope: float
    slope_ci: tuple[float, float]
    argmax_ci: tuple[float, float] | None
    support: Mapping[str, float]
    open_side: str | None = None    # as TargetVerdict.open_side (``open_side``)


def response_verdict(*, rho: Any, scores: Any, replicates: Any, reward_shares: Any, seeds_measured: bool,
                     tau: float = REWARD_SHARE_THRESHOLD, level: float = 0.9) -> ResponseVerdict:
    """Steps 1–3 of the rule on point scores ``scores``: (n_points,) at measured ``rho`` with their
    replicates ``replicates``: (n_boot, n_points); ``reward_shares``: C_reward / C_total per point
    (reward-heavy at the best point ≥ ``tau``). The same CI conditions, support gate, confidence
    (share of replicates agreeing) and ρ range as a pilot verdict; ``seeds_measured`` False holds
    the trend at inconclusive, as a grid without two seeds anywhere is held."""
    from race.stats.fit import response_of_means

    rho = np.asarray(rho, dtype=float)
    scores = np.asarray(scores, dtype=float)
    shares = np.asarray(reward_shares, dtype=float)
    boot = response_of_means(rho=rho, means=replicates)
    fits = compare_fits(rho=rho, y=scores)
    ev = _trend_evidence(rho, boot, fits["quadratic"], level, seeds_measured=seeds_measured)
    best = int(np.argmax(scores))
    regime = Regime.REWARD_HEAVY if shares[best] >= tau else ev.trend
    reward_reps = shares[boot.best_point] >= tau
    agree = reward_reps if regime is Regime.REWARD_HEAVY else ~reward_reps & (ev.replicates == _TRENDS.index(regime))
    chosen = {Regime.BALANCED: "quadratic", Regime.UPDATE_HEAVY: "loglinear",
              Regime.SEARCH_HEAVY: "loglinear"}.get(ev.trend)
    return ResponseVerdict(regime=regime, trend=ev.trend, rho_range=_rho_range(rho, boot, chosen, fits, best),
                           confidence=float(np.mean(agree)), best=best, slope=float(fits["loglinear"].coef[1]),
                           slope_ci=ev.slope_ci, argmax_ci=ev.argmax_ci, support=ev.support,
                           open_side=open_side(regime, best, rho.shape[0]))


def seed_scale(*, grid: GridScores, level: float) -> float:
    """t_df / z at the CI's quantile, df = Σ (n_seeds − 1): widens the seed part of the bootstrap.

    A bootstrap acts as if the seed SD were known; with 2 seeds × 5 points it is
    estimated on 5 degrees of freedom, and plain percentile CIs come out too narrow.
    """
    df = int(np.sum(grid.n_seeds - 1))
    if not SEED_DF_CORRECTION or df < 1:
        return 1.0
    q = (1 + level) / 2
    return t_quantile(q=q, df=df) / NormalDist().inv_cdf(q)


def ci_trends(*, slope_ci: tuple[float, float], curvature_ci: tuple[float, float],
              argmax_ci: tuple[float, float] | None, rho_min: float, rho_max: float) -> list[Regime]:
    """Trend verdicts whose CI condition holds, in the rule's order (steps 2–3).

    ``argmax_ci`` None: the point-estimate quadratic is not concave.
    """
    out = []
    if (curvature_ci[1] < 0 and argmax_ci is not None
            and rho_min < argmax_ci[0] and argmax_ci[1] < rho_max):
        out.append(Regime.BALANCED)
    if slope_ci[0] > 0:
        out.append(Regime.UPDATE_HEAVY)
    if slope_ci[1] < 0:
        out.append(Regime.SEARCH_HEAVY)
    return out


def replicate_trends(*, boot: BootstrapResponse, band: float) -> np.ndarray:
    """(n_boot,) trend class of each bootstrap replicate, as an index into ``_TRENDS``.

    One replicate has no CI, so it is classified by effect sizes against ``band``
    (REPLICATE_BAND_SE point-mean SEs): balanced if its quadratic peaks strictly
    inside the grid and that peak beats the better grid end by ≥ band; else
    update-/search-heavy if its log-linear change across the grid is ≥ band /
    ≤ −band; else inconclusive.
    """
    x_lo, x_hi = math.log(float(boot.rho.min())), math.log(float(boot.rho.max()))
    change = boot.slope * (x_hi - x_lo)
    q = boot.quadratic
    xs = np.stack([np.full(boot.n_boot, x_lo), np.full(boot.n_boot, x_hi), np.log(boot.argmax_rho)], axis=1)
    yq = q[:, :1] + q[:, 1:2] * xs + q[:, 2:3] * xs ** 2
    prominence = yq[:, 2] - np.maximum(yq[:, 0], yq[:, 1])
    out = np.full(boot.n_boot, _TRENDS.index(Regime.INCONCLUSIVE))
    out[change <= -band] = _TRENDS.index(Regime.SEARCH_HEAVY)
    out[change >= band] = _TRENDS.index(Regime.UPDATE_HEAVY)
    out[boot.interior & (prominence >= band)] = _TRENDS.index(Regime.BALANCED)
    return out


def _rho_range(rho: np.ndarray, boot: BootstrapResponse, chosen: str | None, fits: Mapping[str, Any],
               best: int) -> tuple[float, float]:
    """ρ region whose fitted reward is within RANGE_WITHIN_SE SEs of the fitted best.

    SE = bootstrap SD of the fitted value at the fitted best ρ. Without a chosen fit
    (inconclusive trend): the pilot-best point, out to halfway to its grid neighbours.
    """
    if chosen is None:
        lo = (rho[best - 1] + rho[best]) / 2 if best > 0 else rho[best]
        hi = (rho[best + 1] + rho[best]) / 2 if best < rho.shape[0] - 1 else rho[best]
        return float(lo), float(hi)
    dense = np.exp(np.linspace(math.log(rho.min()), math.log(rho.max()), _RANGE_STEPS))
    fit = fits[chosen]
    pred = fit.predict(rho=dense)
    top = int(np.argmax(pred))
    reps = boot.quadratic if chosen == "quadratic" else boot.loglinear
    x_top = math.log(dense[top])
    se = float(np.std(reps @ (x_top ** np.arange(reps.shape[1]))))
    inside = dense[pred >= pred[top] - RANGE_WITHIN_SE * se]
    return float(inside.min()), float(inside.max())


def seeds_needed(*, seed_sd: float, change: float, rho: np.ndarray, level: float,
                 power: float = SEED_ADVICE_POWER) -> int:
    """Seeds per grid point for a log-linear change of ``change`` across the grid to be called.

    Point means of n seeds have SD σ/√n, so SE(b) = σ / √(n·Sxx), Sxx = Σ(x − x̄)², x = log ρ,
    b = change / (x_max − x_min). The rule calls a trend when b/SE(b) passes the larger of
    the CI bar z_{(1+level)/2} and the support gate's bar
    REPLICATE_BAND_SE·√((P−1)/P)·√Sxx/(x_max − x_min) + z_{MIN_SUPPORT} (the band is in
    contrast SEs, σ_pt·√((P−1)/P) for P points), both times the t_df / z widening with
    df = P·(n − 1). Smallest n with b/SE(b) ≥ that bar + z_power, capped at MAX_SEEDS_ADVICE.
    """
    x = np.log(np.asarray(rho, dtype=float))
    n_points, span = x.shape[0], float(x.max() - x.min())
    sxx = float(np.sum((x - x.mean()) ** 2))
    z = NormalDist().inv_cdf
    q = (1 + level) / 2
    gate = (REPLICATE_BAND_SE * math.sqrt((n_points - 1) / n_points * sxx) / span + z(MIN_SUPPORT)
            if 0 < MIN_SUPPORT < 1 else 0.0)
    bar = max(z(q), gate)
    for n in range(2, MAX_SEEDS_ADVICE):
        widen = t_quantile(q=q, df=n_points * (n - 1)) / z(q) if SEED_DF_CORRECTION else 1.0
        if abs(change) / span * math.sqrt(n * sxx) / seed_sd >= widen * bar + z(power):
            return n
    return MAX_SEEDS_ADVICE


PROXY_COST_RATIO = 4.0        # the proxy PRM the advice prices: this many times cheaper than the PRM


def feedback_advice(best: FlopBreakdown, *, regime: Regime) -> list[str]:
    """Numbers behind the reward-heavy advice, at the best point's FLOP breakdown:
    what a proxy PRM ``PROXY_COST_RATIO``× cheaper, or scoring half the rollouts, would free,
    and ρ without feedback, C_learning / (C_search + C_learning), the split a rule-based reward
    would measure for the same schedule."""
    if regime is not Regime.REWARD_HEAVY or best.total <= 0:
        return []
    share = best.reward / best.total
    proxy = share * (1 - 1 / PROXY_COST_RATIO)
    rho_rule = best.learning / (best.search + best.learning) if best.search + best.learning > 0 else 0.0
    return [f"feedback levers: a proxy PRM {PROXY_COST_RATIO:g}× cheaper frees {proxy:.0%} of the budget, scoring "
            f"half of the rollouts {share / 2:.0%}, for more rollouts or updates; without the feedback term this "
            f"schedule's ρ would be {rho_rule:.2f} (measured {best.rho:.2f})"]


def _warnings(grid: GridScores, *, regime: Regime, trend: Regime, best: int, share: float, tau: float,
              slope: float, level: float) -> list[str]:
    out: list[str] = []
    rho_best = float(grid.rho_targets[best])
    if regime is Regime.REWARD_HEAVY:
        out.append(f"reward evaluation takes {share:.0%} of the budget at the best point (≥ {tau:.0%}): "
                   f"cut feedback cost first (proxy PRM, or score fewer samples); trend underneath: "
                   f"{trend.value}")
    if best in (0, grid.n_points - 1):
        side = "lower" if best == 0 else "higher"
        nxt = edge_point("below" if best == 0 else "above", grid.rho_targets)   # one grid step past the edge
        hint = f", e.g. add ρ={nxt:.2f} (race pilot --extend 1 runs it and keeps these pilots)" if nxt else ""
        out.append(f"best at grid boundary (ρ={rho_best:g}): extend the grid to {side} ρ{hint}")
    if trend is Regime.INCONCLUSIVE:
        out.append(f"inconclusive: keeping the pilot-best point ρ={rho_best:g}; the range spans halfway "
                   "to its grid neighbours, not a fitted optimum")
        out.append(_noise_warning(grid, slope=slope, level=level))
    counts = grid.n_seeds
    top = max(int(counts.max()), MIN_SEEDS_PER_POINT)
    for n in sorted(set(int(c) for c in counts if c < top)):
        where = ", ".join(f"{t:g}" for t, c in zip(grid.rho_targets, counts) if c == n)
        why = "seed noise not measured there" if n < MIN_SEEDS_PER_POINT else f"others have up to {top}"
        out.append(f"only {n} seed{'s' if n > 1 else ''} at ρ={where} ({why})")
    return out


def _noise_warning(grid: GridScores, *, slope: float, level: float) -> str:
    sd = grid.seed_sd()
    if sd is None:
        return f"noise dominates: add seeds (≥ {MIN_SEEDS_PER_POINT} per point to measure seed noise)"
    if sd <= 0:   # seeds agree exactly (e.g. every pilot scores 0 on a hard task): no noise to beat
        return "no effect: the seeds agree exactly and the response is flat; add budget per pilot"
    x = np.log(grid.rho)
    change = max(abs(slope) * float(x.max() - x.min()), sd)   # floor: one seed SD across the grid
    n = seeds_needed(seed_sd=sd, change=change, rho=grid.rho, level=level)
    more = f"≥ {n}" if n >= MAX_SEEDS_ADVICE else f"≈ {n}"
    return (f"noise dominates: add seeds (seed SD ≈ {sd:.3f}; resolving a change of {change:.3f} "
            f"across the grid needs {more} seeds per point, now {int(grid.n_seeds.min())})")


def _fit_info(fits: Mapping[str, Any], grid: GridScores, ev: _Evidence, *, chosen: str | None,
              share: float, n_boot: int, level: float) -> dict[str, Any]:
    """JSON-ready record of the fits and evidence behind a verdict."""
    info: dict[str, Any] = {name: f.to_dict() for name, f in fits.items()}
    arg, concave, interior = quadratic_argmax(coef=fits["quadratic"].coef, rho_min=float(grid.rho.min()),
                                              rho_max=float(grid.rho.max()))
    info["quadratic"].update(concave=bool(concave), argmax_rho=float(arg), argmax_inside=bool(interior))
    score = {n: (f.aicc if f.aicc is not None else f.aic) for n, f in fits.items()}
    info.update(x="log(rho_measured)", rho_measured=[float(r) for r in grid.rho],
                best_by_aicc=min(score, key=lambda n: float(score[n])), chosen=chosen,
                trend_regime=ev.trend.value, curvature_ci=list(ev.curvature_ci), support=ev.support,
                reward_share_at_best=share, seed_sd=grid.seed_sd(), contrast_se=ev.contrast_se,
                seed_scale=seed_scale(grid=grid, level=level), n_boot=n_boot, confidence_level=level,
                seed_resampling=SEED_RESAMPLING)
    return info
