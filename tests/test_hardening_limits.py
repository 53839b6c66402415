"""Hardening round 4 (issue 50), what round 4's first pass left: the forecast's public functions check
their arguments on entry (items 4 and 6), every F-dependent check of the probe comes before any
compute (item 3: a probe that cannot cover its share of the run is refused before calibration), and
a watch checker that never returns is killed with what it started, not left running (item 5)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from race.core.errors import RaceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "data", "tiny-grid-2e10.json")


def _race(*args, cwd):
    return subprocess.run([sys.executable, "-m", "race", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=600)


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its reaper (killed: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


# ------------------------------------------------------------------ the forecast's arguments (item 4)

@pytest.fixture(scope="module")
def tiny():
    from race.stats import curvefit as CF
    from race.stats import curves as CV
    from race.stats.forecast import results_budget
    from race.stats.results import load_results

    res = load_results(TINY)
    B = results_budget(res)
    cur = CV.collect_curves([(res.pilots, B)], "reward")
    means = [g.mean for g in cur.groups]
    fit = CF.fit_surface("loglinear", CV.fit_data(cur, means), 0.3, unit=True)
    return res, B, cur, means, fit


def test_the_forecast_api_refuses_bad_arguments_in_one_line_naming_them(tiny):
    from race.core.records import Regime
    from race.stats import curvefit as CF
    from race.stats import curves as CV
    from race.stats import forecast as FC
    from race.stats.curves import ForecastError

    res, B, cur, means, fit = tiny
    nan, inf = float("nan"), float("inf")
    cases = [
        (lambda: FC.forecast([(res.pilots, B)], target="reward", full_run_budget=1e11, pilot_regime="balanced",
                             pilot_best_rho=0.5, n_boot=5), "pilot_regime 'balanced' must be a race.core.records.Regime"),
        (lambda: FC.forecast([(res.pilots, B)], target="reward", full_run_budget=1e11, pilot_regime=Regime.BALANCED,
                             pilot_best_rho=nan, n_boot=5), "pilot_best_rho nan"),
        (lambda: FC.forecast([(res.pilots, -B)], target="reward", full_run_budget=1e11, pilot_regime=Regime.BALANCED,
                             pilot_best_rho=0.5), "runs[0][1] -20000000000.0"),
        (lambda: FC.forecast([(res.pilots, B)], target="reward", full_run_budget=10 ** 5000,
                             pilot_regime=Regime.BALANCED, pilot_best_rho=0.5), "an integer of 16,610 bits"),
        (lambda: FC.with_forecast(res, full_run_budget=1e11, refit="yes"), "refit 'yes' must be True or False"),
        (lambda: FC.with_forecast(res, full_run_budget=1e11, pool=[res, "x"]), "pool[1] 'x'"),
        (lambda: FC.with_forecast("results.json"), "results 'results.json' must be a race.stats.results.Results"),
        (lambda: FC.replicate_means(cur, n_boot=0, seed=0, level=0.9), "n_boot 0"),
        (lambda: FC.replicate_means(cur, n_boot=5, seed=-1, level=0.9), "seed -1"),
        (lambda: FC.replicate_means(cur, n_boot=5, seed=0, level=2), "level 2 must be a finite number > 0 and < 1"),
        (lambda: FC.stability_at_with_rate(res, None, nan), "full_run_budget nan"),
        (lambda: FC.stability_at_with_rate(res, "stable", 1e11), "st 'stable'"),
        (lambda: FC.budget_range(res, None, 1e11, "exponential"), "schedule 'exponential' must be one of"),
        (lambda: CV.base_score(None, means), "curves None must be a race.stats.curves.Curves"),
        (lambda: CV.base_score(cur, means[:1]), "means has 1 items, curves 3 groups"),
        (lambda: CV.fit_data(cur, means, nan), "cut nan"),
        (lambda: CV.fit_data(cur, means, "half"), "cut 'half'"),
        (lambda: CV.fit_data(cur, [m * nan for m in means]), "means[0] of shape (8,) must hold 8 finite scores"),
        (lambda: CV.pilot_ends("x"), "curves 'x'"),
        (lambda: CV.point_curve(cur, 3), "point 3 must be a grid point's index, 0 to 2"),
        (lambda: CV.point_curve(cur, True), "point True"),
        (lambda: CF.fit_surface("cubic", CV.fit_data(cur, means), 0.3, unit=True), "model 'cubic' must be one of"),
        (lambda: CF.fit_surface("loglinear", CV.fit_data(cur, means), nan, unit=True), "r0 nan"),
        (lambda: CF.fit_surface("sigmoid", [], 0.3, unit=True), "data is empty"),
        (lambda: CF.fit_surface("sigmoid", [([0.1, inf], [0.2, 0.3])], 0.3, unit=True), "data[0][0]"),
        (lambda: CF.fit_surface("sigmoid", [([0.1, 0.2], [0.2])], 0.3, unit=True), "expected two 1-D arrays"),
        (lambda: CF.fit_surface("sigmoid", CV.fit_data(cur, means), 0.3, unit="no"), "unit 'no' must be True or False"),
        (lambda: CF.model_value("loglinear", {"a": 1}, 0.3, 1e10), "has no 'b'"),
        (lambda: CF.model_value("sigmoid", {"A": 0.5, "c_mid": -1e10, "B": 1}, 0.3, 1e9), "params['c_mid'] -1"),
        (lambda: CF.model_value("sigmoid", {"A": 0.5, "c_mid": 1e10, "B": 1}, 0.3, [1e9, -1]), "flops"),
        (lambda: CF.model_value("quadratic", {}, 0.3, 1e9), "model 'quadratic'"),
        (lambda: CF.run_backtest(cur, "loglinear", 2.0), "cut 2.0"),
        (lambda: CF.choose_model(None), "backtests None must be a list"),
        (lambda: CF.supported_factor([1, 2], "sigmoid"), "backtests[0] 1 must be a race.core.records.Backtest"),
        (lambda: fit.predict(nan), "x nan"),
        (lambda: fit.described(99, B), "point 99"),
        (lambda: fit.described(0, -B), "budget -20000000000.0"),
    ]
    for call, text in cases:
        with pytest.raises(ForecastError if "bits" not in text and "refit" not in text else RaceError) as info:
            call()
        msg = str(info.value)
        assert isinstance(info.value, RaceError) and text in msg and "\n" not in msg, (text, msg)
    # and the same functions still answer what they answered
    assert CV.point_curve(cur, 1) == CV.point_curve(cur, __import__("numpy").int64(1))
    assert CF.model_value("sigmoid", {"A": 0.5, "c_mid": 1e10, "B": 1}, 0.3, [1e10]).tolist() == [0.4]
    assert fit.predict(0.0).shape == (3,) and set(fit.described(0, B)) == {"a", "b"}


# ------------------------------------------------------------------ the probe's coverage before compute (item 3)

def test_a_probe_that_cannot_cover_its_share_is_refused_before_calibration(tmp_path, monkeypatch):
    """The default grid (4 ρ × 3 seeds of 6e11 FLOPs, 8 prompts per step): its probe covers at most
    0.25 · 12 · 8 / 600 = 4 % of a run of 600 × B, under MIN_COVER. race pilot --probe exits 2 in one
    line before calibration (no folder made, in seconds); race.diagnose raises before calibrate is
    called; the bound matches plan_probe's coverage on a stored grid."""
    import race.engine.calibration
    from race.config.configfile import config_from_dict
    from race.fullrun.probe import MIN_COVER, check_probe_config, cover_bound, plan_probe
    from race.run.api import build_config, diagnose
    from race.stats.results import load_results

    cfg = build_config(None)
    F = 600 * cfg.budget
    t0 = time.monotonic()
    r = _race("pilot", "--probe", "--full-run", f"{F:g}", "--out", str(tmp_path / "grid"), cwd=tmp_path)
    assert r.returncode == 2 and "could cover at most 4.0%" in r.stderr and "nothing was run" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "grid").exists() and time.monotonic() - t0 < 60

    def calibrate(*a, **k):
        raise AssertionError("calibration ran before the probe's coverage was checked")

    monkeypatch.setattr(race.engine.calibration, "calibrate", calibrate)
    with pytest.raises(RaceError, match=rf"under the {MIN_COVER:.0%} it needs"):
        diagnose(probe=True, full_run_budget=F, out_dir=str(tmp_path / "api"))
    assert not (tmp_path / "api").exists()
    # a share given caps an adaptive grid's pilots (5 of 12 at 0.3); an extension's rounds add pilots
    with pytest.raises(RaceError, match="5 pilots of 6e\\+11"):
        diagnose(probe=True, full_run_budget=300 * cfg.budget, adaptive_share=0.3, out_dir=str(tmp_path / "a"))
    assert check_probe_config(cfg, F, pilots=16) == pytest.approx(0.25 * 16 * 8 / 600)
    # the bound against plan_probe on a stored grid (its calibrated lengths and its pilots' real FLOPs)
    res = load_results(os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json"))
    rcfg = config_from_dict(res.config)
    for k in (30, 100, 300):
        covers = plan_probe(res, k * rcfg.budget).covers
        assert cover_bound(rcfg, k * rcfg.budget) == pytest.approx(covers, rel=0.01), k


# ------------------------------------------------------------------ a checker that never returns (item 5)

def test_a_checker_that_never_returns_is_killed_with_what_it_started(tmp_path):
    from race.fullrun.watch import WatchError, run_with_timeout

    marks = tmp_path / "pids"

    def never():
        child = subprocess.Popen(["sleep", "600"])
        marks.write_text(f"{os.getpid()} {child.pid}")
        while True:                     # a busy loop: no thread could stop it
            pass

    t0 = time.monotonic()
    with pytest.raises(WatchError, match=r"did not return within 1 s \(timeout; its process was killed\)"):
        run_with_timeout(never, 1.0, "reward_func")
    assert time.monotonic() - t0 < 10
    pids = [int(p) for p in marks.read_text().split()]
    assert os.getpid() not in pids
    deadline = time.monotonic() + 5
    while not all(_dead(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_dead(p) for p in pids), pids
    # what a checker returns, raises or does to its process comes back as a value or one line
    assert run_with_timeout(lambda: [1.0, 0.5], 30, "f") == [1.0, 0.5]
    for fn, said in ((lambda: 1 / 0, "f raised ZeroDivisionError"), (lambda: sys.exit(3), "f raised SystemExit"),
                     (lambda: os._exit(4), "exit code 4"), (lambda: (lambda: 1), "cannot be sent back")):
        with pytest.raises(WatchError, match=said):
            run_with_timeout(fn, 30, "f")


def test_the_trl_callback_kills_a_hung_checker_and_trains_on():
    from test_hardening import _train as train     # the hooks a trainer calls, on a stand-in model

    from race.fullrun.watch import WatchError, trl_callback

    def hangs(prompts, completions, **kw):
        time.sleep(600)

    lines = []
    t0 = time.monotonic()
    cb = trl_callback(["1+1="], hangs, timeout=0.5, log=lines.append)
    control = train(cb)
    assert not control.should_training_stop and time.monotonic() - t0 < 20
    assert len(lines) == 1 and "its process was killed" in lines[0] and "training goes on" in lines[0], lines
    # isolate=False keeps the old thread (for a checker that needs this process), still one line
    state = {"calls": 0}

    def counts(prompts, completions, **kw):
        state["calls"] += 1
        return [1.0] * len(prompts)

    train(trl_callback(["1+1="], counts, log=lines.append, isolate=False))
    assert state["calls"] >= 2                       # it ran here, in this process
    with pytest.raises(WatchError, match="isolate 'no' must be True or False"):
        trl_callback(["1+1="], counts, isolate="no")


# ------------------------------------------------------------------ what the campaign found (bench/hardening_campaign.py)

def test_a_forecast_below_every_checkpoint_is_refused_not_called_interpolated(tiny):
    from race.core.records import Regime
    from race.stats.curves import ForecastError
    from race.stats.forecast import MAX_N_BOOT, forecast

    res, B, cur, means, fit = tiny
    fc = forecast([(res.pilots, B)], target="reward", full_run_budget=1e3, pilot_regime=Regime.BALANCED,
                  pilot_best_rho=0.5, n_boot=20, force=True)
    assert fc.status == "refused" and "below the pilots' first held-out checkpoint" in fc.message
    assert "interpolated" not in fc.message and "\n" not in fc.message
    with pytest.raises(ForecastError, match=f"n_boot 1000000000 must be a whole number ≥ 1 and ≤ {MAX_N_BOOT}"):
        forecast([(res.pilots, B)], target="reward", full_run_budget=4e10, pilot_regime=Regime.BALANCED,
                 pilot_best_rho=0.5, n_boot=10 ** 9, force=True)


def test_the_watch_refuses_step_counts_no_run_takes():
    from race.fullrun.watch import Watch, WatchError, check_scores

    for bad in (10 ** 5000, 10 ** 13):
        with pytest.raises(WatchError, match="total_steps .* must be a whole number from 1 to 1e\\+12"):
            Watch(total_steps=bad)
    with pytest.raises(WatchError, match="history\\[1\\] step"):
        check_scores([(0, [0.5]), (10 ** 400, [0.4])])
    assert Watch(total_steps=10 ** 12).steps[-1] == 10 ** 12


def test_a_probe_whose_record_cannot_be_stored_is_refused_before_it_runs(tmp_path, monkeypatch):
    import shutil

    import race.engine.pilot
    from race.run.api import run_probe

    shutil.copy(os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json"), tmp_path / "results.json")

    def run_pilot(*a, **k):
        raise AssertionError("the probe ran before its record's folder was checked")

    monkeypatch.setattr(race.engine.pilot, "run_pilot", run_pilot)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).startswith(str(tmp_path)) else real(p, mode))
    with pytest.raises(RaceError, match="is not writable by this user; nothing was run"):
        run_probe(str(tmp_path), full_run_budget=6e11, out=str(tmp_path))


def test_a_probe_into_a_linked_results_file_is_refused_before_it_runs(tmp_path, monkeypatch):
    """The writer never writes through a link; the probe says so before its compute, not after (a review of
    session 39: race probe ran its whole budget, then refused the link)."""
    import shutil

    import race.engine.pilot
    from race.run.api import run_probe

    shutil.copy(os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json"), tmp_path / "real.json")
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "real.json", tmp_path / "run" / "results.json")

    def run_pilot(*a, **k):
        raise AssertionError("the probe ran before its record's file was checked")

    monkeypatch.setattr(race.engine.pilot, "run_pilot", run_pilot)
    with pytest.raises(RaceError, match="is a symbolic link, and RACE never writes through a link"):
        run_probe(str(tmp_path / "real.json"), full_run_budget=6e11, out=str(tmp_path / "run"))
