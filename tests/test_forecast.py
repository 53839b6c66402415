"""race/stats/forecast.py: reward against FLOPs per ρ from held-out checkpoints, the backtests that choose
the model and bound the extrapolation, the refusal, the prediction at the full-run budget, and where
it shows (reports, results.json, CLI, API, figure). Synthetic pilots, plus one stored tiny real grid
(tests/data/tiny-grid-2e10.json: `race pilot --budget 2e10 --seeds 2 --grid 0.5,0.62,0.74`,
reward target only)."""
from __future__ import annotations

import json
import math
import os
import random
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from race.stats import curvefit as CF
from race.stats import curves as CV
from race.stats import forecast as FC
from race.config.checkpoints import checkpoint_fractions
from race.run.cli import main
from race.core.records import Backtest, Checkpoint, Diagnosis, FlopBreakdown, PilotResult, Regime
from race.stats.regime import classify
from race.stats.report import render_diagnosis
from race.stats.results import Results, load_results, save_results

TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tiny-grid-2e10.json")
BUDGET = 1e12
R0 = 0.3
# ρ → (A, C_mid, B): the curves saturate inside the pilot budget, lower ρ higher
SIGMOIDS = {0.5: (0.8, 2e11, 1.2), 0.62: (0.75, 1.5e11, 1.2), 0.74: (0.65, 1e11, 1.2)}


def sigmoid(a, c_mid, b):
    return lambda c: R0 + (a - R0) / (1 + (c_mid / c) ** b)


def loglinear(b, c0=5e9):
    return lambda c: R0 + b * math.log(c / c0)


def synthetic_pilots(curves, *, budget=BUDGET, seeds=3, prompts=200, noise=0.02, seed=0, fractions=None):
    """Pilots whose checkpoint scores follow ``curves`` {ρ: f(C)}: per prompt f(C) plus a fixed,
    zero-mean prompt offset (SD 0.2) plus independent noise; the base (C = 0) scores R0."""
    rng = np.random.default_rng(seed)
    offsets = rng.normal(0, 0.2, prompts)
    offsets -= offsets.mean()
    fr = (0.0,) + (checkpoint_fractions(8) if fractions is None else fractions) + (1.0,)
    out = []
    for rho, f in curves.items():
        for s in range(seeds):
            cps = []
            for i, q in enumerate(fr):
                c = q * budget * (1 + 0.01 * rng.random()) if 0 < q < 1 else q * budget
                mean = f(c) if c > 0 else R0
                scores = mean + offsets + rng.normal(0, noise, prompts)
                cps.append(Checkpoint(q, i, FlopBreakdown(c * (1 - rho), c * rho), {"reward": tuple(scores.tolist())}))
            out.append(PilotResult(rho, s, FlopBreakdown(budget * (1 - rho), budget * rho),
                                   {"reward": cps[-1].evals["reward"]}, checkpoints=tuple(cps)))
    return out


def _fit(pilots, model):
    curves = CV.collect_curves([(pilots, BUDGET)], "reward")
    means = [g.mean for g in curves.groups]
    return CF.fit_surface(model, CV.fit_data(curves, means), float(CV.base_score(curves, means)), unit=curves.unit), curves


def _forecast(pilots, full, **kw):
    kw = {"target": "reward", "full_run_budget": full, "pilot_regime": Regime.SEARCH_HEAVY, "pilot_best_rho": 0.5,
          "n_boot": 60, **kw}
    return FC.forecast([(pilots, BUDGET)], **kw)


# ----------------------------------------------------------------------------- the models

def test_known_sigmoid_parameters_are_recovered():
    """Tolerance: A within 0.01, C_mid within 10 %, B within 0.1 (3 seeds × 200 prompts, noise
    SD 0.02 per prompt score, 8 checkpoints 1/64 … 1); one B for all ρ when they share it."""
    fit, curves = _fit(synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()}), "sigmoid")
    assert fit.model == "sigmoid" and fit.shared and fit.r0 == pytest.approx(R0, abs=0.002)
    for i, rho in enumerate(curves.points):
        got = fit.described(i, BUDGET)
        a, c_mid, b = SIGMOIDS[rho]
        assert got["A"] == pytest.approx(a, abs=0.01)
        assert got["c_mid"] == pytest.approx(c_mid, rel=0.1)
        assert got["B"] == pytest.approx(b, abs=0.1)
        np.testing.assert_allclose(CF.model_value("sigmoid", got, fit.r0, [1e11, 1e12, 1e13]),
                                   [sigmoid(a, c_mid, b)(c) for c in (1e11, 1e12, 1e13)], atol=0.01)


def test_slopes_the_data_tell_apart_get_one_b_per_rho():
    truth = {0.5: (0.8, 2e11, 0.7), 0.62: (0.75, 1.5e11, 1.5), 0.74: (0.65, 1e11, 3.0)}
    fit, curves = _fit(synthetic_pilots({r: sigmoid(*p) for r, p in truth.items()}, noise=0.01), "sigmoid")
    assert not fit.shared
    for i, rho in enumerate(curves.points):
        got = fit.described(i, BUDGET)
        assert got["A"] == pytest.approx(truth[rho][0], abs=0.01)
        assert got["B"] == pytest.approx(truth[rho][2], rel=0.15)


def test_loglinear_recovers_its_line_and_stored_params_are_in_flops():
    slopes = {0.5: 0.04, 0.62: 0.03, 0.74: 0.02}
    fit, curves = _fit(synthetic_pilots({r: loglinear(b) for r, b in slopes.items()}), "loglinear")
    for i, rho in enumerate(curves.points):
        got = fit.described(i, BUDGET)              # a + b·ln C with C in FLOPs
        assert got["b"] == pytest.approx(slopes[rho], abs=0.002)
        assert got["a"] == pytest.approx(R0 - slopes[rho] * math.log(5e9), abs=0.05)
        assert CF.model_value("loglinear", got, R0, 2e12) == pytest.approx(loglinear(slopes[rho])(2e12), abs=0.01)


@pytest.mark.parametrize("truth, expected", [
    ({r: sigmoid(*p) for r, p in SIGMOIDS.items()}, "sigmoid"),
    ({0.5: loglinear(0.04), 0.62: loglinear(0.035), 0.74: loglinear(0.025)}, "loglinear"),
])
def test_the_backtest_picks_the_model_that_made_the_data(truth, expected):
    """The half-budget backtest (fit up to 0.31 of the budget, predict the end, 3.3× further)
    picks the generating model, and its error there is small."""
    curves = CV.collect_curves([(synthetic_pilots(truth), BUDGET)], "reward")
    backtests = [CF.run_backtest(curves, m, c) for m in CF.MODELS for c in CF.backtest_cuts(curves)]
    model, at_half = CF.choose_model(backtests)
    assert model == expected and at_half.model == expected
    assert at_half.cut_fraction == pytest.approx(checkpoint_fractions(8)[5])       # 0.305 ≤ 0.5
    assert at_half.factor == pytest.approx(1 / checkpoint_fractions(8)[5], rel=0.02)
    assert at_half.mae < 0.01
    other = next(b for b in backtests if b.model != expected and b.cut_fraction == at_half.cut_fraction)
    assert other.mae > 2 * at_half.mae


def test_supported_factor_is_where_the_first_backtest_fails():
    def bt(factor, held):
        return Backtest("sigmoid", 1 / factor, factor, (0.0,), 0.0, 0.0, 0.1, held)

    assert CF.supported_factor([bt(1.8, True), bt(3.3, True), bt(5.9, False), bt(10.7, True)], "sigmoid") == 3.3
    assert CF.supported_factor([bt(1.8, False), bt(3.3, True)], "sigmoid") is None
    assert CF.supported_factor([bt(3.3, True), bt(1.8, True)], "loglinear") is None      # another model's


# ----------------------------------------------------------------------------- prediction and refusal

def test_prediction_within_the_supported_factor_has_cis_and_the_regime_at_f():
    pilots = synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()})
    fc = _forecast(pilots, 5e12)
    assert fc.status == "predicted" and fc.model == "sigmoid" and fc.factor == pytest.approx(5.0)
    assert fc.supported_factor == pytest.approx(1 / checkpoint_fractions(8)[2], rel=0.02)   # 19×: every backtest held
    for p in fc.points:
        truth = sigmoid(*SIGMOIDS[p.rho_target])(5e12)
        assert p.predicted == pytest.approx(truth, abs=0.01)
        assert p.predicted_ci[0] - 0.005 <= truth <= p.predicted_ci[1] + 0.005
        assert p.predicted_ci[1] - p.predicted_ci[0] < 0.05
    assert fc.best_rho == 0.5 and fc.regime is Regime.SEARCH_HEAVY and fc.confidence > 0.9
    assert not fc.differs and "best ρ 0.50, search-heavy; as at the pilot budget" in fc.message
    assert _forecast(pilots, 5e12, pilot_regime=Regime.BALANCED).differs
    # deterministic, and independent of the pilots' order
    shuffled = list(pilots)
    random.Random(1).shuffle(shuffled)
    assert _forecast(shuffled, 5e12).to_dict() == fc.to_dict()


def test_refused_past_the_factor_in_one_line_with_the_budget_that_would_do():
    pilots = synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()})
    fc = _forecast(pilots, 50e12)                          # 50×: past the 19× the backtests reach
    f_star = 1 / checkpoint_fractions(8)[2]
    assert fc.status == "refused" and not fc.predicts and fc.supported_factor == pytest.approx(f_star, rel=0.02)
    assert fc.needed_budget == pytest.approx(50e12 / fc.supported_factor)
    assert "\n" not in fc.message and fc.message.startswith("no forecast at 5e+13 FLOPs: 50× the pilot budget 1e+12")
    assert f"a pilot budget ≥ {50e12 / fc.supported_factor:.3g} FLOPs would support it" in fc.message
    assert "--force-forecast" in fc.message
    assert all(p.predicted is None for p in fc.points) and fc.regime is None
    forced = _forecast(pilots, 50e12, force=True)
    assert forced.status == "forced" and "FORCED: 50× the pilot budget" in forced.message
    assert all(p.predicted is not None for p in forced.points)


def test_refused_when_the_backtest_error_exceeds_the_differences_between_rho():
    flat = {r: sigmoid(0.6, 1e11, 1.2) for r in (0.5, 0.62, 0.74)}         # identical ρ: noise only
    fc = _forecast(synthetic_pilots(flat, prompts=50, noise=0.3, seed=0), 3e12)
    assert fc.status == "refused" and fc.supported_factor is None and fc.needed_budget == pytest.approx(1.5e12)
    assert "is not below half their spread" in fc.message and "add seeds, or pilot at ≥ 1.5e+12 FLOPs" in fc.message
    inside = _forecast(synthetic_pilots(flat, prompts=50, noise=0.3, seed=0), 0.5e12)   # interpolation is fine
    assert inside.status == "predicted" and "interpolated inside the pilot budget" in inside.message


def test_pilots_without_checkpoints_or_with_too_few_are_refused_not_raised():
    pilots = [replace(p, checkpoints=()) for p in synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()})]
    fc = _forecast(pilots, 2e12)
    assert fc.status == "refused" and "have no held-out checkpoints of 'reward'" in fc.message
    assert fc.r0 is None and json.loads(json.dumps(fc.to_dict(), allow_nan=False))["r0"] is None
    from race.run.plot import plot_results                       # a refused forecast without data still draws

    res = Results(pilots=tuple(pilots), diagnosis=replace(classify(pilots, n_boot=50), forecast=fc))
    assert "forecast refused at 2× the pilots (no backtest held)" in plot_results(res).axes[3].get_title()
    few = synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()}, fractions=(0.5,))
    fc = _forecast(few, 2e12)
    assert fc.status == "refused" and "no backtest can be run" in fc.message
    with pytest.raises(FC.RaceError, match="full_run_budget -1.0 must be a positive"):
        _forecast(few, -1.0)


def test_runs_at_two_budgets_pool_into_one_curve():
    truth = {r: sigmoid(*p) for r, p in SIGMOIDS.items()}
    big = synthetic_pilots(truth)
    small = synthetic_pilots(truth, budget=1e11, seed=5)
    fc = FC.forecast([(small, 1e11), (big, BUDGET)], target="reward", full_run_budget=5e12,
                     pilot_regime=Regime.SEARCH_HEAVY, pilot_best_rho=0.5, n_boot=30)
    assert fc.budgets == (1e11, 1e12) and fc.pilot_budget == BUDGET and fc.factor == pytest.approx(5.0)
    assert len(fc.points[0].curve) == 2 * 8            # both runs' checkpoints after the base
    assert fc.points[0].predicted == pytest.approx(truth[0.5](5e12), abs=0.01)


# ----------------------------------------------------------------------------- where it shows

def _diagnosis(full=5e12, force=False):
    pilots = synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()})
    res = Results(pilots=tuple(pilots), diagnosis=classify(pilots, n_boot=100), classify={"n_boot": 100},
                  config={"model": "m", "task": "t", "budget": BUDGET})
    return res, FC.with_forecast(res, full_run_budget=full, force=force, n_boot=40)


@pytest.mark.parametrize("fmt", ["text", "md", "latex"])
def test_every_format_shows_the_prediction_or_the_refusal(fmt):
    _, diag = _diagnosis()
    out = render_diagnosis(diag, fmt)
    p = diag.forecast.points[0]
    assert f"{p.predicted:.4f} ({p.predicted_ci[0]:.4f}" in out and "forecast at 5e+12 FLOPs per run" in out
    assert "verdict at 5e+12 FLOPs: search-heavy" in out.replace(r"$\rho$", "ρ")
    _, refused = _diagnosis(full=50e12)
    out = render_diagnosis(refused, fmt)
    line = refused.forecast.message if fmt == "text" else refused.forecast.message[:30]
    assert line in out and "predicted at" not in out
    if fmt == "latex":
        assert r"\textasciicircum{}" in render_diagnosis(diag, fmt) and "^" not in render_diagnosis(diag, fmt)


def test_json_and_results_file_store_the_forecast(tmp_path):
    res, diag = _diagnosis()
    d = json.loads(render_diagnosis(diag, "json"))
    assert d["forecast"]["status"] == "predicted" and d["forecast"]["model"] == "sigmoid"
    assert Diagnosis.from_dict(d) == diag
    save_results(str(tmp_path), replace(res, diagnosis=diag))
    back = load_results(str(tmp_path))
    assert back.diagnosis.forecast == diag.forecast
    assert FC.with_forecast(back) == diag                      # stored: shown as is, nothing refitted


def test_race_report_full_run_on_a_stored_tiny_real_grid(tmp_path):
    """`race report RESULTS --full-run F` on a real grid (2e10 FLOPs per pilot, 2 seeds): at 2e10
    the three ρ differ by 0.01, less than the backtests' errors, so it refuses in one line;
    --force-forecast prints the forecast marked FORCED; bad budgets exit 2 in one line."""
    r = CliRunner().invoke(main, ["report", TINY, "--full-run", "2e11"])
    assert r.exit_code == 0, r.output
    lines = [ln.strip() for ln in r.output.splitlines() if ln.strip().startswith("no forecast at 2e+11 FLOPs")]
    assert len(lines) == 1 and "cannot rank ρ past their budget" in lines[0]
    assert "backtest model" in r.output and "predicted at" not in r.output
    r = CliRunner().invoke(main, ["report", TINY, "--full-run", "2e11", "--force-forecast", "--format", "json"])
    fc = json.loads(r.output)["forecast"]
    assert r.exit_code == 0 and fc["status"] == "forced" and fc["factor"] == pytest.approx(10.0, rel=0.01)
    assert [p["rho_target"] for p in fc["points"]] == [0.5, 0.62, 0.74]
    assert all(0.2 < p["predicted"] < 0.6 and p["predicted_ci"][0] <= p["predicted"] <= p["predicted_ci"][1]
               for p in fc["points"])
    assert fc["r0"] == pytest.approx(0.29125)                # the base policy's checkpoint, both seeds
    for args, msg in [(["--full-run", "-1"], "--full-run '-1' must be a positive finite FLOP count"),
                      (["--full-run", "lots"], "--full-run 'lots' is not a FLOP count"),
                      (["--force-forecast"], "--force-forecast and --pool need a full-run budget"),
                      (["--full-run", "2e11", "--pool", TINY],          # the same pilots twice: narrower intervals
                       "pool[0] holds the pilot ρ=0.5 seed 0 at")]:
        r = CliRunner().invoke(main, ["report", TINY, *args])
        assert r.exit_code == 2 and r.output.strip().splitlines() == [f"Error: {r.output.strip()[7:]}"]
        assert msg in r.output


def test_the_api_refuses_a_bad_full_run_budget_before_any_pilot(tmp_path):
    import race
    from race.config.configfile import ConfigError

    with pytest.raises(ConfigError, match="full_run_budget 0 must be a positive finite FLOP count"):
        race.diagnose(full_run_budget=0, out_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_the_figure_gets_a_forecast_panel(tmp_path):
    from race.run.plot import plot_results

    res, diag = _diagnosis()
    fig = plot_results(replace(res, diagnosis=diag), str(tmp_path / "f.png"))
    ax = fig.axes[3]
    assert ax.get_xscale() == "log" and "forecast (sigmoid): best ρ 0.50, search-heavy" in ax.get_title()
    marks = {ln.get_label(): ln.get_xdata()[0] for ln in ax.get_lines() if ln.get_label().startswith(("full", "pilot"))}
    assert marks == {"full run 5e+12": 5e12, "pilot budget 1e+12": 1e12}
    bars = [c for c in ax.containers]
    assert len(bars) == 3
    got = sorted(float(b.lines[0].get_ydata()[0]) for b in bars)
    assert got == pytest.approx(sorted(p.predicted for p in diag.forecast.points))


def _tiny_with_diagnosis():
    from race.stats.results import diagnose_results

    res = load_results(TINY)
    return replace(res, diagnosis=diagnose_results(res))


def test_race_diagnose_and_race_pilot_add_the_forecast_and_store_it(tmp_path, monkeypatch):
    """The API and `race pilot --full-run` forecast after the grid and rewrite results.json (the
    grid itself replaced by the stored tiny one: nothing runs)."""
    import race
    import race.run.study

    monkeypatch.setattr(race.run.study, "run_grid", lambda cfg, *a, **kw: _tiny_with_diagnosis())
    diag = race.diagnose(full_run_budget="1e10", out_dir=str(tmp_path / "api"))
    assert diag.forecast.status == "predicted" and diag.forecast.factor == pytest.approx(0.5, rel=0.01)
    assert "interpolated inside the pilot budget" in diag.forecast.message
    assert load_results(str(tmp_path / "api")).diagnosis.forecast == diag.forecast
    r = CliRunner().invoke(main, ["pilot", "--out", str(tmp_path / "cli"), "--quiet", "--full-run", "2e11",
                                  "--force-forecast"])
    assert r.exit_code == 0, r.output
    assert "FORCED: 10× the pilot budget" in r.output
    assert load_results(str(tmp_path / "cli")).diagnosis.forecast.status == "forced"
    r = CliRunner().invoke(main, ["pilot", "--out", str(tmp_path / "bad"), "--full-run", "0"])
    assert r.exit_code == 2 and "--full-run '0' must be a positive finite FLOP count" in r.output
    r = CliRunner().invoke(main, ["pilot", "--out", str(tmp_path / "bad"), "--force-forecast"])
    assert r.exit_code == 2 and "--force-forecast needs --full-run F" in r.output
    assert not (tmp_path / "bad").exists()


def test_a_collapsed_pilot_is_named_beside_the_forecast():
    pilots = synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()})
    i = next(k for k, p in enumerate(pilots) if p.rho_target == 0.74 and p.seed == 1)
    cps = list(pilots[i].checkpoints)
    for k in (len(cps) - 2, len(cps) - 1):         # the last two checkpoints fall back to the base
        cps[k] = replace(cps[k], evals={"reward": tuple(x - (sum(cps[k].evals["reward"]) / len(cps[k].evals["reward"])
                                                             - R0) for x in cps[k].evals["reward"])})
    pilots[i] = replace(pilots[i], checkpoints=tuple(cps))
    res = Results(pilots=tuple(pilots), diagnosis=classify(pilots, n_boot=100), classify={"n_boot": 100},
                  config={"budget": BUDGET})
    diag = FC.with_forecast(res, full_run_budget=2e12, n_boot=30)
    assert diag.stability.unstable[0].rho_target == 0.74 and diag.forecast.predicts
    assert "collapses: ρ=0.74 1 of 3 pilots fell back towards the base policy" in render_diagnosis(diag, "text")


def test_every_forecast_carries_the_stability_line_at_f_whatever_the_status():
    """Checkpoints cannot forecast a late collapse (docs/validation.md: full runs fell over where no
    pilot had), so a forecast ≥ LONG_RUN pilot budgets says "not tested at this length", predicted
    or refused, whatever the schedule; a shorter one "stable"; the report prints it."""
    from race.stats.instability import LONG_RUN

    pilots = synthetic_pilots({r: sigmoid(*p) for r, p in SIGMOIDS.items()})

    def warned(lr, factor):
        config = {"model": "m", "task": "t", "budget": BUDGET, **({"learning_rate": lr} if lr else {})}
        res = Results(pilots=tuple(pilots), diagnosis=classify(pilots, n_boot=50), classify={"n_boot": 50},
                      config=config)
        diag = FC.with_forecast(res, full_run_budget=factor * BUDGET, n_boot=20)
        at = diag.forecast.stability_at_budget
        return diag, at["status"], at["line"]

    diag, status, line = warned({"ref": 1e-3, "schedule": "constant"}, LONG_RUN)
    assert status == "not tested" and f"the full run is {LONG_RUN:.3g} × a pilot's length" in line
    assert line in render_diagnosis(diag, "text")
    refused, status, _ = warned(None, 50 * LONG_RUN)
    assert refused.forecast.status == "refused" and status == "not tested"
    assert warned({"ref": 1e-3, "schedule": "constant"}, 0.99 * LONG_RUN)[1] == "stable"
    assert warned({"ref": 1e-3, "schedule": "cosine"}, LONG_RUN)[1] == "not tested"   # decay: no exemption
