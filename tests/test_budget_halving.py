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
from race.run.adaptive import (BudgetHalving, Ladder, adaptive_most, budget_halving, halving_cost, resolve_adaptive,
                               rung_marks, rung_survivors)


@pytest.fixture(autouse=True)
def _no_leftovers():
    yield
    kill_leftovers()


# ------------------------------------------------------------------ the rule, by hand

def test_the_marks_are_the_top_budget_over_powers_of_eta():
    assert rung_marks(9e10, eta=3, rungs=2) == [1e10, 3e10, 9e10]
    assert rung_marks(8.0, eta=2, rungs=3) == [1.0, 2.0, 4.0, 8.0]
    assert rung_marks(11e10) == [1e10, 11e10] and BudgetHalving().marks(11.0) == [1.0, 11.0]     # the default
    assert BudgetHalving(Ladder(3, 2, "ci")).marks(9.0) == [1.0, 3.0, 9.0]


def test_a_point_survives_while_its_paired_interval_overlaps_the_best():
    """Paired by seed against the best (0.5): 0.4 trails by 0.1 at every seed (sd 0: out), 0.6 trails by
    0.01, 0.03, 0.02 (d̄ 0.02 ≤ 2 · 0.01 / √3 ≈ 0.0115? no: out) and 0.7 by −0.05, 0.05, 0.03 (d̄ 0.01,
    sd 0.053: in)."""
    read = {0.4: {0: 0.4, 1: 0.5, 2: 0.6}, 0.5: {0: 0.5, 1: 0.6, 2: 0.7},
            0.6: {0: 0.49, 1: 0.57, 2: 0.68}, 0.7: {0: 0.55, 1: 0.55, 2: 0.67}}
    assert rung_survivors(read, eta=1, keep="ci") == [0.5, 0.7]
    # the cap: at most ⌈4 / η⌉ of them, best first
    assert rung_survivors(read, eta=3, keep="ci") == [0.5, 0.7]
    assert rung_survivors(read, eta=4, keep="ci") == [0.5]
    assert rung_survivors(read) == [0.5, 0.7]               # the default keeps the best half by mean reading


def test_the_cap_and_ties():
    # every point reads the same at every seed: all tie with the best (d̄ = 0 ≤ 0), the cap keeps the lower ρ
    same = {r: {0: 0.3, 1: 0.4} for r in (0.8, 0.2, 0.5, 0.6, 0.4)}
    assert rung_survivors(same, eta=3, keep="ci") == [0.2, 0.4]              # ⌈5 / 3⌉ = 2
    assert rung_survivors(same, eta=1, keep="ci") == [0.2, 0.4, 0.5, 0.6, 0.8]
    # one seed: no interval, every point overlaps, the cap ranks them by reading
    one = {0.2: {0: 0.1}, 0.4: {0: 0.5}, 0.6: {0: 0.3}, 0.8: {0: 0.5}}
    assert rung_survivors(one, eta=2, keep="ci") == [0.4, 0.8]
    # a point with no reading (its seeds failed) is dropped, and still counts toward the cap's n
    assert rung_survivors({0.2: {}, 0.4: {0: 0.2}, 0.6: {0: 0.1}}, eta=2, keep="ci") == [0.4, 0.6]
    assert rung_survivors({}) == [] and rung_survivors({0.3: {}}) == []


def test_the_ladder_rung_by_rung():
    grid, seeds = [0.3, 0.5, 0.7, 0.9], 2
    old = dict(eta=3, rungs=2, keep="ci")            # two rungs below B, kept by the paired interval
    stages, final = budget_halving(grid, seeds, {}, **old)
    assert stages == [(r, s, 0) for r in grid for s in range(2)] and not final
    rung0 = {(r, s, 0): v + 0.01 * s for r, v in zip(grid, (0.1, 0.4, 0.38, 0.2)) for s in range(2)}
    stages, final = budget_halving(grid, seeds, rung0, **old)
    # 0.5 best; 0.7 trails by 0.02 at both seeds (sd 0: out); the cap would have allowed 2
    assert stages[8:] == [(0.5, 0, 1), (0.5, 1, 1)] and not final
    stages, final = budget_halving(grid, seeds, {**rung0, (0.5, 0, 1): 0.5, (0.5, 1, 1): 0.5}, **old)
    assert stages[10:] == [(0.5, 0, 2), (0.5, 1, 2)] and final
    # a seed given up at rung 0 stops there; its point goes on with the seed it has, and with one seed
    # shared with the best no interval excludes 0.7, so the cap (2) keeps it
    rung0b = {k: v for k, v in rung0.items() if k != (0.5, 1, 0)}
    stages, final = budget_halving(grid, seeds, rung0b, given_up={(0.5, 1, 0)}, **old)
    assert stages[8:] == [(0.5, 0, 1), (0.7, 0, 1), (0.7, 1, 1)] and not final


def test_its_compute_bound_and_its_options():
    # 4 points × 3 seeds, all tied: 12 to B/9, ⌈4/3⌉ = 2 points to B/3, ⌈2/3⌉ = 1 to B: 12/9 + 6·2/9 + 3·2/3
    old = BudgetHalving(Ladder(3, 2, "ci"))
    assert adaptive_most("budget-halving", [0.3, 0.5, 0.7, 0.9], 3, rule=old) == math.ceil(12 / 9 + 12 / 9 + 2)
    # the default ladder: 12 to B/11, the best half (2 points × 3 seeds) on to B: 12/11 + 6·10/11
    assert adaptive_most("budget-halving", [0.3, 0.5, 0.7, 0.9], 3) == math.ceil(12 / 11 + 6 * 10 / 11)
    assert halving_cost([(0.3, 0, 0), (0.3, 0, 1), (0.3, 0, 2)], budget=9.0, eta=3, rungs=2) == pytest.approx(9.0)
    assert resolve_adaptive("budget-halving") == "budget-halving"
    from race.run.options import RunOptions

    with pytest.raises(RaceError, match="budget halving spends its compute by rung"):
        RunOptions(out_dir="x", adaptive="budget-halving", adaptive_share=0.5).check()
    with pytest.raises(RaceError, match="budget halving spends its compute by rung"):
        RunOptions(out_dir="x", adaptive="budget-halving", import_pilots="r.json").check()


def test_the_keep_rule_top_half_and_top_k():
    """The readings of test_a_point_survives…: means 0.5 (0.4), 0.6 (0.5), 0.58 (0.6), 0.59 (0.7). Top half keeps
    the best ⌈4/2⌉ = 2 by mean, with no interval and no η cap; k keeps the best k (all when k ≥ n)."""
    read = {0.4: {0: 0.4, 1: 0.5, 2: 0.6}, 0.5: {0: 0.5, 1: 0.6, 2: 0.7},
            0.6: {0: 0.49, 1: 0.57, 2: 0.68}, 0.7: {0: 0.55, 1: 0.55, 2: 0.67}}
    assert rung_survivors(read, keep="top-half") == [0.5, 0.7]
    assert rung_survivors(read, eta=11, keep="top-half") == [0.5, 0.7]     # the ci cap ⌈4/11⌉ = 1 does not apply
    assert rung_survivors(read, keep=3) == [0.5, 0.7, 0.6]                  # 0.6 was out under ci (d̄ > 2 SE)
    assert rung_survivors(read, keep=1) == [0.5] and rung_survivors(read, keep=9) == [0.5, 0.7, 0.6, 0.4]
    # five points: ⌈5/2⌉ = 3; a point with no reading counts in n, is never kept; ties: the lower ρ first
    same = {r: {0: 0.3} for r in (0.8, 0.2, 0.5, 0.6)}
    assert rung_survivors({**same, 0.9: {}}, keep="top-half") == [0.2, 0.5, 0.6]


def test_a_one_rung_ladder():
    """Every ρ to B/9 (η 9, one rung), the best half continued to B: 4 ρ × 3 seeds cost 12/9 + 6 · 8/9 = 6.67 B,
    0.56 of the flat grid's 12 B (the replay's 0.55)."""
    lad = Ladder(eta=9, rungs=1, keep="top-half")
    assert lad.marks(9e11) == [1e11, 9e11] and BudgetHalving(lad).marks(9.0) == [1.0, 9.0]
    assert Ladder(eta=11, rungs=1).marks(11.0) == [1.0, 11.0]
    grid = [0.25, 0.4, 0.55, 0.7]
    stages, final = budget_halving(grid, 3, {}, eta=9, rungs=1, keep="top-half")
    assert stages == [(r, s, 0) for r in grid for s in range(3)] and not final
    rung0 = {(r, s, 0): v for r, v in zip(grid, (0.3, 0.5, 0.45, 0.2)) for s in range(3)}
    stages, final = budget_halving(grid, 3, rung0, eta=9, rungs=1, keep="top-half")
    assert stages[12:] == [(0.4, s, 1) for s in range(3)] + [(0.55, s, 1) for s in range(3)] and final
    assert halving_cost(stages, eta=9, rungs=1) == pytest.approx(12 / 9 + 6 * 8 / 9)
    assert adaptive_most("budget-halving", grid, 3, rule=BudgetHalving(lad)) == math.ceil(12 / 9 + 6 * 8 / 9)
    # what the study stores of it; the default is the replayed and live-checked ladder; a stored study
    # that does not name a key ran the old default's (η 3, two rungs, ci)
    assert BudgetHalving(lad).stored == {"policy": "budget-halving", "eta": 9, "rungs": 1, "keep": "top-half"}
    assert BudgetHalving().stored == {"policy": "budget-halving", "eta": 11, "rungs": 1, "keep": "top-half"}
    assert Ladder.from_stored({"policy": "budget-halving", "eta": 3, "rungs": 2}) == Ladder(3, 2, "ci")  # before keep
    assert Ladder.from_stored({"policy": "budget-halving"}) == Ladder(3, 2, "ci")
    assert Ladder.from_stored(BudgetHalving().stored) == Ladder() == Ladder(11, 1, "top-half")
    assert "B/9 then B, keeping the best half" in BudgetHalving(lad).description


def test_the_ladder_options_are_checked_once():
    from race.run.options import RunOptions

    def opts(ladder, policy="budget-halving"):
        return RunOptions(out_dir="x", adaptive=policy, halving_ladder=ladder).check()

    assert opts({"eta": "11", "rungs": "1", "keep": "top-half"}).rule == BudgetHalving(Ladder(11, 1, "top-half"))
    assert opts({"keep": "2"}).rule == BudgetHalving(Ladder(11, 1, 2))
    assert opts({"eta": "3", "rungs": "2", "keep": "ci"}).rule == BudgetHalving(Ladder(3, 2, "ci"))
    assert opts(None).rule == BudgetHalving() and opts({}).rule == BudgetHalving()
    for bad, what in [({"eta": "1"}, r"halving eta '1': expected a whole number ≥ 2"),
                      ({"eta": 2.5}, r"halving eta '2.5'"), ({"rungs": "0"}, r"halving rungs '0': expected"),
                      ({"keep": "half"}, r"halving keep 'half': expected ci, top-half or a whole number"),
                      ({"keep": "0"}, r"halving keep '0'"), ({"keep": True}, r"halving keep 'True'"),
                      ({"eta": 10, "rungs": 4}, r"lowest mark B/10000 is below B/1000"),
                      ({"eta": 3, "step": 2}, r"expected a mapping of eta, rungs and keep"),
                      ("11,1", r"expected a mapping of eta, rungs and keep")]:
        with pytest.raises(RaceError, match=what) as e:
            opts(bad)
        assert "\n" not in str(e.value)
    with pytest.raises(RaceError, match=r"shapes budget halving: expected --adaptive-policy budget-halving"):
        opts({"eta": 11}, policy="halving")
    with pytest.raises(RaceError, match=r"shapes budget halving"):
        RunOptions(out_dir="x", halving_ladder={"eta": 11}).check()


def test_a_bad_ladder_on_the_command_line_is_one_line(tmp_path):
    r = subprocess.run(race("pilot", write_config(tmp_path / "c.yaml"), "--adaptive-policy", "budget-halving",
                            "--halving-keep", "half", "--out", tmp_path / "o"), cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("Error: halving keep 'half'")
    assert "Traceback" not in r.stderr and not (tmp_path / "o" / "race.db").exists()


def test_a_bad_policy_name_is_one_line(tmp_path):
    r = subprocess.run(race("pilot", write_config(tmp_path / "c.yaml"), "--adaptive-policy", "budget-halvin",
                            "--out", tmp_path / "o"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "budget-halving" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------ one real grid, killed and run again

def test_budget_halving_pauses_continues_and_survives_a_kill(tmp_path):
    """3 ρ × 2 seeds at a top budget of 3e10 on a two-rung ladder (η 3, keep ci): every ρ to 3.3e9, the
    survivors to 1e10, then to 3e10. The
    coordinator is killed (SIGKILL, its process group) once a rung-1 stage runs; the same command run
    again fails that stage as abandoned, enqueues it again as the same stage and continues: no rung-0
    stage runs twice, the survivors' final results continue their
    paused states (``extra["pauses"]`` at both marks), the dropped points stop at rung 0, and results.json
    records the ladder and the compute."""
    cfg = write_config(tmp_path / "c.yaml", budget=3e10, seeds=2)
    out = tmp_path / "out"
    args = ("pilot", cfg, "--adaptive-policy", "budget-halving", "--halving-eta", 3, "--halving-rungs", 2,
            "--halving-keep", "ci", "--out", out, "--heartbeat", 1)
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


def test_a_one_rung_top_half_ladder_runs_and_is_recorded(tmp_path):
    """The replay's design live (η 9 here, one rung, top half): 3 ρ × 2 seeds to B/9, the best ⌈3/2⌉ = 2 ρ
    continued to B, the third stopped at rung 0; results.json records the ladder; the same study asked to
    run another ladder is refused in one line."""
    cfg = write_config(tmp_path / "c.yaml", budget=3e10, seeds=2)
    out = tmp_path / "out"
    ladder = ("--halving-eta", "9", "--halving-rungs", "1", "--halving-keep", "top-half")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(race("pilot", cfg, "--adaptive-policy", "budget-halving", *ladder, "--out", out),
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    record = res["budget_halving"]
    assert (record["eta"], record["rungs"], record["keep"]) == (9, 1, "top-half")
    assert record["marks"] == pytest.approx([3e10 / 9, 3e10]) and len(record["ladder"]) == 2
    top = [p for p in res["pilots"] if "budget_halving" not in p["extra"]]
    dropped = [p for p in res["pilots"] if "budget_halving" in p["extra"]]
    assert len(top) == 4 and len({p["rho_target"] for p in top}) == 2 and len(dropped) == 2
    assert all(p["extra"]["budget_halving"]["rung"] == 0 for p in dropped)
    best = sorted({p["rho_target"] for p in top})
    means = {r["rho"]: [] for r in record["ladder"][0]["readings"]}
    for x in record["ladder"][0]["readings"]:
        means[x["rho"]].append(x["reading"])
    order = sorted(means, key=lambda r: (-sum(means[r]) / len(means[r]), r))
    assert best == sorted(order[:2])                        # the best half by mean reading at B/9
    assert "keep top-half" in res["diagnosis"]["meta"]["budget_halving"]
    r = subprocess.run(race("pilot", cfg, "--adaptive-policy", "budget-halving", "--halving-eta", "3", "--out", out),
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error: study ") and "the ladder asked for" in r.stderr


def _name(cfg) -> str:
    import yaml

    return yaml.safe_load(open(cfg))["name"]
