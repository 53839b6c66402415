"""race.run.options.RunOptions: one typed object for how a grid runs, checked once and passed down whole
(issue 34); and race pilot --help grouped by concern."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from race.run.cli import main
from race.core.errors import RaceError
from race.run.options import RunOptions


def test_run_options_are_checked_once_in_one_line():
    ok = RunOptions(out_dir="runs/x", workers=2, adaptive="halving", adaptive_share=0.5).check()
    assert ok.run_grid_kw()["workers"] == 2 and "extend" not in ok.run_grid_kw()
    assert ok.with_(study="s-x1").study == "s-x1" and ok.study is None          # frozen: a round is a copy
    for bad, msg in (({"workers": -1}, "workers -1: expected a whole number from 0 (coordinate only) to 256"),
                     ({"workers": True}, "workers True"), ({"retries": -2}, "retries -2"),
                     ({"engine": "turbo"}, "engine 'turbo' is unknown"),
                     ({"adaptive_share": 1.5}, "adaptive share 1.5"), ({"heartbeat": 0}, "heartbeat 0"),
                     ({"out_dir": ""}, "out_dir ''")):
        with pytest.raises(RaceError, match=re.escape(msg)):
            RunOptions(**{"out_dir": "runs/x", **bad}).check()
    with pytest.raises(TypeError, match="unexpected run option"):
        RunOptions.from_kwargs(out_dir="x", wokers=2)
    with pytest.raises(RaceError, match=re.escape("profile splits the wall time of the pilots run here: with "
                                                   "workers 0 they run in race worker")):
        RunOptions(out_dir="runs/x", workers=0, profile=True).check()       # it crashed after the grid before
    from race.run.options import ladder

    for given in ({"rungs": 5000}, {"rungs": 10**8}, {"eta": "9" * 5000}):   # refused at once, no η^rungs computed
        with pytest.raises(RaceError, match="halving"):
            ladder(given)


def test_a_grid_over_models_refuses_the_options_of_one_grid(tmp_path):
    """--profile and a halving ladder shape one grid: a grid over models refuses them before any pilot (they were
    silently dropped)."""
    for extra in (["--profile"], ["--adaptive-policy", "budget-halving", "--halving-eta", "3"]):
        out = tmp_path / extra[-1].strip("-")
        r = CliRunner().invoke(main, ["pilot", "--models", "race/tiny-arith-s,race/tiny-arith", "--budget", "2e10",
                                      "--seeds", "1", "--out", str(out), *extra])
        assert r.exit_code == 2 and "run a policy alone" in r.output and not out.exists(), r.output


def test_race_pilot_help_groups_its_options_and_json_is_a_deprecated_alias(tmp_path):
    out = CliRunner().invoke(main, ["pilot", "--help"]).output
    heads = [line for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert heads[:6] == ["Grid:", "Engine:", "Storage:",
                         "Adaptive grid (one concept: --adaptive, its policy and its share):", "Full run:", "Output:"]
    assert out.index("--budget") < out.index("Engine:") < out.index("--workers") < out.index("Storage:")
    assert "Deprecated: use --format json" in out
    r = CliRunner().invoke(main, ["pilot", "--json", "--grid", "0.5,1.4,0.7"])
    assert r.exit_code == 2 and "warning: --json is deprecated: use --format json" in r.stderr


def test_the_checks_before_a_run_are_one_table_run_in_order(tmp_path, monkeypatch):
    """race.run.prechecks.CHECKS runs in its order, and the first failure stops the rest: here the grid
    check refuses a one-point grid before the later checks (memory, engine) run or anything is written."""
    from race.run import prechecks
    from race.run.api import build_config
    from race.core.errors import ConfigError
    from race.run.options import RunOptions

    names = [c.name for c in prechecks.CHECKS]
    assert len(set(names)) == len(names) and names[0] == "one policy" and names[-1] == "engine"
    ran = []
    monkeypatch.setattr(prechecks, "CHECKS", tuple(
        prechecks.Check(c.name, c.refuses, (lambda c: lambda cfg, o: (ran.append(c.name), c.run(cfg, o)))(c))
        for c in prechecks.CHECKS))
    cfg = build_config(None, grid="0.5")
    with pytest.raises(ConfigError, match=r"grid \[0.5\] has 1 point"):
        prechecks.run_checks(cfg, RunOptions(out_dir=str(tmp_path / "out")).check())
    assert ran == names[:names.index("grid points") + 1]
    assert not (tmp_path / "out").exists()


# every run option with a rule: a bad value, and the start of the one line RunOptions.check gives
BAD_OPTIONS = {
    "out_dir": ("", "out_dir ''"),
    "workers": (-1, "workers -1: expected a whole number from 0 (coordinate only) to 256"),
    "retries": (-2, "retries -2: expected a whole number from 0 to 100"),
    "extend": (9, "extend 9: expected a whole number of rounds from 0 to 5"),
    "heartbeat": (0, "heartbeat 0: expected seconds from 1 to 3600"),
    "engine": ("turbo", "engine 'turbo' is unknown: expected one of auto, lockstep, solo"),
    "adaptive": ("bisect", "adaptive policy 'bisect' is not known: expected one of informative, halving"),
    "adaptive_share": (1.5, "adaptive share 1.5 is outside (0, 1]"),
    # budget halving's ladder, given without budget halving (its values: tests/test_budget_halving.py)
    "halving_ladder": ({"eta": 11}, "a halving ladder (--halving-eta, --halving-rungs, --halving-keep) shapes budget "
                                    "halving: expected --adaptive-policy budget-halving with it"),
}
# what is not checked: free text or paths a later step opens (and reports in its own line); ``design`` is the
# record race.run.sizing builds, never a user's value (its one rule, no adaptive or extend beside it, is
# checked by RunOptions.check and tested in tests/test_sizing.py); ``profile`` is a flag
UNCHECKED = {"storage", "study", "device", "quiet", "import_pilots", "design", "profile"}


def test_every_run_option_is_checked_in_exactly_one_place(tmp_path):
    """Issue 52: each RunOptions field with a rule is refused by RunOptions.check, by ``race pilot`` and
    by ``race.diagnose`` with that same line (the face builds the options and checks them, nothing
    else does), and no other module of race/ holds the rule's words."""
    import pathlib
    from dataclasses import fields

    import race
    from race.run.options import RunOptions

    assert {f.name for f in fields(RunOptions)} == set(BAD_OPTIONS) | UNCHECKED
    flags = {"workers": "--workers", "retries": "--retries", "extend": "--extend", "heartbeat": "--heartbeat",
             "engine": "--engine", "adaptive": "--adaptive-policy", "adaptive_share": "--adaptive-share"}
    for name, (bad, line) in BAD_OPTIONS.items():
        with pytest.raises(RaceError, match=re.escape(line)):
            RunOptions(**{"out_dir": "runs/x", name: bad}).check()
        if name in flags:
            out = tmp_path / name
            r = CliRunner().invoke(main, ["pilot", flags[name], str(bad), "--out", str(out)])
            assert r.exit_code == 2 and f"Error: {line}" in r.output and not out.exists(), (name, r.output)
        if name not in ("out_dir", "retries", "heartbeat"):          # race.diagnose's own keywords
            with pytest.raises(RaceError, match=re.escape(line)):
                race.diagnose(out_dir=str(tmp_path / f"d-{name}"), **{name: bad})
            assert not (tmp_path / f"d-{name}").exists()
    root = pathlib.Path(race.__file__).parent
    words = ["expected a whole number from 0 (coordinate only)", "adaptive share {",
             "expected a whole number of rounds", "expected seconds from 1 to 3600", "expected one of {', '.join(ENGINES)}",
             "is not known: expected one of"]
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        held = [w for w in words if w in text]
        owner = {"options.py": words[:5], "__init__.py": words[5:]}.get(path.name, [])
        if path.parent.name not in ("run", "adaptive"):
            owner = []
        assert set(held) <= set(owner), (str(path.relative_to(root)), held)
