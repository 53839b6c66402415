"""Hardening round 4 (issue 50), what the independent campaign found (bench/hardening_independent.py,
session 26), one test per class: the adaptive grid's probe bound from what its policy can run; a planted
lock file (symbolic or hard link, FIFO, folder) refused before anything is written; a planted results file
or race.db in ``race pilot``'s folder, a planted ``--plot`` link and a journal storage that is another file
refused before calibration; ``race report --storage`` that would create a storage file; ``race plan`` with
``--design`` and no full run, or F ≤ B; ``--emit ''``; the drift, rate and watch API's ranges, and the
results file's plan and verdicts checked for what they promise."""
from __future__ import annotations

import json
import os
import random

import pytest
from click.testing import CliRunner

from race.core.errors import RaceError
from race.run.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json")


def _one_line(result) -> str:
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and lines[-1].startswith("Error: "), result.output
    return lines[-1]


# ------------------------------------------------------------------ the adaptive grid's probe bound

@pytest.mark.parametrize("policy", ["informative", "halving"])
def test_an_adaptive_policy_runs_the_same_number_of_pilots_whatever_the_scores(policy):
    from race.run.adaptive import adaptive_cap, adaptive_most, adaptive_subset

    for points, seeds, share in ((4, 3, 0.2), (4, 3, 0.5), (4, 3, 1.0), (5, 5, 0.8), (3, 1, 0.5)):
        grid = [0.2 + 0.1 * i for i in range(points)]
        most = adaptive_most(policy, grid, seeds, share)
        assert most <= adaptive_cap(points, seeds, share)
        for seed in range(10):
            rng = random.Random(seed)
            assert len(adaptive_subset(policy, grid, seeds, lambda k: rng.random(), share)) == most
    # halving at a share of 1 stops under the cap: 4 + 2 + 1 of 12
    assert adaptive_most("halving", [0.5, 0.62, 0.74, 0.85], 3, 1.0) == 7 < adaptive_cap(4, 3, 1.0) == 12


def test_the_probe_bound_of_an_adaptive_grid_is_what_its_policy_runs(tmp_path):
    """At F = 300 × B the default grid's 12 pilots could cover 8 % of the run (the probe passes the check),
    but an adaptive share of 0.2 runs 5 of them (3.3 %): refused from the run options, before any compute.
    A study that may already exist (a race.db in the folder) keeps the full grid's bound."""
    from race.fullrun.probe import check_probe_config, cover_bound
    from race.run.api import build_config
    from race.run.options import RunOptions

    cfg = build_config(None)
    F = 300 * cfg.budget
    options = lambda **kw: RunOptions(out_dir=str(tmp_path / "grid"), **kw).check()  # noqa: E731
    assert [options(**kw).most_pilots(cfg) for kw in ({}, {"adaptive": True}, {"adaptive_share": 0.2},
                                                       {"adaptive": "halving", "adaptive_share": 1.0}, {"extend": 2},
                                                       {"adaptive": True, "storage": "sqlite:///x.db"})] \
        == [12, 6, 5, 7, 18, 12]
    assert check_probe_config(cfg, F, pilots=options().most_pilots(cfg)) == pytest.approx(0.08)
    with pytest.raises(RaceError, match=r"cover at most 3\.3% .* 5 pilots"):
        check_probe_config(cfg, F, pilots=options(adaptive_share=0.2).most_pilots(cfg))
    assert cover_bound(cfg, 400 * cfg.budget, pilots=options(adaptive="halving", adaptive_share=1.0).most_pilots(cfg)) \
        == pytest.approx(0.035)
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "race.db").write_bytes(b"")
    assert options(adaptive_share=0.2).most_pilots(cfg) == 12


# ------------------------------------------------------------------ planted files (real links, real FIFOs)

@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo", "folder"])
def test_a_planted_lock_file_is_refused_before_anything_is_written(tmp_path, kind):
    from race.core.safeio import UnsafeWrite, locked

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "run" / "results.json"
    target.parent.mkdir()
    target.write_text("{}")
    lock = target.parent / ".results.json.lock"
    {"symlink": lambda: os.symlink(victim, lock), "hardlink": lambda: os.link(victim, lock),
     "fifo": lambda: os.mkfifo(lock), "folder": lambda: lock.mkdir()}[kind]()
    with pytest.raises(UnsafeWrite, match=r"lock file .* (symbolic link|hard links|not a regular file|folder)"):
        with locked(str(target), wait=0.1):
            pass
    assert victim.read_text() == "precious\n"
    with locked(str(tmp_path / "fresh.json"), wait=0.1):       # RACE's own lock, made and reused
        pass
    with locked(str(tmp_path / "fresh.json"), wait=0.1):
        pass


def test_a_probe_through_a_planted_lock_is_one_line_and_the_victim_kept(tmp_path):
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RESULTS, run / "results.json")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.link(victim, run / ".results.json.lock")
    line = _one_line(CliRunner().invoke(main, ["probe", str(run), "--full-run", "6e11", "--quiet"]))
    assert "hard links" in line and victim.read_text() == "precious\n"


@pytest.mark.parametrize("name", ["results.json", "race.db"])
def test_a_planted_link_in_the_grid_folder_is_refused_before_calibration(tmp_path, name):
    from race.core.safeio import UnsafeWrite
    from race.run import prechecks
    from race.run.api import build_config
    from race.run.options import RunOptions

    (tmp_path / "grid").mkdir()
    os.symlink(tmp_path / "victim.txt", tmp_path / "grid" / name)
    with pytest.raises(UnsafeWrite, match=f"{name}' is a symbolic link"):
        prechecks.run_checks(build_config(None), RunOptions(out_dir=str(tmp_path / "grid")).check())
    assert not (tmp_path / "victim.txt").exists()


def test_a_journal_storage_that_is_another_file_is_refused_before_calibration(tmp_path):
    from race.run import prechecks
    from race.run.api import build_config
    from race.run.options import RunOptions
    from race.run.store.base import StoreError

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    with pytest.raises(StoreError, match="not an optuna journal"):
        prechecks.run_checks(build_config(None), RunOptions(out_dir=str(tmp_path / "g"), storage=f"journal:{notes}").check())
    assert notes.read_text() == "my notes\n"
    journal = tmp_path / "j.log"
    journal.write_text(json.dumps({"op_code": 0, "worker_id": "w"}) + "\n")
    prechecks._journal_file(f"journal:{journal}")         # a journal a grid wrote: fine


def test_a_plot_path_that_is_a_link_is_refused_before_any_pilot(tmp_path):
    from race.run.plot import PlotError, check_plot_path

    os.symlink(tmp_path / "victim.png", tmp_path / "fig.png")
    with pytest.raises(PlotError, match="symbolic link"):
        check_plot_path(str(tmp_path / "fig.png"))


@pytest.mark.parametrize("url", ["sqlite:///{}/none.db", "journal:{}/none.journal", "{}/none.log"])
def test_report_from_a_storage_file_that_is_not_there_creates_none(tmp_path, url):
    """Every file storage form (a ``FILE.log`` path is a journal too: race.core.urls.journal_path)."""
    url = url.format(tmp_path)
    line = _one_line(CliRunner().invoke(main, ["report", "--storage", url, "--study", "x"]))
    assert "does not exist" in line and os.listdir(tmp_path) == []


# ------------------------------------------------------------------ race plan, race recipe

def test_plan_refuses_a_design_without_a_full_run_and_a_full_run_not_above_b(tmp_path):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(json.load(open(RESULTS))["config"]))
    run = lambda *a: CliRunner().invoke(main, ["plan", str(cfg), *a])  # noqa: E731
    assert "--design says how a share" in _one_line(run("--design", "prior"))
    for F in ("3e11", "1e9"):
        assert "is not above the pilot budget 3e+11" in _one_line(run("--full-run", F))
    ok = run("--full-run", "6e12", "--design", "prior")
    assert ok.exit_code == 0 and "design prior" in ok.output


def test_recipe_emit_to_an_empty_name_is_refused(tmp_path):
    line = _one_line(CliRunner().invoke(main, ["recipe", RESULTS, "--for", "trl", "--full-run", "6e11", "--emit", ""]))
    assert "--emit ''" in line


# ------------------------------------------------------------------ the API's ranges

def test_drift_rate_and_watch_refuse_what_they_cannot_mean():
    from race.config.configfile import LearningRate  # noqa: F401  (the rate's type)
    from race.fullrun import watch as W
    from race.stats import drift as D
    from race.stats import rate as R

    nan, inf = float("nan"), float("inf")
    for rng in ((0.0, 0.5), (0.3, 1.0)):
        with pytest.raises(D.DriftError, match=r"rho_range\[[01]\]"):
            D.range_at(rng, 0.45, pilot_budget=1e12, full_run_budget=1e13)
    with pytest.raises(D.DriftError, match="se_own -1"):
        D.shrink(0.1, -1)
    with pytest.raises(D.DriftError, match="d_own inf"):
        D.shrink(inf, 0.1)
    assert D.shrink(nan, 0.1) == (D.POPULATION_DRIFT, D.POPULATION_SPREAD)       # unidentified: as documented
    with pytest.raises(D.DriftError, match=r"obs\[0\]\.y nan"):
        D.fit_joint([D.Observation(level=0, x=0.0, rho=r, y=nan, se=0.01) for r in (0.3, 0.5, 0.7)])
    with pytest.raises(R.RateError, match="learning_rate 'fast' must be a mapping"):
        R.configured_lr({"learning_rate": "fast"})
    with pytest.raises(W.WatchError, match="samples"):
        W.trl_callback(["1+1="], lambda **k: [1.0], samples=10 ** 9)
    with pytest.raises(W.WatchError, match="repeats a fraction"):
        W.trl_callback(["1+1="], lambda **k: [1.0], checkpoints=[0.5, 0.5])


def test_a_results_file_with_a_non_finite_plan_or_an_impossible_verdict_is_refused(tmp_path):
    from race.stats.results import load_results

    text = open(RESULTS).read()
    bad = tmp_path / "inf.json"
    bad.write_text(text.replace('"total": ', '"total": Infinity, "x": ', 1))
    with pytest.raises(RaceError, match=r"plan\.schedules\[0\]\.flops_per_step\.total is not a finite number"):
        load_results(str(bad))
    doc = json.loads(text)
    primary = doc["diagnosis"]["verdicts"][doc["diagnosis"]["primary_target"]]
    for key, value, message in (("confidence", 1.5, "confidence 1.5"), ("best_rho", 0, "best_rho 0")):
        edited = json.loads(text)
        edited["diagnosis"]["verdicts"][doc["diagnosis"]["primary_target"]][key] = value
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(edited))
        with pytest.raises(RaceError, match=message):
            load_results(str(path))
    assert 0 <= primary["confidence"] <= 1 and 0 < primary["best_rho"] < 1
