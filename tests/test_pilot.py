"""Real pilots on the shipped tiny policy: reward rises, runs are reproducible, processes isolate."""
import json

import pytest

from race.run.api import build_config
from race.flops.grid import plan_grid


def test_short_grpo_run_raises_heldout_accuracy(torch_one_thread):
    """A seeded on-policy pilot of 2e11 FLOPs lifts held-out sampled accuracy by ≥ 0.05.

    Evaluation: 500 held-out problems × 4 samples at temperature 1 (evaluation noise ≈ 0.008)."""
    from race.engine.evaluation import evaluate
    from race.engine.loading import load_rollout
    from race.engine.pilot import run_pilot
    from race.tasks.rewards import get_reward
    from race.tasks import load_task

    cfg = build_config(None, budget=2e11, grid="0.6,0.73,0.84")
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[1]
    assert (schedule.n_gen, schedule.n_train, schedule.mu) == (8, 8, 1)           # on-policy
    _, backend = load_rollout(cfg)
    base = evaluate(backend, load_task(cfg.task, split="eval", n=500),
                    get_reward("sparse"), samples=4, temperature=1.0, max_new_tokens=6, seed=0)
    result = run_pilot(cfg, schedule, seed=0)
    before = sum(base["pass@1"]) / 500
    after = result.score("pass@1")
    assert after - before >= 0.05, (before, after)
    assert result.flops.total == pytest.approx(2e11, rel=0.02)          # stops at its budget
    assert abs(result.rho - schedule.rho) < 0.03                        # measured ρ near the plan
    assert result.curve[-1][0] == result.flops.total
    assert result.extra["reward_errors"] == 0
    import torch
    import transformers

    assert result.extra["software"]["torch"] == torch.__version__          # the versions it ran with
    assert result.extra["software"]["transformers"] == transformers.__version__


def test_same_seed_same_curves_in_fresh_folders(tmp_path):
    """Two grids with the same seeds, each pilot in its own process, give identical results."""
    from race.run.study import run_grid
    cfg = build_config({**_tiny_dict(), "budget": 2e10, "grid": [0.6, 0.75, 0.92], "seeds": 1,
                        "eval": {"prompts": 100, "samples": 2}})
    a = run_grid(cfg, out_dir=str(tmp_path / "a"), quiet=True)
    b = run_grid(cfg, out_dir=str(tmp_path / "b"), quiet=True)
    assert [p.status for p in a.pilots] == ["complete"] * 3
    assert [p.curve for p in a.pilots] == [p.curve for p in b.pilots]
    assert [p.evals for p in a.pilots] == [p.evals for p in b.pilots]
    assert a.diagnosis == b.diagnosis
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["schema_version"] == 1 and len(saved["pilots"]) == 3
    assert saved["diagnosis"]["regime"] == a.diagnosis.regime.value


def _tiny_dict():
    from race.config import presets

    return dict(presets.DEFAULT)


def test_a_dying_pilot_takes_only_itself_down():
    """One pilot process exits abruptly mid-run; the others finish and the failure is recorded."""
    import os

    import crash_reward
    from race.run.processes import Job, finished_results, run_jobs

    for path in (crash_reward.MARKER, crash_reward.MARKER + ".taken"):
        if os.path.exists(path):
            os.remove(path)
    open(crash_reward.MARKER, "w").close()
    cfg = build_config({**_tiny_dict(), "budget": 2e10, "grid": [0.6, 0.73, 0.84],
                        "reward": {"kind": "custom", "function": "crash_reward:reward"},
                        "eval": {"prompts": 50, "samples": 2}})
    jobs = [Job(s, 0) for s in plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules]
    results = finished_results(run_jobs(cfg, jobs, workers=2))
    statuses = sorted(r.status for r in results)
    assert statuses == ["complete", "complete", "failed"], [(r.status, r.extra.get("error")) for r in results]
    failed = next(r for r in results if r.status == "failed")
    assert "killed by signal 9" in failed.extra["error"]
    os.remove(crash_reward.MARKER + ".taken")


def test_a_stopped_caller_takes_its_pilots_down_and_they_print_nothing(capfd):
    """The caller is stopped mid-grid (SIGTERM and Ctrl-C reach the caller as an exception while it
    reads run_jobs' events): every pilot process ends before the exception leaves the block that
    reads them, and none prints a traceback after it (CI once saw a child's BrokenPipeError below
    `race pilot`'s one last line)."""
    import contextlib
    import os
    import time

    from race.run.processes import Job, Progressed, Started, run_jobs

    cfg = build_config({**_tiny_dict(), "budget": 2e11, "grid": [0.6, 0.73, 0.84], "eval": {"prompts": 50, "samples": 2}})
    jobs = [Job(s, 0) for s in plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules]
    pids: list[int] = []

    with pytest.raises(KeyboardInterrupt), contextlib.closing(run_jobs(cfg, jobs, workers=2, poll=0.1)) as events:
        for event in events:
            if isinstance(event, Started):
                pids.append(event.pid)
            elif isinstance(event, Progressed):
                raise KeyboardInterrupt
    assert pids
    for pid in pids:                       # reaped: no such process (not even a zombie) any more
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    time.sleep(1.0)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]


def test_hf_peft_path_runs_a_pilot(torch_one_thread):
    """With the lean path off (or for other architectures) the pilot runs HF + peft, whole sequences."""
    from peft import PeftModel

    from race.engine.pilot import run_pilot
    from race.engine.seed_axis import SeedAxisEngine

    cfg = build_config({**_tiny_dict(), "budget": 3e10, "grid": [0.6, 0.73, 0.84], "seeds": 1,
                        "grpo": {**_tiny_dict()["grpo"], "fast_path": False}, "eval": {"prompts": 50, "samples": 2}})
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[1]
    assert isinstance(SeedAxisEngine(cfg, schedule, [0]).policy, PeftModel)
    result = run_pilot(cfg, schedule, seed=0)
    assert result.status == "complete" and result.extra["steps"] > 5
    assert result.flops.total == pytest.approx(3e10, rel=0.05)
    assert abs(result.rho - schedule.rho) < 0.03


def test_eta_is_the_pace_so_far_times_what_is_left():
    from race.run.processes import eta_seconds

    assert eta_seconds(elapsed=60.0, done=3, total=12) == pytest.approx(180.0)   # 20 s a pilot, 9 left
    assert eta_seconds(elapsed=60.0, done=12, total=12) == 0.0
    assert eta_seconds(elapsed=5.0, done=0, total=12) == 0.0                   # no pace yet
    # running pilots count by the share of their work done: 3 done, 3 at 90 % → 5.7 units in 77 s
    assert eta_seconds(elapsed=77.0, done=3, total=12, running=[0.9] * 3) == pytest.approx(77.0 / 5.7 * 6.3)
    assert eta_seconds(elapsed=10.0, done=0, total=4, running=[0.5, 1.5, -1.0]) == pytest.approx(10.0 / 1.5 * 2.5)


def test_the_progress_lines_eta_counts_a_group_that_is_almost_done(capsys):
    """The default grid's first line: the first seed of a group of 3 finishes, its two others at their budget, while
    the other group of 3 is at 95 % of its own. Counting pilots alone said about 840 s left at 77 s (11 more pilots
    at 77 s each, where the run ended 75 s later); by work it is 5.85 units in 77 s, 6.15 to go: about 81 s. A
    continued stage of budget halving counts from where it started, towards its own mark."""
    from race.core.records import FlopBreakdown, PilotResult
    from race.run.processes import Job, Progress

    schedules = plan_grid(build_config(None), prompt_len=5.9, completion_len=3.5).schedules
    progress = Progress(12, 6e11)
    progress.t0 -= 77.0
    for seed in range(3):
        progress.update(Job(schedules[0], seed), step=1, spent=0.0)
        progress.update(Job(schedules[0], seed), step=800, spent=0.95 * 6e11)
        progress.update(Job(schedules[1], seed), step=1, spent=0.0)
        progress.update(Job(schedules[1], seed), step=694, spent=6e11)
    done = PilotResult(rho_target=schedules[1].rho_target, seed=0, flops=FlopBreakdown(search=2.3e11, learning=3.7e11),
                       evals={"reward": [0.5]}, schedule=None, wall_seconds={"update": 23.0})
    progress.finish(Job(schedules[1], 0), done)
    line = capsys.readouterr().err
    left = float(line.split("~")[1].split(" s left")[0])
    assert left == pytest.approx(77.0 / 5.85 * 6.15, abs=1.5)              # 1 done + 2 × 1 + 3 × 0.95 units
    stage = Job(schedules[2], 0, stop_at=3e11, state_dir="x", resume_from="y")
    progress.update(stage, step=10, spent=1e11)          # continued from the rung below at 1e11
    progress.update(stage, step=20, spent=2e11)
    assert progress._share[stage.key] == pytest.approx(0.5)


def test_the_wall_split_of_a_grid_by_hand():
    """race.run.processes.wall_split: two pilots on 2 slots for 10 s (process lifetimes 9 s and 8 s):
    counted work, held-out evaluation, loading, the rest of a process's life and idle slots, by hand;
    each part over the slots is its share of the pool's wall, and they sum to it."""
    from race.core.records import FlopBreakdown, PilotResult
    from race.run.processes import render_wall_split, wall_split

    def pilot(seed, walls, status="complete"):
        return PilotResult(rho_target=0.6, seed=seed, flops=FlopBreakdown(search=1e9, learning=2e9), evals={},
                           schedule=None, wall_seconds=walls, status=status)

    a = pilot(0, {"setup": 1.0, "rollout": 2.0, "reward": 0.5, "update": 3.0, "sync": 0.5, "eval": 0.5,
                  "checkpoints": 0.5})
    b = pilot(1, {"setup": 1.0, "rollout": 2.0, "reward": 0.0, "update": 2.0, "sync": 0.0, "eval": 1.0})
    pool = {"seconds": 10.0, "slots": 2, "process_seconds": 17.0, "idle_seconds": 3.0}
    split = wall_split([a, b], pool, calibration_seconds=2.0, total_seconds=13.0)
    assert split["slot_seconds"] == {"counted_work": 10.0, "held_out_eval": 2.0, "loading": 2.0,
                                     "process_start_and_other": 3.0, "idle": 3.0}
    assert sum(split["slot_seconds"].values()) == 2 * 10.0
    assert split["coordination_seconds"] == 1.0 and split["counted_flops"] == 6e9
    lines = render_wall_split(split, peak_flop_s=1e9)
    assert lines[0] == "wall 13.0 s; the pilot pool 10.0 s on 2 slots:"
    assert "counted pilot work" in lines[1] and "5.0 s" in lines[1]
    assert lines[-2] == "counted FLOPs 6e+09; at the matmul peak (1 GFLOP/s) 6.0 s: 46.2% of the physical limit"
    assert lines[-1] == "counted work runs at 0.6 GFLOP/s per slot: 120.0% of a slot's peak"
    # budget halving: a stage paused at its rung and dropped there is pilot work too (its rung reading held-out
    # evaluation), not "process start and the rest"; its training FLOPs are counted (a review of session 39)
    from race.engine.continuation import PilotPaused

    dropped = PilotPaused(rho_target=0.85, seed=0, mark=1e9, flops=FlopBreakdown(search=4e8, learning=6e8), steps=3,
                          evals={}, wall_seconds={"setup": 0.5, "rollout": 1.0, "update": 1.0, "readings": 0.5})
    pool = {"seconds": 10.0, "slots": 2, "process_seconds": 17.0 + 3.0, "idle_seconds": 0.0}
    split = wall_split([a, b], pool, stopped=[dropped])
    assert split["slot_seconds"] == {"counted_work": 12.0, "held_out_eval": 2.5, "loading": 2.5,
                                     "process_start_and_other": 3.0, "idle": 0.0}
    assert split["counted_flops"] == 7e9
