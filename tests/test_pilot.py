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
    from race.run.processes import Job, run_jobs

    for path in (crash_reward.MARKER, crash_reward.MARKER + ".taken"):
        if os.path.exists(path):
            os.remove(path)
    open(crash_reward.MARKER, "w").close()
    cfg = build_config({**_tiny_dict(), "budget": 2e10, "grid": [0.6, 0.73, 0.84],
                        "reward": {"kind": "custom", "function": "crash_reward:reward"},
                        "eval": {"prompts": 50, "samples": 2}})
    jobs = [Job(s, 0) for s in plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules]
    results = run_jobs(cfg, jobs, workers=2)
    statuses = sorted(r.status for r in results)
    assert statuses == ["complete", "complete", "failed"], [(r.status, r.extra.get("error")) for r in results]
    failed = next(r for r in results if r.status == "failed")
    assert "killed by signal 9" in failed.extra["error"]
    os.remove(crash_reward.MARKER + ".taken")


def test_a_stopped_caller_takes_its_pilots_down_and_they_print_nothing(capfd):
    """The caller is stopped mid-grid (SIGTERM and Ctrl-C reach run_jobs as an exception): every
    pilot process ends before the exception leaves run_jobs, and none prints a traceback after it
    (CI once saw a child's BrokenPipeError below `race pilot`'s one last line)."""
    import os
    import time

    from race.run.processes import Job, run_jobs

    cfg = build_config({**_tiny_dict(), "budget": 2e11, "grid": [0.6, 0.73, 0.84], "eval": {"prompts": 50, "samples": 2}})
    jobs = [Job(s, 0) for s in plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules]
    pids: list[int] = []

    def stop(job, step, spent):  # noqa: ANN001, ARG001
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_jobs(cfg, jobs, workers=2, on_start=lambda job, pid: pids.append(pid), on_progress=stop, poll=0.1)
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
