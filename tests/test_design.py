"""race.stats.design: the population prior (tied to the committed validation data), the signal check
(by hand, and on every grid of rounds 1–2 that learned nothing for want of signal), the shrinkage
toward the prior, and pilots sized within a share of the full run."""
import gzip
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

from race.stats import design as D

ROOT = Path(__file__).resolve().parents[1]


def test_p_star_and_the_signal_share_by_hand():
    assert D.p_star(8) == pytest.approx(0.0830, abs=1e-4)      # Aphale & Liu's p*(8) ≈ 0.083
    assert D.p_star(16) == pytest.approx(1 - 2 ** (-1 / 16))
    p = 0.31
    assert D.signal_share(p, 8) == pytest.approx(1 - 0.31 ** 8 - 0.69 ** 8)
    # at p*(g) half the groups hold a reward that varies (up to the negligible pᵍ term)
    assert D.signal_share(D.p_star(8), 8) == pytest.approx(0.5, abs=1e-6)


@pytest.mark.parametrize("p, status", [(0.007, "too hard"), (0.053, "too hard"), (0.31, "ok"), (0.41, "ok"),
                                       (0.833, "ok"), (0.99, "saturated")])
def test_signal_names_the_grids_that_learned_nothing_for_want_of_signal(p, status):
    """Base pass rates of rounds 1–2 (docs/pilot.md): hard 0.007 and small / small-reserve 0.053 learned
    nothing; every other setting (0.31 … 0.833) learned. A saturated reward is named too."""
    s = D.signal(p, 8)
    assert s.status == status
    assert (s.line is None) == (status == "ok")
    if status == "too hard":
        assert "learn nothing" in s.line and "n_train" in s.line
        assert "a group of" in s.line and "rollouts per prompt (schedule.n_train)" in s.line


def test_shrinkage_to_the_prior_by_hand():
    none = D.shrink_to_prior(None, None)             # no pilots: the prior alone, its range the observed spread
    assert (none.rho, none.weight, none.sd) == (0.46, 0.0, 0.136)
    assert (none.low, none.high) == pytest.approx((0.46 - 1.6449 * 0.136, 0.46 + 1.6449 * 0.136))
    assert "the prior alone" in none.line() and "[0.24, 0.68]" in none.line()
    # τ = 0.112, σ = 0.1: w = 0.012544 / 0.022544 = 0.55642, ρ = 0.46 + 0.55642 · 0.24, SD = √w · 0.1
    s = D.shrink_to_prior(0.7, 0.1)
    assert s.weight == pytest.approx(0.556423, abs=1e-6)
    assert s.rho == pytest.approx(0.593542, abs=1e-6)
    assert s.sd == pytest.approx(0.074594, abs=1e-6)
    assert (s.low, s.high) == pytest.approx((0.593542 - 1.6449 * 0.074594, 0.593542 + 1.6449 * 0.074594), abs=1e-6)
    assert "weight 0.56 on the pilots" in s.line() and s.to_dict()["rho_range"] == [s.low, s.high]
    # a pilot far more precise than the prior stays at its own ρ; exact evidence: the prior gives way entirely
    tiny = D.shrink_to_prior(0.7, 1e-4)
    assert tiny.weight == pytest.approx(1 - 1e-8 / 0.012544, abs=1e-12) and tiny.rho == pytest.approx(0.7, abs=1e-6)
    assert D.shrink_to_prior(0.7, 0.0).rho == 0.7
    # a pilot as uncertain as the prior (σ = τ) lands half way
    assert D.shrink_to_prior(0.7, 0.112).rho == pytest.approx(0.58)
    with pytest.raises(D.DesignError, match="own_rho"):
        D.shrink_to_prior(1.5, 0.1)


def _pilot(rho_target: float, rho: float, score: float):
    from race.core.records import PilotResult

    flops = {"search": (1 - rho) * 100.0, "learning": rho * 100.0, "reward": 0.0}
    return PilotResult.from_dict({"rho_target": rho_target, "seed": 0, "rho": rho, "flops": flops,
                                  "evals": {"reward": [score] * 4}, "schedule": None, "curve": [], "wall_seconds": {},
                                  "status": "complete", "extra": {}, "checkpoints": []})


def test_the_seed_variance_of_the_best_rho_by_hand():
    # 0.6 wins every resample: no sampling variance, the floor (step / 2)² / 3 with a step of 0.2
    sure = [_pilot(0.4, 0.4, s) for s in (0.1, 0.1, 0.1)] + [_pilot(0.6, 0.6, s) for s in (0.5, 0.5, 0.5)]
    assert D.seed_var_of_best(sure) == pytest.approx(0.1 ** 2 / 3)
    # 0.6's seeds score 0.9, 0.3, 0.3 against 0.4's steady 0.6: a resample puts 0.6 ahead when it draws 0.9 at
    # least twice, p = 7/27, so the best ρ is a two-point draw 0.2 apart: variance p (1 − p) 0.2² = 0.00768
    split = [_pilot(0.4, 0.4, 0.6) for _ in range(3)] + [_pilot(0.6, 0.6, s) for s in (0.9, 0.3, 0.3)]
    assert D.seed_var_of_best(split, n_boot=20000) == pytest.approx(7 / 27 * 20 / 27 * 0.04, abs=4e-4)
    with pytest.raises(D.DesignError, match="no complete pilot"):
        D.seed_var_of_best(sure, "pass@1")


def test_the_prior_start_adds_the_drift_move_to_the_seed_variance():
    sure = [_pilot(0.4, 0.4, s) for s in (0.1, 0.1, 0.1)] + [_pilot(0.6, 0.6, s) for s in (0.5, 0.5, 0.5)]
    at_f = {"recommended_rho": 0.55, "shift_ci": [-0.2, 0.0]}          # a move of SD 0.1 / 1.6449
    sigma2 = 0.1 ** 2 / 3 + (0.1 / 1.6449) ** 2                         # 0.003333 + 0.003696 = 0.007029
    w = 0.112 ** 2 / (0.112 ** 2 + sigma2)                              # 0.6409
    s = D.prior_start(sure, at_f)
    assert s.weight == pytest.approx(w) and w == pytest.approx(0.6409, abs=1e-4)
    assert s.rho == pytest.approx(0.46 + w * 0.09) and s.own_sd == pytest.approx(math.sqrt(sigma2))
    assert D.prior_start(sure, None) == D.shrink_to_prior(None, None)   # no range at F: the prior alone
    with pytest.raises(D.DesignError, match=r"range_at_f .* must be a range at F record .*not a refusal"):
        D.prior_start(sure, {"refused": "past the 1000 ×"})
    with pytest.raises(D.DesignError, match=r"pilots\[0\] 'x' must be a race.core.records.PilotResult"):
        D.seed_var_of_best(["x"])


def test_a_verdict_at_f_states_the_prior_start_beside_its_range():
    """race pilot / race report / race.diagnose with --full-run F: the range at F and, beside it, the prior start
    (the committed tiny steps-sparse results at 30 × B)."""
    from race.stats.forecast import with_forecast
    from race.stats.report import forecast_lines
    from race.stats.results import load_results

    d = with_forecast(load_results(str(ROOT / "docs" / "runs" / "tiny-steps-sparse.results.json")), full_run_budget=9e12)
    rec = d.forecast.range_at_budget
    start = rec["prior_start"]
    assert start["own_rho"] == rec["recommended_rho"] and round(rec["recommended_rho"], 2) == 0.51
    assert start["weight"] == pytest.approx(0.112 ** 2 / (0.112 ** 2 + start["own_sd"] ** 2))
    assert start["rho"] == pytest.approx(0.46 + start["weight"] * (start["own_rho"] - 0.46))
    assert round(start["weight"], 2) == 0.60 and round(start["rho"], 2) == 0.49
    lines = forecast_lines(d.forecast)
    assert lines[0].startswith("range at F = 9e+12") and lines[1] == start["line"]
    assert lines[1].startswith("prior start: ρ 0.49, 90% range [0.37, 0.60]")


def test_a_share_of_the_full_run_counts_evaluation_and_refuses_what_buys_nothing():
    # evaluation costs a pilot the same FLOPs whatever its budget: it comes off each pilot's slice of the share
    plan = D.plan_share(6e12, pilots=12, share=0.1, eval_flops=2e9)
    assert plan.budget == pytest.approx(0.1 * 6e12 / 12 - 2e9)
    assert plan.eval_share == pytest.approx(2e9 / plan.budget)
    assert plan.spent == pytest.approx(0.1 * 6e12)
    with pytest.raises(D.DesignError, match="buy nothing"):
        D.plan_share(6e12, pilots=12, share=0.1, eval_flops=6e10)     # evaluation eats the whole slice
    assert plan.factor == pytest.approx(6e12 / plan.budget)
    with pytest.raises(D.DesignError, match="buy nothing"):
        D.plan_share(1e11, pilots=12, share=0.1, min_budget=5e10)
    with pytest.raises(D.DesignError, match="extrapolates"):
        D.plan_share(1e15, pilots=12, share=0.01, max_factor=1000)
    for bad in (dict(share=0), dict(share=1.5), dict(share=True), dict(pilots=0)):
        with pytest.raises(D.DesignError):
            D.plan_share(1e12, **{"pilots": 4, **bad})


def _best_measured_rho(path: Path) -> tuple[float, float]:
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation as V

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rec = json.load(fh)
    means = V.point_means(rec)
    best = max(means, key=lambda r: statistics.mean(means[r]))
    return V.measured_rho(rec)[best], statistics.mean(means[best])


def test_the_population_prior_is_the_committed_data():
    """POPULATION_RHO / _SD / _GRIDS recomputed from rounds 1–2's committed 10 × B grids: the best point
    by mean final held-out reward, its measured ρ; grids that learned nothing (best mean < 0.05: `hard`)
    or where every run collapsed (`lr-x3`, `lr-x3-cosine`) left out."""
    skip = {"hard", "lr-x3", "lr-x3-cosine"}
    paths = sorted((ROOT / "research/validation/runs").glob("*/full10.json.gz")) + sorted(
        (ROOT / "research/validation/round2/runs").glob("*/full10.json.gz"))
    rhos = [_best_measured_rho(p)[0] for p in paths if p.parent.name not in skip]
    assert len(rhos) == D.POPULATION_GRIDS
    assert round(statistics.median(rhos), 2) == D.POPULATION_RHO
    assert round(statistics.stdev(rhos), 3) == D.POPULATION_RHO_SD


def test_the_pilot_value_prices_a_share_in_pooled_ses():
    v = D.pilot_value(0.1)
    assert v.cost == pytest.approx(D.SE_PER_DOUBLING * math.log2(1 / 0.9))
    assert v.best_case == pytest.approx(D.PRIOR_REGRET - v.cost)
    assert D.pilot_value(0.1).pays and not D.pilot_value(0.2).pays
    assert "would not pay for themselves" in D.pilot_value(0.2).line()
    assert D.pilot_value(0.0).cost == 0.0


def test_the_design_constants_are_the_replays_tables():
    """PRIOR_REGRET, FLAT_GRID_REGRET and SE_PER_DOUBLING are what docs/pilot.md's replay tables print
    (those tables are regenerated from the committed data by tests/test_replay.py)."""
    doc = (ROOT / "docs" / "pilot.md").read_text(encoding="utf-8")
    assert f"| prior alone (no pilots) | 0.00; 0.00 | 19/24 | 0.46 | {D.PRIOR_REGRET:.2f};" in doc
    assert f"| flat grid: 4 ρ × 3 seeds at B | 1.00; 1.20 | 21/24 | 0.29 | {D.FLAT_GRID_REGRET:.2f};" in doc
    assert f"Median over 23 grids: {D.SE_PER_DOUBLING:.2f} pooled SEs per doubling" in doc


def test_race_plan_states_the_share_and_refuses_one_that_buys_nothing():
    from click.testing import CliRunner

    from race.run.cli import main

    cfg = str(ROOT / "pilots" / "tiny-steps-sparse.yaml")
    out = CliRunner().invoke(main, ["plan", cfg, "--full-run", "6e13", "--json"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)["full_run"]
    fit = info["within_share"]
    assert fit["pilots"] == 12 and fit["spent"] == pytest.approx(0.1 * 6e13)
    assert fit["budget"] == pytest.approx(0.1 * 6e13 / (12 * (1 + fit["eval_share"])))
    assert info["grid_factor"] == pytest.approx(6e13 / 3e11)
    text = CliRunner().invoke(main, ["plan", cfg, "--full-run", "6e13", "--share", "0.2"]).output
    assert "within a 20% share" in text and "What pilots can buy" in text and "not pay for themselves" in text
    fit = CliRunner().invoke(main, ["plan", cfg, "--full-run", "6e12"])        # the default design: fit
    assert fit.exit_code == 0 and "design fit: no pilots" in fit.output and "run at the prior ρ 0.46" in fit.output
    bad = CliRunner().invoke(main, ["plan", cfg, "--full-run", "6e12", "--design", "flat"])
    assert bad.exit_code == 2 and "buy nothing" in bad.output and "Traceback" not in bad.output
    odd = CliRunner().invoke(main, ["plan", cfg, "--full-run", "6e12", "--design", "halvin"])
    assert odd.exit_code == 2 and ("pilot design 'halvin' is unknown: expected one of grid (the config as written), fit, "
                                   "flat, prior, halving") in odd.output
    assert CliRunner().invoke(main, ["plan", cfg, "--share", "0.1"]).exit_code == 2


def test_race_pilot_warns_before_any_pilot_when_the_base_pass_rate_gives_no_signal():
    """The coordinator's line after calibration (race.run.study.signal_line): it goes to stderr and the
    study's meta before the first pilot, and the report repeats it (race.stats.report: signal_warning)."""
    from race.run.study import signal_line
    assert "learn nothing" in signal_line(0.007, 8)
    assert signal_line(0.31, 8) is None
    assert signal_line(None, 8) is None and signal_line(0.0, 1) is None


def test_pilot_designs_spend_the_share_as_they_say():
    """race.stats.pilotdesign: flat is the grid or a refusal; fit falls back to one seed per point plus a
    second at the point nearest the prior, then to the points nearest the prior, then to no pilots; prior
    runs none. No plan spends more than its share or gives a pilot less than the minimum."""
    from race.stats import pilotdesign as PD

    grid, F = [0.25, 0.4, 0.55, 0.7], 6e12
    kw = dict(full_run=F, min_budget=1.87e11, eval_flops=1.1e11)
    flat = PD.DESIGNS["flat"].plan(grid, 3, share=0.9, **kw)
    assert len(flat.pilots) == 12 and flat.spent == pytest.approx(0.9 * F)
    with pytest.raises(D.DesignError, match="buy nothing"):
        PD.DESIGNS["flat"].plan(grid, 3, share=0.1, **kw)
    # 30 %: 12 pilots get 1.5e11 − 1.1e11 = 4e10 < 1.87e11; 5 (one seed each, a second at 0.4, nearest 0.46) get
    # 3.6e11 − 1.1e11 = 2.5e11
    five = PD.DESIGNS["fit"].plan(grid, 3, share=0.3, **kw)
    assert five.pilots == ((0.25, 0), (0.4, 0), (0.55, 0), (0.7, 0), (0.4, 1)) and not five.dropped
    assert five.budget == pytest.approx(0.3 * F / 5 - 1.1e11) and five.spent == pytest.approx(0.3 * F)
    # 22 %: 5 pilots get 1.54e11, too few; 4 (the 3 points nearest the prior, 0.25 dropped) get 2.2e11
    four = PD.DESIGNS["fit"].plan(grid, 3, share=0.22, **kw)
    assert four.points == (0.4, 0.55, 0.7) and four.dropped == (0.25,) and len(four.pilots) == 4
    assert four.budget >= 1.87e11
    none = PD.DESIGNS["fit"].plan(grid, 3, share=0.1, **kw)
    assert none.pilots == () and none.spent == 0 and "run at the prior ρ 0.46" in none.line()
    assert PD.DESIGNS["fit"].plan(grid, 3, share=0.9, **kw).pilots == flat.pilots
    assert PD.DESIGNS["prior"].plan(grid, 3, share=0.5, **kw).pilots == ()
    assert list(PD.DESIGNS) == ["fit", "flat", "prior", "halving"]
    with pytest.raises(D.DesignError, match="pilot design 'x' is unknown"):
        PD.design_named("x")
    with pytest.raises(D.DesignError, match="share"):
        PD.DESIGNS["fit"].plan(grid, 3, share=1.5, **kw)


def test_fit_thins_held_out_evaluation_before_it_drops_pilots():
    """race.stats.pilotdesign.eval_cuts: 4 then 3 checkpoint evaluations of at most 100 prompts, the final pass
    kept, each costing the config's evaluation × its prompts over the config's; fit tries them at each number of
    pilots before it drops to fewer; the thinnest still gives the drift model its levels, the first the forecast's."""
    from race.config.configfile import EvalSettings
    from race.run.api import build_config
    from race.stats import pilotdesign as PD
    from race.stats.curvefit import MIN_PREFIX_POINTS

    cfg = build_config(None)                       # eval: 500 final prompts, 8 checkpoints of 100: 1300 prompts
    four, three = PD.eval_cuts(cfg, 1.3e11)
    assert (four.checkpoints, three.checkpoints) == ((0.0929, 0.1682, 0.552), (0.1682, 0.552))
    assert (four.flops, three.flops) == (pytest.approx(0.9e11), pytest.approx(0.8e11)) and four.as_configured == 1.3e11
    # the drift's own fit needs 2 budget levels (a fraction below 1 and the end); the forecast's backtest 3 below 1
    assert len(three.checkpoints) + 1 >= 2 and len(four.checkpoints) >= MIN_PREFIX_POINTS
    # 300 prompts at each of 8 checkpoints: cut to the replay's 100; already as thin, or off: no cut
    wide = cfg.with_overrides(eval=EvalSettings(prompts=500, checkpoint_prompts=300))
    assert [(c.checkpoint_prompts, c.flops) for c in PD.eval_cuts(wide, 2.9e11)] == [
        (100, pytest.approx(0.9e11)), (100, pytest.approx(0.8e11))]
    assert PD.eval_cuts(cfg.with_overrides(eval=EvalSettings(prompts=500, checkpoints=(0.17, 0.55))), 8e10) == ()
    assert PD.eval_cuts(cfg.with_overrides(eval=EvalSettings(prompts=500, checkpoints=0)), 5e10) == ()
    # fit: 12 pilots at 10 % of 6e12 get 5e10 less the evaluation; with 1.3e11 none fits, with the cuts neither;
    # at 30 %: 1.5e11 − 0.8e11 = 7e10 ≥ 6.5e10 for the whole grid with 3 checkpoint evaluations (4: 6e10, too few)
    grid, F, kw = [0.25, 0.4, 0.55, 0.7], 6e12, dict(min_budget=6.5e10, eval_flops=1.3e11, thinner=(four, three))
    p = PD.DESIGNS["fit"].plan(grid, 3, full_run=F, share=0.3, **kw)
    assert len(p.pilots) == 12 and p.eval_cut == three and p.budget == pytest.approx(7e10)
    assert p.spent == pytest.approx(0.3 * F) and p.to_dict()["eval"]["checkpoints"] == [0.1682, 0.552]
    assert PD.DesignPlan.from_dict(p.to_dict()) == p and "thinned to 3 checkpoint evaluations" in p.line()
    # without the cuts, the same share drops to 5 pilots: 3.6e11 − 1.3e11
    p5 = PD.DESIGNS["fit"].plan(grid, 3, full_run=F, share=0.3, min_budget=6.5e10, eval_flops=1.3e11)
    assert len(p5.pilots) == 5 and p5.eval_cut is None and p5.budget == pytest.approx(2.3e11)
    # a plan that fits as configured keeps the config's evaluation
    p9 = PD.DESIGNS["fit"].plan(grid, 3, full_run=F, share=0.9, **kw)
    assert p9.eval_cut is None and p9.to_dict()["eval"] is None and p9.eval_flops == 1.3e11
    # flat does not thin
    assert PD.DESIGNS["flat"].plan(grid, 3, full_run=F, share=0.9, **kw).eval_cut is None
