"""The bad cases of the held-out hardening campaign (bench/hardening_heldout.py, docs/benchmarks.md, issue 50),
each refused in one line naming the argument or field, before any compute."""
from __future__ import annotations

import math
import re

import pytest

from race.core.errors import ConfigError, RaceError


def _probe(**kw):
    rec = {"full_run_budget": 6e12, "learning_rate": 1e-3, "steps": 100, "full_steps": 7780, "covers": 100 / 7780,
           "status": "held", "curve": [{"fraction": 0.0, "step": 0, "mean": 0.3}, {"fraction": 1.0, "step": 100,
                                                                                  "mean": 0.5}]}
    rec.update(kw)
    return {k: v for k, v in rec.items() if v is not None}


def test_a_tampered_probe_record_is_refused_or_read_from_its_steps():
    from race.stats.instability import probe_covers, probe_problem

    assert probe_problem(_probe()) is None
    assert "'covers'" in probe_problem(_probe(covers=1.0))                   # 100 of 7780 steps cannot cover it all
    assert probe_problem(_probe(curve=[])) is None                          # RACE's own probe without checkpoints
    from race.stats.instability import stability_at

    empty = stability_at(None, full_run_budget=6e12, pilot_budget=6e11, ran=False, probe=_probe(curve=[], covers=1.0,
                                                                                                 steps=7780))
    assert empty["status"] == "not tested" and "nan" not in empty["line"]     # no curve: nothing shown held
    assert "'curve'" in probe_problem(_probe(curve=[{"fraction": 1.0, "step": 100, "mean": math.nan}]))
    assert "'full_steps'" in probe_problem(_probe(full_steps=0))
    no_covers = _probe(covers=None)
    assert "covers" not in no_covers and probe_problem(no_covers) is None
    assert probe_covers(no_covers) == pytest.approx(100 / 7780)              # from its steps, not the whole run
    assert probe_covers({"steps": 5, "status": "held", "learning_rate": 1e-3}) == 1.0   # another tool's record


def test_the_watch_refuses_steps_past_the_run_counts_that_are_not_counts_and_a_non_callable():
    from race.config.checkpoints import MAX_COUNT, checkpoint_fractions
    from race.config.rules import MAX_CHECKPOINTS
    from race.fullrun.watch import Watch, WatchError, run_with_timeout

    assert MAX_COUNT == MAX_CHECKPOINTS
    w = Watch(100)
    w.record(0, [1.0, 0.0])
    with pytest.raises(WatchError, match="past the run's total_steps 100"):
        w.record(10 ** 6, [1.0, 0.0])
    for bad in ("8", True, 10 ** 9, 3.5):
        with pytest.raises(ConfigError, match="checkpoints"):
            checkpoint_fractions(bad)
    assert len(checkpoint_fractions(8)) == 7 and checkpoint_fractions([0.5, 1.0]) == (0.5,)
    with pytest.raises(WatchError, match="fn 'x': expected a callable"):
        run_with_timeout("x", 1.0, "chk")


def test_the_rate_refuses_an_unknown_cause_and_a_probe_without_its_verdict():
    from race.config.configfile import LearningRate
    from race.stats.rate import RateError, full_run_rate

    lr = LearningRate()
    with pytest.raises(RateError, match="cause 'bogus'"):
        full_run_rate(lr, status="at risk", factor=10.0, full_lr=1e-3, cause="bogus")
    with pytest.raises(RateError, match="status and learning_rate"):
        full_run_rate(lr, status="stable", factor=10.0, full_lr=1e-3, probe={"x": 1})
    assert full_run_rate(lr, status="at risk", factor=10.0, full_lr=1e-3, cause="pilots")["rule"] == 2


def test_a_forecast_needs_runs_and_diagnose_needs_real_booleans(tmp_path):
    import race
    from race.stats.forecast import ForecastError, forecast

    with pytest.raises(ForecastError, match=r"runs \[\]"):
        forecast([], target="reward", full_run_budget=6e12, pilot_regime=race.Regime.BALANCED, pilot_best_rho=0.5)
    with pytest.raises(RaceError, match="probe 'yes' must be True or False"):
        race.diagnose(probe="yes", full_run_budget=1e12, budget=6e11, grid=[0.3, 0.6, 0.85], seeds=1, workers=1,
                      out_dir=str(tmp_path / "o"), quiet=True)
    assert not (tmp_path / "o").exists()


def test_a_recipe_refuses_a_step_count_no_trainer_holds():
    from race.fullrun.recipes import MAX_TRAINER_STEPS, recipe
    from race.run.api import build_config

    with pytest.raises(RaceError, match=re.escape(f"more than {MAX_TRAINER_STEPS:.0e}")):
        recipe(build_config(None), trainer="trl", full_run_budget=6e41, rho=0.5)
