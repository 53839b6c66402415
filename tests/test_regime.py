"""classify(): synthetic pilot grids driven through fit → bootstrap → classify.

The synthetic data mimic the measured tiny-model grid (docs/regime.md): each
prompt has a difficulty (a logit); a pilot shifts every prompt's logit by its
grid point's effect plus a seed effect (SD ≈ 0.024 in accuracy); a prompt's
score is the mean of k = 4 Bernoulli samples. ``bench/regime_false_rate.py``
imports ``synthetic_results`` from here.
"""
from __future__ import annotations

import math
import random
from typing import Callable

import numpy as np
import pytest

from race.stats import regime
from race.core.records import FlopBreakdown, PilotResult, Regime, Schedule
from race.stats.regime import classify

GRID = (0.3, 0.45, 0.6, 0.72, 0.85)
SEED_SD = 0.024          # seed-to-seed SD measured on the tiny policy (race/config/presets.py)
FLOPS_PER_PILOT = 1.5e12


def synthetic_results(*, response: Callable[[float], float], n_seeds: int = 2, n_prompts: int = 300,
                      k: int = 4, seed_sd: float = SEED_SD, base: float = 0.45,
                      reward_fraction: float = 0.0, grid: tuple[float, ...] = GRID,
                      seed: int = 0, targets: tuple[str, ...] = ("reward",)) -> list[PilotResult]:
    """Pilots on ``grid`` × ``n_seeds`` whose mean accuracy is ≈ base + response(ρ) + seed noise.

    ``reward_fraction`` = C_reward / (C_search + C_reward): the feedback share of the
    non-update budget, so the reward share of C_total is reward_fraction · (1 − ρ).
    Measured ρ differs from the target by N(0, 0.003) (token counts vary).
    """
    rng = np.random.default_rng(seed)
    logits = rng.normal(math.log(base / (1 - base)), 1.2, size=n_prompts)   # prompt difficulty
    p0 = 1 / (1 + np.exp(-logits))
    slope = float(np.mean(p0 * (1 - p0)))           # d accuracy / d logit shift
    out = []
    for rho_t in grid:
        for s in range(n_seeds):
            shift = (response(rho_t) + rng.normal(0.0, seed_sd)) / slope
            p = 1 / (1 + np.exp(-(logits + shift)))
            evals = {t: tuple(rng.binomial(k, p) / k) for t in targets}
            rho = rho_t + rng.normal(0.0, 0.003)
            learning = rho * FLOPS_PER_PILOT
            rest = FLOPS_PER_PILOT - learning
            flops = FlopBreakdown(search=rest * (1 - reward_fraction), learning=learning,
                                  reward=rest * reward_fraction)
            out.append(PilotResult(rho_target=rho_t, seed=1000 + s, flops=flops, evals=evals))
    return out


RISING = lambda r: 0.15 * (r - 0.6)                       # noqa: E731  update-heavy
FALLING = lambda r: -0.15 * (r - 0.6)                     # noqa: E731  the measured grid
PEAKED = lambda r: -0.4 * (math.log(r) - math.log(0.58)) ** 2   # noqa: E731  interior optimum
FLAT = lambda r: 0.0                                      # noqa: E731


# ----------------------------------------------------------------------------- the five verdicts

@pytest.mark.parametrize("response, n_seeds, expected", [
    (RISING, 3, Regime.UPDATE_HEAVY),
    (FALLING, 2, Regime.SEARCH_HEAVY),
    (PEAKED, 3, Regime.BALANCED),
    (FLAT, 2, Regime.INCONCLUSIVE),
])
def test_trend_verdicts(response, n_seeds, expected):
    results = synthetic_results(response=response, n_seeds=n_seeds, n_prompts=400, seed=7)
    diag = classify(results, n_boot=300)
    v = diag.primary
    assert diag.regime is expected, (v.slope_ci, v.argmax_ci, v.fits["curvature_ci"])
    assert 0.0 <= v.confidence <= 1.0
    lo, hi = v.rho_range
    assert min(GRID) - 0.02 <= lo <= hi <= max(GRID) + 0.02
    if expected is Regime.UPDATE_HEAVY:
        assert v.slope_ci[0] > 0 and v.confidence > 0.5 and hi > 0.8
        assert any("extend the grid to higher ρ" in w for w in v.warnings)
    if expected is Regime.SEARCH_HEAVY:
        assert v.slope_ci[1] < 0 and v.confidence > 0.5 and lo < 0.32
        assert any("extend the grid to lower ρ, e.g. add ρ=0.20 " in w for w in v.warnings)   # 0.3 · 0.3 / 0.45
    if expected is Regime.BALANCED:
        assert v.argmax_ci is not None and 0.3 < v.argmax_ci[0] < 0.58 < v.argmax_ci[1] < 0.85
        assert lo < 0.58 < hi and v.fits["chosen"] == "quadratic"
    if expected is Regime.INCONCLUSIVE:
        assert v.slope_ci[0] <= 0 <= v.slope_ci[1]
        assert any(w.startswith("noise dominates: add seeds") for w in v.warnings)
        best = [p.rho_measured for p in v.points if p.rho_target == v.best_rho][0]
        assert lo <= best <= hi


def test_reward_heavy_keeps_the_trend():
    # PRM feedback: half of the non-update budget goes to scoring; reward falls with ρ.
    results = synthetic_results(response=FALLING, n_seeds=2, reward_fraction=0.5, seed=3)
    v = classify(results, n_boot=300).primary
    assert v.regime is Regime.REWARD_HEAVY
    assert v.best_rho == 0.3 and v.fits["reward_share_at_best"] == pytest.approx(0.35, abs=0.01)
    assert v.fits["trend_regime"] == "search-heavy" and v.slope_ci[1] < 0
    assert v.confidence > 0.5 and v.rho_range[0] < 0.32
    assert any("proxy PRM" in w for w in v.warnings)


def test_reward_share_below_threshold_is_not_reward_heavy():
    results = synthetic_results(response=FALLING, n_seeds=2, reward_fraction=0.2, seed=3)  # 14 % at ρ=0.3
    assert classify(results, n_boot=200).regime is Regime.SEARCH_HEAVY
    assert classify(results, n_boot=200, reward_share_threshold=0.1).regime is Regime.REWARD_HEAVY


# ----------------------------------------------------------------------------- determinism

def test_same_seed_same_diagnosis_and_order_free():
    results = synthetic_results(response=FALLING, n_seeds=3, seed=11, targets=("reward", "pass@1"))
    a = classify(results, n_boot=200, seed=5)
    shuffled = list(results)
    random.Random(0).shuffle(shuffled)
    b = classify(shuffled, n_boot=200, seed=5)
    assert a.to_dict() == b.to_dict()
    assert a.to_dict() == classify(results, n_boot=200, seed=5).to_dict()
    assert classify(results, n_boot=200, seed=6).primary.slope_ci != a.primary.slope_ci


def test_failed_pilots_are_ignored_and_reported():
    results = synthetic_results(response=FALLING, n_seeds=2, seed=2)
    failed = PilotResult(rho_target=0.45, seed=99, flops=FlopBreakdown(), evals={}, status="failed")
    diag = classify(results + [failed], n_boot=200)
    assert diag.to_dict()["verdicts"] == classify(results, n_boot=200).to_dict()["verdicts"]
    assert any("not complete" in w for w in diag.warnings)


# ----------------------------------------------------------------------------- records and warnings

def test_points_fits_and_json_ready():
    import json

    results = synthetic_results(response=RISING, n_seeds=2, seed=4)
    sched = Schedule(0.3, 8, 8, 4, 1, 10, 1e-3, 8, FlopBreakdown(1, 1, 0), FlopBreakdown(10, 10, 0))
    results[0] = PilotResult(rho_target=results[0].rho_target, seed=results[0].seed, flops=results[0].flops,
                             evals=results[0].evals, schedule=sched)
    diag = classify(results, n_boot=200, meta={"model": "tiny"})
    v = diag.primary
    assert [p.rho_target for p in v.points] == list(GRID) and all(p.n_seeds == 2 for p in v.points)
    assert v.points[0].schedule == sched and v.points[1].schedule is None
    for p in v.points:
        assert p.reward_ci[0] <= p.reward_mean <= p.reward_ci[1]
        assert p.flops.rho == pytest.approx(p.rho_measured, abs=1e-3)
    assert set(v.fits) >= {"constant", "loglinear", "quadratic", "best_by_aicc", "chosen", "seed_sd"}
    assert v.fits["loglinear"]["coef"][1] == v.slope
    assert diag.meta["model"] == "tiny" and diag.meta["classify"]["n_boot"] == 200
    text = json.dumps(diag.to_dict(), allow_nan=False)
    assert type(diag).from_dict(json.loads(text)).to_dict() == diag.to_dict()


def test_only_n_seeds_warning():
    results = synthetic_results(response=RISING, n_seeds=3, seed=4)
    results = [r for r in results if not (r.rho_target == 0.6 and r.seed == 1002)]
    results = [r for r in results if not (r.rho_target == 0.72 and r.seed != 1000)]
    w = classify(results, n_boot=200).primary.warnings
    assert "only 1 seed at ρ=0.72 (seed noise not measured there)" in w
    assert "only 2 seeds at ρ=0.6 (others have up to 3)" in w


def test_targets_disagree():
    up = synthetic_results(response=RISING, n_seeds=3, seed=8)
    down = synthetic_results(response=FALLING, n_seeds=3, seed=9)
    merged = [PilotResult(rho_target=u.rho_target, seed=u.seed, flops=u.flops,
                          evals={"reward": u.evals["reward"], "pass@1": d.evals["reward"]})
              for u, d in zip(up, down)]
    diag = classify(merged, n_boot=200)
    assert list(diag.verdicts) == ["reward", "pass@1"]
    assert diag.verdicts["pass@1"].regime is Regime.SEARCH_HEAVY and diag.regime is Regime.UPDATE_HEAVY
    assert "targets disagree: reward → update-heavy, pass@1 → search-heavy" in diag.warnings
    only = classify(merged, targets=["pass@1"], primary_target="pass@1", n_boot=200)
    assert list(only.verdicts) == ["pass@1"] and not only.warnings


def test_seeds_needed_formula():
    # σ = 0.024, grid-wide change 0.0825 (slope −0.15 per unit ρ on 0.3…0.85): a few seeds suffice;
    # halving the effect needs 4× the seeds.
    rho = np.array(GRID)
    n = regime.seeds_needed(seed_sd=0.024, change=0.0825, rho=rho, level=0.9)
    assert 2 <= n <= 3
    assert regime.seeds_needed(seed_sd=0.024, change=0.02, rho=rho, level=0.9) >= 4 * n - 4
    assert regime.seeds_needed(seed_sd=0.024, change=1e-6, rho=rho, level=0.9) == regime.MAX_SEEDS_ADVICE


def test_unreplicated_grid_is_held_at_inconclusive():
    # One seed per point: seed noise is not measured, so even a clear fall is not called.
    results = synthetic_results(response=FALLING, n_seeds=1, n_prompts=500, seed=5)
    v = classify(results, n_boot=200).primary
    assert v.regime is Regime.INCONCLUSIVE and v.fits["seed_sd"] is None
    assert "noise dominates: add seeds (≥ 2 per point to measure seed noise)" in v.warnings
    assert any(w.startswith("only 1 seed at ρ=0.3, 0.45, 0.6, 0.72, 0.85") for w in v.warnings)


def test_seed_scale_is_t_over_z():
    g = classify(synthetic_results(response=FLAT, n_seeds=2, n_prompts=50), n_boot=50).primary
    assert g.fits["seed_scale"] == pytest.approx(2.015 / 1.645, abs=0.005)   # df = 5 × (2 − 1)
    g3 = classify(synthetic_results(response=FLAT, n_seeds=3, n_prompts=50), n_boot=50).primary
    assert g3.fits["seed_scale"] == pytest.approx(1.812 / 1.645, abs=0.005)  # df = 10


# ----------------------------------------------------------------------------- errors

def test_errors_name_the_bad_value():
    results = synthetic_results(response=FLAT, n_seeds=2, n_prompts=50)
    with pytest.raises(ValueError, match=r"no complete results.*'failed'"):
        classify([PilotResult(0.3, 0, FlopBreakdown(), {}, status="failed")])
    with pytest.raises(ValueError, match=r"2 grid points .*expected ≥ 3"):
        classify([r for r in results if r.rho_target in (0.3, 0.6)])
    with pytest.raises(ValueError, match=r"target 'pass@1' is missing from pilot"):
        classify(results, targets=["reward", "pass@1"])
    with pytest.raises(ValueError, match=r"primary_target 'judge' is not reported"):
        classify(results, primary_target="judge")
    short = PilotResult(0.45, 77, results[0].flops, {"reward": (1.0, 0.0)})
    with pytest.raises(ValueError, match=r"prompt counts \[2, 50\]"):
        classify(results + [short])
    with pytest.raises(ValueError, match=r"repeats the complete pilot ρ=0.3 seed 1000 of results\[0\]"):
        classify(results + [results[0]])


# ----------------------------------------------------------------------------- false verdicts on noise

def false_verdict_rate(*, repeats: int = 50, n_seeds: int = 2, seed_sd: float = SEED_SD,
                       n_prompts: int = 300, n_boot: int = 1000) -> float:
    """Share of flat-response grids classified search-, update-heavy or balanced."""
    wrong = 0
    for rep in range(repeats):
        results = synthetic_results(response=FLAT, n_seeds=n_seeds, seed_sd=seed_sd,
                                    n_prompts=n_prompts, seed=10_000 + rep)
        # the regime only: the stated confidence (the rerun simulation) does not change it
        wrong += classify(results, n_boot=n_boot, seed=rep, rerun_confidence=False).regime is not Regime.INCONCLUSIVE
    return wrong / repeats


def test_false_verdict_rate_on_flat_noise():
    # Production defaults (n_boot=1000, confidence 0.9), 2 seeds (the worst case), 50 repeats; its time is
    # bench/regime_false_rate.py's to measure, not this test's.
    rate = false_verdict_rate(repeats=50, n_seeds=2)
    assert rate <= 0.10, rate


def test_reward_heavy_targets_whose_trends_disagree_are_flagged():
    """Both targets are reward-heavy (feedback ≥ 20 % of the budget), but one rises with ρ and
    the other falls: the note names the trends underneath; the advice prices the levers."""
    grid = (0.2, 0.3, 0.45, 0.6)
    up = synthetic_results(response=lambda r: 0.5 * (r - 0.4), n_seeds=3, seed=5, reward_fraction=0.9, grid=grid)
    down = synthetic_results(response=lambda r: -0.5 * (r - 0.4), n_seeds=3, seed=6, reward_fraction=0.9,
                             grid=grid)
    merged = [PilotResult(rho_target=u.rho_target, seed=u.seed, flops=u.flops,
                          evals={"reward": u.evals["reward"], "final-answer": d.evals["reward"]})
              for u, d in zip(up, down)]
    diag = classify(merged, n_boot=300)
    assert {v.regime for v in diag.verdicts.values()} == {Regime.REWARD_HEAVY}
    trend = diag.verdicts["final-answer"].fits["trend_regime"]
    assert trend in ("search-heavy", "balanced")
    assert f"trends under the feedback cost disagree: reward → update-heavy, final-answer → {trend}" in diag.warnings
    assert any(w.startswith("feedback levers: a proxy PRM 4× cheaper frees") for w in diag.primary.warnings)


def test_seeds_that_agree_exactly_do_not_crash_the_noise_advice():
    """Every pilot scoring 0 (a hard task at a small budget): inconclusive, no division by zero."""
    from race.core.records import FlopBreakdown, PilotResult
    from race.stats.regime import classify

    pilots = [PilotResult(rho, seed, FlopBreakdown(1e12 * (1 - rho), 1e12 * rho), {"reward": (0.0,) * 50})
              for rho in (0.45, 0.6, 0.73) for seed in range(2)]
    d = classify(pilots, n_boot=100)
    assert d.regime.value == "inconclusive"
    assert any("seeds agree exactly" in w for w in d.primary.warnings)


def test_point_summaries_carry_mean_wall_seconds_per_phase():
    """Each grid point's seconds are the mean over its seeds, phase by phase (a phase one seed
    lacks counts as 0 for it); the verdict itself does not depend on them."""
    from dataclasses import replace

    pilots = synthetic_results(response=FALLING, n_seeds=2, seed=4)
    timed = [replace(p, wall_seconds={"rollout": 10.0 * p.rho_target + (p.seed - 1000), "update": 4.0,
                                      **({"sync": 2.0} if p.seed == 1000 else {})}) for p in pilots]
    d, plain = classify(timed), classify(pilots)
    for point in d.primary.points:
        assert point.seconds == pytest.approx({"rollout": 10.0 * point.rho_target + 0.5, "update": 4.0, "sync": 1.0})
        assert point.budget_seconds == pytest.approx(10.0 * point.rho_target + 5.5)
    assert d.primary.regime is plain.primary.regime and d.primary.rho_range == plain.primary.rho_range


def test_a_training_reward_that_never_moved_is_flagged():
    from dataclasses import replace

    pilots = synthetic_results(response=FALLING, n_seeds=2, seed=5)
    flat = [replace(p, curve=((1e9, 0.0), (2e9, 0.0))) for p in pilots]
    assert any("training reward was 0 at every step of every pilot" in w for w in classify(flat).warnings)
    moving = [replace(p, curve=((1e9, 0.0), (2e9, 0.1 * (p.seed % 2)))) for p in pilots]
    assert not any("training reward" in w for w in classify(moving).warnings)
    assert not any("training reward" in w for w in classify(pilots).warnings)     # no curves recorded


@pytest.mark.parametrize("response, n_seeds, reward_fraction", [(FALLING, 2, 0.0), (PEAKED, 3, 0.0),
                                                                 (FALLING, 2, 0.5)])
def test_response_verdict_on_a_grids_own_replicates_is_its_verdict(response, n_seeds, reward_fraction):
    """race.stats.forecast classifies predicted scores with response_verdict: fed a grid's own point
    means and bootstrap replicates it returns that grid's regime, range, bootstrap share and slope CI
    (its confidence is the replicates' share: no rerun is simulated at F)."""
    from race.stats.fit import bootstrap_response

    results = synthetic_results(response=response, n_seeds=n_seeds, reward_fraction=reward_fraction, seed=3)
    v = classify(results, n_boot=300).primary
    grid = regime._grid(sorted(results, key=lambda r: (r.rho_target, r.seed)), "reward")
    boot = bootstrap_response(grid=grid, n_boot=300, seed=0, seed_resampling=regime.SEED_RESAMPLING,
                              seed_scale=regime.seed_scale(grid=grid, level=0.9))
    got = regime.response_verdict(rho=grid.rho, scores=grid.point_means, replicates=boot.point_means,
                                  reward_shares=[p.flops.shares()["reward"] for p in v.points],
                                  seeds_measured=True, level=0.9)
    assert got.regime is v.regime and got.rho_range == pytest.approx(v.rho_range)
    assert got.confidence == pytest.approx(v.fits["bootstrap_share"]) and got.slope_ci == pytest.approx(v.slope_ci)
    assert float(grid.rho_targets[got.best]) == v.best_rho and got.open_side == v.open_side
    held = regime.response_verdict(rho=grid.rho, scores=grid.point_means, replicates=boot.point_means,
                                   reward_shares=[0.0] * len(v.points), seeds_measured=False)
    assert held.trend is Regime.INCONCLUSIVE


# ----------------------------------------------------------------------------- a range open at a grid edge

def test_an_edge_verdict_opens_its_range_past_the_grid():
    # falling reward: search-heavy with the best at the grid's lowest ρ → "ρ ≤ top", run at that edge
    v = classify(synthetic_results(response=FALLING, n_seeds=2, n_prompts=400, seed=7), n_boot=300).primary
    assert v.regime is Regime.SEARCH_HEAVY and v.best_rho == min(GRID)
    assert v.open_side == "below" and v.bounds == (0.0, v.rho_range[1])
    # the one ρ to run: the edge point, in measured ρ as the range is
    assert v.recommended_rho == v.points[0].rho_measured and abs(v.recommended_rho - min(GRID)) < 0.01
    assert v.contains(0.1) and not v.contains(v.rho_range[1] + 0.01)
    assert v.range_text() == f"ρ ≤ {v.rho_range[1]:.2f}"
    # rising reward: the update-heavy mirror
    up = classify(synthetic_results(response=RISING, n_seeds=3, n_prompts=400, seed=7), n_boot=300).primary
    assert up.regime is Regime.UPDATE_HEAVY and up.best_rho == max(GRID) and up.open_side == "above"
    assert up.bounds == (up.rho_range[0], 1.0) and up.range_text() == f"ρ ≥ {up.rho_range[0]:.2f}"
    # an interior optimum keeps its closed range and centre
    mid = classify(synthetic_results(response=PEAKED, n_seeds=3, n_prompts=400, seed=7), n_boot=300).primary
    assert mid.open_side is None and mid.recommended_rho == pytest.approx(sum(mid.rho_range) / 2)
    assert mid.range_text() == f"[{mid.rho_range[0]:.2f}, {mid.rho_range[1]:.2f}]"


@pytest.mark.parametrize("regime_, best, n, expected", [
    (Regime.SEARCH_HEAVY, 0, 5, "below"), (Regime.SEARCH_HEAVY, 1, 5, None),
    (Regime.UPDATE_HEAVY, 4, 5, "above"), (Regime.UPDATE_HEAVY, 0, 5, None),
    (Regime.BALANCED, 0, 5, None), (Regime.INCONCLUSIVE, 0, 5, None), (Regime.REWARD_HEAVY, 0, 5, None),
])
def test_open_side_rule(regime_, best, n, expected):
    assert regime.open_side(regime_, best, n) == expected


def test_open_side_round_trips_and_old_files_read_closed():
    from race.core.records import Diagnosis, TargetVerdict

    diag = classify(synthetic_results(response=FALLING, n_seeds=2, seed=7), n_boot=200)
    d = diag.to_dict()
    assert d["open_side"] == "below" and d["recommended_rho"] == diag.primary.points[0].rho_measured
    assert Diagnosis.from_dict(d).primary.open_side == "below"
    old = dict(d["verdicts"]["reward"])
    del old["open_side"], old["recommended_rho"]              # a file written before the rule
    assert TargetVerdict.from_dict(old).open_side is None
    with pytest.raises(ValueError, match="open_side 'left'"):
        TargetVerdict.from_dict({**old, "open_side": "left"})
    assert "recommended ρ ≤" in diag.summary()
