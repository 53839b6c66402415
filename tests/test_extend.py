"""Extending a grid past the edge where its best point lies (race.run.extend, race pilot --extend)."""
from __future__ import annotations

import json
import os

import pytest

from race.run import extend as X
from race.run import study
from race.run.api import build_config
from race.core.errors import RaceError
from race.stats.regime import classify, edge_point
from race.stats.results import Results, save_results

from test_regime import synthetic_results

SMALL = {"model": "race/tiny-arith", "budget": 1e10, "grid": [0.5, 0.62, 0.74], "seeds": 1,
         "lengths": {"prompt": 5.9, "completion": 3.5}, "grpo": {"max_completion_len": 6},
         "schedule": {"lower_rho_by": "keep", "min_n_train": 2}, "eval": {"prompts": 30, "samples": 2, "checkpoints": 3}}
CAL = {"prompt_len": 5.9, "completion_len": 3.5, "pass_rate": 0.05, "samples": 64, "seconds": 1.0}


def test_the_next_point_is_one_geometric_grid_step_past_the_edge():
    assert edge_point("below", [0.5, 0.62, 0.74, 0.85]) == 0.40          # 0.5² / 0.62 = 0.403
    assert edge_point("below", [0.3, 0.45, 0.6]) == 0.20                 # 0.3² / 0.45
    assert edge_point("above", [0.5, 0.62, 0.74, 0.85]) == 0.91          # 1 − 0.15² / 0.26 = 0.913
    assert edge_point(None, [0.5, 0.62]) is None and edge_point("below", [0.5]) is None
    assert edge_point("above", [0.9, 0.99]) is None                      # 1 − 0.01² / 0.1 rounds to 1.0: not a ρ
    assert edge_point("below", [0.01, 0.5]) is None                      # 0.0002 rounds to 0: not a ρ


@pytest.mark.parametrize("value, kw, match", [
    (-1, {}, "extend -1: expected a whole number of rounds from 0 to 5"),
    (9, {}, "extend 9"), (True, {}, "extend True"), (1.5, {}, "extend 1.5"),
    (1, {"adaptive": True}, "does not combine with an adaptive grid"),
    (1, {"adaptive_share": 0.5}, "does not combine with an adaptive grid"),
    (1, {"workers": 0}, "workers ≥ 1, not 0"),
])
def test_bad_extend_requests_are_one_line_errors(value, kw, match):
    """--extend is a run option: checked once, with the options it cannot combine with (RunOptions.check)."""
    from race.run.options import RunOptions

    with pytest.raises(RaceError, match=match):
        RunOptions(out_dir="x", extend=value, **kw).check()
    assert RunOptions(out_dir="x", extend=0, adaptive=True, workers=0).check().extend == 0   # nothing to refuse


def test_extend_takes_one_policys_grid(tmp_path):
    from race.run.api import build_config
    from race.run.options import RunOptions

    cfg = build_config(None, models="race/tiny-arith,race/tiny-arith-s")
    with pytest.raises(RaceError, match="one policy's grid"):
        X.run_extended(cfg, RunOptions(out_dir=str(tmp_path / "x"), extend=1))
    assert not (tmp_path / "x").exists()


def test_rounds_extend_while_the_best_is_at_the_edge_and_stop_at_an_unreachable_rho(tmp_path, monkeypatch, capsys):
    """The orchestration, with the grid runs replaced by classified synthetic pilots whose reward
    falls steeply with ρ (so the best is always the lowest point): each round adds one point below
    as its own study, imports the previous round's results from a kept copy, reuses round 0's
    calibration, and the round whose point is unreachable for the schedule is not run."""
    calls = []

    def fake_run_grid(config, options, *, calibration=None, **kw):    # race.run.options.RunOptions, passed whole
        out_dir = options.out_dir
        calls.append({"grid": tuple(config.grid), "study": options.study, "import": options.import_pilots,
                      "cal": calibration})
        pilots = synthetic_results(response=lambda r: -1.0 * r, n_seeds=2, seed_sd=0.002, grid=tuple(config.grid))
        res = Results(pilots=tuple(pilots), diagnosis=classify(pilots, n_boot=200), config=config.to_dict(),
                      plan={"calibration": CAL})
        save_results(out_dir, res)
        return res

    monkeypatch.setattr(study, "run_grid", fake_run_grid)
    cfg = build_config({**SMALL, "schedule": {**SMALL["schedule"], "max_n_gen": 24}})   # lowest reachable ρ 0.285
    res = X.run_extended(cfg, out_dir=str(tmp_path), extend=3, workers=1)
    assert [c["grid"] for c in calls] == [(0.5, 0.62, 0.74), (0.4, 0.5, 0.62, 0.74), (0.32, 0.4, 0.5, 0.62, 0.74)]
    assert [c["study"] for c in calls] == [None, f"{cfg.name}-x1", f"{cfg.name}-x2"]
    assert [c["import"] for c in calls] == [None, str(tmp_path / "results-x0.json"), str(tmp_path / "results-x1.json")]
    assert calls[1]["cal"].completion_len == 3.5 and calls[2]["cal"] == calls[1]["cal"]
    kept = json.loads((tmp_path / "results-x0.json").read_text())
    assert sorted({p["rho_target"] for p in kept["pilots"]}) == [0.5, 0.62, 0.74]      # round 0's record, kept
    assert sorted({p.rho_target for p in res.pilots}) == [0.32, 0.4, 0.5, 0.62, 0.74]
    err = capsys.readouterr().err
    assert "extending the grid to ρ=0.4 (round 1 of 3" in err and "extending the grid to ρ=0.32 (round 2 of 3" in err
    assert "grid not extended below ρ=0.32: ρ=0.26 is unreachable: the lowest reachable is 0.285" in err  # 0.32²/0.4


def test_no_round_runs_when_the_best_is_inside_the_grid(tmp_path, monkeypatch):
    calls = []

    def fake_run_grid(config, options, **kw):
        calls.append(tuple(config.grid))
        pilots = synthetic_results(response=lambda r: -(r - 0.62) ** 2 * 4, n_seeds=2, seed_sd=0.001,
                                   grid=tuple(config.grid))
        return Results(pilots=tuple(pilots), diagnosis=classify(pilots, n_boot=200), config=config.to_dict(),
                       plan={"calibration": CAL})

    monkeypatch.setattr(study, "run_grid", fake_run_grid)
    res = X.run_extended(build_config(SMALL), out_dir=str(tmp_path), extend=2)
    assert calls == [(0.5, 0.62, 0.74)] and res.diagnosis.primary.best_rho == 0.62
    assert not (tmp_path / "results-x0.json").exists()


def test_a_real_round_imports_every_finished_pilot_and_runs_only_the_new_point(tmp_path, monkeypatch):
    """Real pilots: the side is forced to "below" (which side a 1e10 grid's best lands on is chance),
    the rest is the shipped path: calibration reused, the larger grid's plan accepts every imported
    pilot's schedule, and only ρ=0.40 runs."""
    monkeypatch.setattr(X, "boundary_side", lambda v: "below")
    cfg = build_config(SMALL)
    res = X.run_extended(cfg, out_dir=str(tmp_path), extend=1, workers=1, quiet=True)
    first = json.loads((tmp_path / "results-x0.json").read_text())
    assert sorted((p.rho_target, p.seed) for p in res.pilots) == [(0.4, 0), (0.5, 0), (0.62, 0), (0.74, 0)]
    again = {p.rho_target: p for p in res.pilots}
    for p in first["pilots"]:                      # imported as they were: the same held-out scores
        assert list(again[p["rho_target"]].evals["reward"]) == p["evals"]["reward"]
    assert res.plan["calibration"] == first["plan"]["calibration"]
    assert {s["rho_target"] for s in res.plan["schedules"]} == {0.4, 0.5, 0.62, 0.74}
    assert len(res.diagnosis.primary.points) == 4
    assert os.path.isfile(tmp_path / "race.db")


def test_the_cli_refuses_extend_with_an_adaptive_grid_before_anything_is_written(tmp_path):
    from click.testing import CliRunner

    from race.run.cli import main

    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["pilot", "--extend", "1", "--adaptive", "--out", str(out), "--quiet"])
    assert r.exit_code == 2 and "does not combine with an adaptive grid" in r.output
    assert "Traceback" not in r.output and not out.exists()
    r = CliRunner().invoke(main, ["pilot", "--extend", "9", "--out", str(out)])
    assert r.exit_code == 2 and "extend 9: expected a whole number of rounds" in r.output and not out.exists()


def test_results_written_before_a_setting_existed_import_as_run_at_its_default(tmp_path):
    """A results file lacks the settings added after it was written (they ran at their defaults):
    it imports; a setting it has with another value is still refused (race.run.study)."""
    from race.run.prechecks import check_importable
    from race.run.store import StoreError

    cfg = build_config(SMALL)
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("chat_template", "system_prompt")}
    old["eval"] = {k: v for k, v in old["eval"].items() if k != "checker"}
    (tmp_path / "old.json").write_text(json.dumps({"schema_version": 1, "kind": "results", "config": old,
                                                   "pilots": [], "plan": {}, "diagnosis": None}))
    check_importable(cfg, str(tmp_path / "old.json"))
    (tmp_path / "other.json").write_text(json.dumps({"schema_version": 1, "kind": "results", "pilots": [],
                                                     "config": {**old, "budget": 2e10}, "plan": {}, "diagnosis": None}))
    with pytest.raises(StoreError, match="budget is 10000000000.0 here, 20000000000.0 there"):
        check_importable(cfg, str(tmp_path / "other.json"))


def test_a_schedule_kept_at_six_significant_digits_is_the_same_schedule():
    from race.run.prechecks import schedule_difference

    planned = {"rho_target": 0.5, "n_gen": 8, "steps": 885, "flops": {"learning": 302068154422.5, "rho": 0.516297}}
    kept = {"rho_target": 0.5, "n_gen": 8, "steps": 885, "flops": {"learning": 302068000000.0, "rho": 0.5163}}
    assert schedule_difference(planned, kept) is None
    assert schedule_difference(planned, {**kept, "steps": 886}) == ("steps", 885, 886)
    assert schedule_difference(planned, {**kept, "flops": {"learning": 3.03e11, "rho": 0.5163}})[0] == "flops.learning"
