"""Budget halving (``race pilot --adaptive-policy budget-halving``): the pure rule on hand-made readings
(race.run.adaptive.budget), and one real grid, killed after its first rung and run again, whose
survivors continue from their paused states while the dropped points stop at their rung."""
import json
import math
import os
import signal
import subprocess

import pytest
from conftest import ROOT
from pilot_cli import kill_leftovers, open_study, race, start, wait_for, write_config

from race.core.errors import RaceError
from race.run.adaptive import (BudgetHalving, adaptive_most, budget_halving, halving_cost, resolve_adaptive,
                               rung_marks, rung_survivors)


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    kill_leftovers()


# ------------------------------------------------------------------ the rule, by hand

def test_the_marks_are_the_top_budget_over_powers_of_eta():
    assert rung_marks(9e10) == [1e10, 3e10, 9e10]
    assert rung_marks(8.0, eta=2, rungs=3) == [1.0, 2.0, 4.0, 8.0]
    assert BudgetHalving().marks(9.0) == [1.0, 3.0, 9.0]


def test_a_point_survives_while_its_paired_interval_overlaps_the_best():
    """Paired by seed against the best (0.5): 0.4 trails by 0.1 at every seed (sd 0: out), 0.6 trails by
    0.01, 0.03, 0.02 (d̄ 0.02 ≤ 2 · 0.01 / √3 ≈ 0.0115? no: out) and 0.7 by −0.05, 0.05, 0.03 (d̄ 0.01,
    sd 0.053: in)."""
    read = {0.4: {0: 0.4, 1: 0.5, 2: 0.6}, 0.5: {0: 0.5, 1: 0.6, 2: 0.7},
            0.6: {0: 0.49, 1: 0.57, 2: 0.68}, 0.7: {0: 0.55, 1: 0.55, 2: 0.67}}
    assert rung_survivors(read, eta=1) == [0.5, 0.7]
    # the cap: at most ⌈4 / η⌉ of them, best first
    assert rung_survivors(read, eta=3) == [0.5, 0.7]
    assert rung_survivors(read, eta=4) == [0.5]


def test_the_cap_and_ties():
    # every point reads the same at every seed: all tie with the best (d̄ = 0 ≤ 0), the cap keeps the lower ρ
    same = {r: {0: 0.3, 1: 0.4} for r in (0.8, 0.2, 0.5, 0.6, 0.4)}
    assert rung_survivors(same, eta=3) == [0.2, 0.4]              # ⌈5 / 3⌉ = 2
    assert rung_survivors(same, eta=1) == [0.2, 0.4, 0.5, 0.6, 0.8]
    # one seed: no interval, every point overlaps, the cap ranks them by reading
    one = {0.2: {0: 0.1}, 0.4: {0: 0.5}, 0.6: {0: 0.3}, 0.8: {0: 0.5}}
    assert rung_survivors(one, eta=2) == [0.4, 0.8]
    # a point with no reading (its seeds failed) is dropped, and still counts toward the cap's n
    assert rung_survivors({0.2: {}, 0.4: {0: 0.2}, 0.6: {0: 0.1}}, eta=2) == [0.4, 0.6]
    assert rung_survivors({}) == [] and rung_survivors({0.3: {}}) == []


def test_the_ladder_rung_by_rung():
    grid, seeds = [0.3, 0.5, 0.7, 0.9], 2
    stages, final = budget_halving(grid, seeds, {})
    assert stages == [(r, s, 0) for r in grid for s in range(2)] and not final
    rung0 = {(r, s, 0): v + 0.01 * s for r, v in zip(grid, (0.1, 0.4, 0.38, 0.2)) for s in range(2)}
    stages, final = budget_halving(grid, seeds, rung0)
    # 0.5 best; 0.7 trails by 0.02 at both seeds (sd 0: out); the cap would have allowed 2
    assert stages[8:] == [(0.5, 0, 1), (0.5, 1, 1)] and not final
    stages, final = budget_halving(grid, seeds, {**rung0, (0.5, 0, 1): 0.5, (0.5, 1, 1): 0.5})
    assert stages[10:] == [(0.5, 0, 2), (0.5, 1, 2)] and final
    # a seed given up at rung 0 stops there; its point goes on with the seed it has, and with one seed
    # shared with the best no interval excludes 0.7, so the cap (2) keeps it
    rung0b = {k: v for k, v in rung0.items() if k != (0.5, 1, 0)}
    stages, final = budget_halving(grid, seeds, rung0b, given_up={(0.5, 1, 0)})
    assert stages[8:] == [(0.5, 0, 1), (0.7, 0, 1), (0.7, 1, 1)] and not final


def test_its_compute_bound_and_its_options():
    # 4 points × 3 seeds, all tied: 12 to B/9, ⌈4/3⌉ = 2 points to B/3, ⌈2/3⌉ = 1 to B: 12/9 + 6·2/9 + 3·2/3
    assert adaptive_most("budget-halving", [0.3, 0.5, 0.7, 0.9], 3) == math.ceil(12 / 9 + 12 / 9 + 2)
    assert halving_cost([(0.3, 0, 0), (0.3, 0, 1), (0.3, 0, 2)], budget=9.0) == pytest.approx(9.0)
    assert resolve_adaptive("budget-halving") == "budget-halving"
    from race.run.options import RunOptions

    with pytest.raises(RaceError, match="budget halving spends its compute by rung"):
        RunOptions(out_dir="x", adaptive="budget-halving", adaptive_share=0.5).check()
    with pytest.raises(RaceError, match="budget halving spends its compute by rung"):
        RunOptions(out_dir="x", adaptive="budget-halving", import_pilots="r.json").check()


def test_a_bad_policy_name_is_one_line(tmp_path):
    r = subprocess.run(race("pilot", write_config(tmp_path / "c.yaml"), "--adaptive-policy", "budget-halvin",
                            "--out", tmp_path / "o"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "budget-halving" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ one real grid, killed and run again

def test_budget_halving_pauses_continues_and_survives_a_kill(tmp_path):
    """3 ρ × 2 seeds at a top budget of 3e10: every ρ to 3.3e9, the survivors to 1e10, then to 3e10. The
    coordinator is killed (SIGKILL, its process group) once a rung-1 stage runs; the same command run
    again fails that stage as abandoned, enqueues it again as the same stage and continues: no rung-0
    stage runs twice, the survivors' final results continue their
    paused states (``extra["pauses"]`` at both marks), the dropped points stop at rung 0, and results.json
    records the ladder and the compute."""
    cfg = write_config(tmp_path / "c.yaml", budget=3e10, seeds=2)
    out = tmp_path / "out"
    args = ("pilot", cfg, "--adaptive-policy", "budget-halving", "--out", out, "--heartbeat", 1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = start(args, str(tmp_path / "first"), env=env)
    db = out / "race.db"
    wait_for(lambda: db.exists(), timeout=300, procs=[proc])
    store = open_study(f"sqlite:///{db}", _name(cfg), proc=proc)
    wait_for(lambda: proc.poll() is not None or any(t.user_attrs.get("rung") == 1 and t.state.name == "RUNNING"
                                                    for t in store.trials()), timeout=300, interval=0.1)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    r = subprocess.run(race(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]

    store = open_study(f"sqlite:///{db}", _name(cfg))
    rung0 = [t for t in store.trials() if t.user_attrs.get("rung") == 0 and t.state.name != "FAIL"]
    assert len(rung0) == 6 and all("paused" in t.user_attrs for t in rung0)      # none ran twice
    stale = [t for t in store.trials() if t.state.name == "FAIL"]
    assert all(t.user_attrs.get("stale") and t.user_attrs.get("rung") == 1 for t in stale)   # the killed stage
    assert all(t.user_attrs.get("rung") == 1 for t in store.trials() if t.user_attrs.get("retry_of") is not None)
    readings = store.readings()
    res = json.loads((out / "results.json").read_text())
    record = res["budget_halving"]
    marks = record["marks"]
    assert marks == pytest.approx([3e10 / 9, 3e10 / 3, 3e10])
    top = [p for p in res["pilots"] if "budget_halving" not in p["extra"]]
    dropped = [p for p in res["pilots"] if "budget_halving" in p["extra"]]
    assert top and len(top) + len(dropped) == 6 and len({p["rho_target"] for p in top}) == 1
    for p in top:                                   # continued, not restarted
        pauses = p["extra"]["pauses"]
        assert [q["mark"] for q in pauses] == pytest.approx(marks[:2])
        for rung, q in enumerate(pauses):
            paused = readings[(p["rho_target"], p["seed"], rung)]
            assert q["flops"] == paused.flops.total and q["step"] == paused.steps
        assert p["extra"]["steps"] > pauses[-1]["step"] and p["flops"]["total"] > pauses[-1]["flops"]
        assert abs(p["flops"]["total"] - 3e10) < 0.2 * 3e10
    for p in dropped:                               # stopped at their rung
        assert p["extra"]["budget_halving"]["rung"] == 0
        assert p["flops"]["total"] == readings[(p["rho_target"], p["seed"], 0)].flops.total < marks[1]
        assert (p["rho_target"], p["seed"], 1) not in readings
    assert {d["rho"] for d in record["dropped"]} == {p["rho_target"] for p in dropped}
    c = record["compute"]
    assert c["training_flops"] == pytest.approx(sum(p["flops"]["total"] for p in res["pilots"]))
    assert c["reading_eval_flops"] == pytest.approx(sum(p.eval_flops.total for p in readings.values()))
    assert c["reading_eval_flops"] > 0
    assert c["total_flops"] == pytest.approx(c["training_flops"] + c["reading_eval_flops"] + c["other_eval_flops"])
    assert c["training_flops"] < 0.7 * c["flat_grid_training_flops"]
    assert "budget-halving" in res["diagnosis"]["meta"]["adaptive"]
    from race.stats.results import load_results

    assert len(load_results(str(out)).pilots) == 6          # race report reads it back


def _name(cfg) -> str:
    import yaml

    return yaml.safe_load(open(cfg))["name"]
