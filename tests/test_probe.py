"""The length probe (race/fullrun/probe.py), its rule (race.stats.instability.probe_fall), the stability line it
feeds, and the rate for F (race/stats/rate.py). The real probe runs on the committed default grid."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from race.stats.instability import probe_fall, stability_at
from race.config.configfile import LearningRate
from race.stats.rate import RATE_CUT, apply_rate, configured_lr, full_run_rate
from race.core.records import Checkpoint, FlopBreakdown, Stability, StabilityPoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join(ROOT, "docs", "runs", "default.results.json.gz")


def _cp(fraction, scores):
    return Checkpoint(fraction, int(fraction * 100), FlopBreakdown(1e9 * fraction, 1e9 * fraction),
                      {"reward": tuple(scores)}, FlopBreakdown(1e7), 0.5)


def test_probe_fall_is_the_end_below_the_base_by_2_paired_ses_and_005():
    base = [1.0] * 30 + [0.0] * 70                      # 0.30
    end = [1.0] * 10 + [0.0] * 90                       # 0.10: 20 prompts lost, none gained
    hit = probe_fall([_cp(0.0, base), _cp(0.5, [1.0] * 100), _cp(1.0, end)], "reward")
    # paired differences: 20 ones and 80 zeros → mean 0.2, sd √(0.2·0.8·100/99), SE sd/10
    se = math.sqrt(0.2 * 0.8 * 100 / 99) / 10
    assert hit == pytest.approx({"base": 0.3, "final": 0.1, "drop": 0.2, "drop_se": se, "step": 100})
    # a fall it recovers from is not a flag (cosine decay's in round 1): only the end counts
    assert probe_fall([_cp(0.0, base), _cp(0.5, [0.0] * 100), _cp(1.0, base)], "reward") is None
    # 0.04 below: under the 0.05 floor however many prompts resolve it
    assert probe_fall([_cp(0.0, base), _cp(1.0, [1.0] * 26 + [0.0] * 74)], "reward") is None
    # 0.06 below but unresolved: 3 of 50 prompts lost, SE 0.034 → 1.8 SEs
    b, e = [1.0] * 10 + [0.0] * 40, [1.0] * 7 + [0.0] * 43
    assert probe_fall([_cp(0.0, b), _cp(1.0, e)], "reward") is None
    assert probe_fall([_cp(0.0, base)], "reward") is None                            # one checkpoint
    assert probe_fall([_cp(0.0, base), _cp(1.0, end[:50])], "reward") is None        # other prompts


def _held():
    pts = tuple(StabilityPoint(rho_target=r, pilots=3, unstable=0, checkpoints=9, prompts=100, eval_flops=1.0)
                for r in (0.5, 0.7))
    return Stability(target="reward", rule={}, points=pts, unstable=())


def _probe(status, lr=1e-3):
    fall = {"base": 0.3, "final": 0.1, "drop": 0.2, "drop_se": 0.04, "step": 900} if status == "fell" else None
    return {"full_run_budget": 3e13, "status": status, "fall": fall, "learning_rate": lr, "steps": 900,
            "covers": 0.5, "curve": [{"mean": 0.3}, {"mean": 0.1 if fall else 0.45}]}


def test_the_stability_line_reads_the_probe_at_f():
    fell = stability_at(_held(), full_run_budget=3e13, pilot_budget=1e12, probe=_probe("fell"))
    assert fell["status"] == "at risk" and fell["cause"] == "probe"
    assert ("the length probe at η 0.001 (900 steps, 50% of the full run's) ended at 0.100, below its base "
            "policy's 0.300 (drop 0.200, paired SE 0.040)") in fell["line"]
    held = stability_at(_held(), full_run_budget=3e13, pilot_budget=1e12, probe={**_probe("held"), "covers": 1.0})
    assert held["status"] == "stable" and "held (held-out 0.300 at its base, 0.450 at its end)" in held["line"]
    # a probe that held over half the run vouches for that half only: no stability statement past it
    half = stability_at(_held(), full_run_budget=3e13, pilot_budget=1e12, probe=_probe("held"))
    assert half["status"] == "not tested" and "not tested past 50% of its length" in half["line"]
    assert "stable" not in half["line"] and "remaining 50% of the full run's steps are not tested" in half["line"]
    # without a probe a run 30 × B long is not tested, and the line names the command that tests it
    none = stability_at(_held(), full_run_budget=3e13, pilot_budget=1e12)
    assert none["status"] == "not tested" and "race probe DIR --full-run F" in none["line"]


def test_rate_for_f_by_rule_and_it_never_raises_eta():
    lr = LearningRate(ref=1e-3)
    at_risk = full_run_rate(lr, status="at risk", factor=10, full_lr=2e-3)
    assert (at_risk["rule"], at_risk["scale"], at_risk["schedule"], at_risk["warmup"]) == (2, 1 / RATE_CUT, "cosine",
                                                                                             0.05)
    assert "η ÷ 3 = 0.000667" in at_risk["line"]
    long = full_run_rate(lr, status="not tested", factor=30, full_lr=1e-3)
    assert (long["rule"], long["scale"], long["schedule"]) == (3, 1.0, "cosine")
    assert full_run_rate(LearningRate(schedule="cosine"), status="stable", factor=30, full_lr=1e-3)["rule"] == 4
    assert full_run_rate(lr, status="stable", factor=5, full_lr=1e-3)["rule"] == 4
    # a probe that held at a lower η: that η; a probe at the full rate: no change from it
    low = full_run_rate(lr, status="stable", factor=30, full_lr=1e-3, probe=_probe("held", lr=4e-4))
    assert low["rule"] == 1 and low["scale"] == pytest.approx(0.4) and low["schedule"] == "constant"
    for rate in (at_risk, long, low):
        assert apply_rate(lr, rate).ref <= lr.ref
    assert apply_rate(lr, at_risk) == LearningRate(ref=1e-3 / 3, schedule="cosine", warmup=0.05)
    # a stored config: η at its batch by the √B rule (8 prompts × 8 rollouts = 64 = B_ref), or fixed
    assert configured_lr({"learning_rate": {"ref": "2e-3"}})[1] == pytest.approx(2e-3)
    assert configured_lr({"learning_rate": {"ref": 1e-3}, "schedule": {"prompts_per_step": 32}})[1] == \
        pytest.approx(2e-3)


def test_the_rate_for_f_is_graded_by_what_flagged_the_run():
    """At risk because pilots fell back: η ÷ 3 with cosine decay (rule 2). At risk by the length probe
    alone, the probe run at the full run's η: that η with cosine decay (rule 5). A probe that fell at a
    lower η than the run's says nothing for the run's η: η ÷ 3 again. No cause given: rule 2, as frozen."""
    from race.stats.rate import GRADED_GRIDS, GRADED_RUNS

    lr = LearningRate(ref=1e-3)
    fell_pt = StabilityPoint(rho_target=0.5, pilots=3, unstable=1, checkpoints=9, prompts=100, eval_flops=1.0)
    pilots_fell = stability_at(Stability(target="reward", rule={}, points=(fell_pt,), unstable=((0.5, 0),)),
                               full_run_budget=3e13, pilot_budget=1e12, probe=_probe("fell"))
    assert pilots_fell["cause"] == "pilots"             # the pilots come first, whatever the probe says
    by_probe = stability_at(_held(), full_run_budget=3e13, pilot_budget=1e12, probe=_probe("fell"))
    r2 = full_run_rate(lr, status="at risk", factor=30, full_lr=1e-3, probe=_probe("fell"), cause=pilots_fell["cause"])
    r5 = full_run_rate(lr, status="at risk", factor=30, full_lr=1e-3, probe=_probe("fell"), cause=by_probe["cause"])
    assert (r2["rule"], r2["scale"], r2["schedule"]) == (2, 1 / RATE_CUT, "cosine") and "pilots fell back" in r2["line"]
    assert (r5["rule"], r5["scale"], r5["schedule"], r5["warmup"]) == (5, 1.0, "cosine", 0.05)
    assert r5["line"].startswith("rate for F: η 0.001, cosine decay to 0 with 5% warm-up (at risk by the length "
                                 "probe alone") and f"lost 0 of {GRADED_RUNS} full runs" in r5["line"]
    assert f"on all {GRADED_GRIDS})" in r5["line"] and apply_rate(lr, r5) == LearningRate(ref=1e-3, schedule="cosine",
                                                                                            warmup=0.05)
    lower = full_run_rate(lr, status="at risk", factor=30, full_lr=1e-3, probe=_probe("fell", lr=5e-4), cause="probe")
    assert lower["rule"] == 2
    assert full_run_rate(lr, status="at risk", factor=30, full_lr=1e-3, probe=_probe("fell"))["rule"] == 2


def _default_results():
    from race.stats.results import load_results

    return load_results(DEFAULT_RESULTS)


def test_plan_probe_keeps_the_full_runs_steps_and_eta_at_one_prompt_per_step_under_the_cap():
    from race.fullrun.probe import PROBE_SHARE, plan_probe

    res = _default_results()
    grid = sum(p.flops.total for p in res.pilots if p.status == "complete")
    F = 2 * float(res.config["budget"])
    plan = plan_probe(res, F)
    s = plan.schedule
    assert s.prompts_per_step == 1 and plan.covers == pytest.approx(1.0, abs=0.01)
    assert plan.learning_rate == s.learning_rate == 1e-3 and plan.config.learning_rate.fixed
    assert plan.budget <= F / plan.full_prompts_per_step and plan.rho == res.diagnosis.recommended_rho
    assert plan.share == pytest.approx(plan.budget / grid)
    capped = plan_probe(res, 100 * float(res.config["budget"]), lr=3e-4)
    assert capped.budget <= PROBE_SHARE * grid * 1.0001 and capped.covers < 1
    assert capped.learning_rate == capped.schedule.learning_rate == 3e-4
    assert f"{capped.covers:.0%} of the full run's" in capped.line()
    from race.core.errors import RaceError

    with pytest.raises(RaceError, match="is not above the pilot budget"):
        plan_probe(res, float(res.config["budget"]))
    with pytest.raises(RaceError, match="ρ 1.5 is not in"):
        plan_probe(res, F, rho=1.5)


def _race(*args, cwd):
    return subprocess.run([sys.executable, "-m", "race", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ROOT})


def test_race_probe_refuses_bad_input_in_one_line(tmp_path):
    for args, msg in ((["probe", DEFAULT_RESULTS, "--full-run", "1e13"], "is compressed"),
                      (["probe", str(tmp_path), "--full-run", "1e13", "--lr", "2"], "--lr '2' is out of range"),
                      (["probe", str(tmp_path), "--full-run", "1e13", "--rho", "x"], "--rho 'x' is not a number")):
        r = _race(*args, cwd=tmp_path)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_real_probe_is_stored_and_read_by_the_report_and_the_recipe(tmp_path):
    """race probe on the committed default grid at F just above B (a short real run): the record
    lands in results.json, the report's stability line reads it, race recipe names the rate."""
    import gzip
    import json

    src = json.loads(gzip.open(DEFAULT_RESULTS, "rt").read())
    (tmp_path / "results.json").write_text(json.dumps(src))
    F = 1.05 * float(src["config"]["budget"])
    r = _race("probe", str(tmp_path), "--full-run", f"{F:g}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "length probe at F" in r.stderr and "1 prompt ×" in r.stderr
    stored = json.loads((tmp_path / "results.json").read_text())
    rec = stored["probes"][-1]
    assert rec["full_run_budget"] == pytest.approx(F) and rec["status"] in ("held", "fell")
    assert rec["prompts_per_step"] == 1 and rec["curve"][0]["fraction"] == 0.0 and rec["budget"] <= F / 8
    assert "stability at F (1.05 × B): " + ("stable: the length probe" if rec["status"] == "held"
                                            else "AT RISK: the length probe") in r.stdout
    assert "rate for F:" in r.stdout
    rec_out = _race("recipe", str(tmp_path), "--for", "trl", "--full-run", f"{F:g}", cwd=tmp_path)
    assert rec_out.returncode == 0 and "the length probe at η 0.001" in rec_out.stdout, rec_out.stderr


def test_the_probe_says_its_progress_at_each_tenth_of_its_budget_with_the_time_left():
    from race.fullrun.probe import ProgressLines, _clock

    said, now = [], [100.0]
    lines = ProgressLines(1000.0, 500, say=said.append, clock=lambda: now[0])
    now[0] += 60.0                                   # loading and the base policy's evaluation
    for step in range(1, 501):                       # 2 FLOPs a step, 1 s a step
        now[0] += 1.0
        lines(step, 2.0 * step)
    assert len(said) == 9                            # 10 % … 90 %: the last step says nothing
    # the pace counts from the first step: 49 s for 49 steps, 450 left
    assert said[0] == "probe: 10% of its budget, step 50 of about 500, 110 s elapsed, about 8 min left"
    assert said[-1] == "probe: 90% of its budget, step 450 of about 500, 8 min elapsed, about 50 s left"
    jump = []
    big = ProgressLines(100.0, 10, say=jump.append, clock=lambda: 0.0)
    big(1, 35.0)                                      # a step that passes three tenths says once
    big(2, 36.0)
    assert len(jump) == 1 and jump[0].startswith("probe: 35% of its budget, step 1 of about 10")
    assert (_clock(42), _clock(600), _clock(7500)) == ("42 s", "10 min", "2 h 05 min")


def test_a_stopped_probe_is_not_told_it_resumes():
    from race.run.cli_support import what_is_kept as _what_is_kept

    assert "runs it again from the start" in _what_is_kept(["probe", "runs/g", "--full-run", "6e12"])
    assert "finished pilots stay in the storage" in _what_is_kept(["pilot", "grid.yaml"])
    assert "finished pilots stay in the storage" in _what_is_kept(["worker", "--storage", "x"])
    assert _what_is_kept(["report", "runs/g"]) == ""
