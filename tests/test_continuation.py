"""Pausing a pilot at a FLOP mark and continuing it (race.engine.continuation, issue 49 item 2's base).

The identity: a pilot paused at a third of its budget and resumed (in a new process, then again in
a fresh engine, alone or in its lockstep group) ends with the ``PilotResult`` of the same pilot run
straight through, bit for bit, but for its seconds and ``extra["pauses"]``; on the lean path (a
lockstep group of two seeds, a cosine schedule with warm-up, held-out checkpoints) and on peft.
Then every bad state is refused in one line before a model loads: missing, a link, damaged, not a
state, another config, ρ, seed or library version, a mark not past the state, a bad mark."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(fast_path: bool = True, budget: float = 1.2e10, checkpoints: int = 8, prompts: int = 40):
    """The tiny policy's config with a cosine schedule (warm-up 0.1): the schedule's position is part
    of the state."""
    from dataclasses import replace

    from race.run.api import build_config

    cfg = build_config(None, budget=budget, grid="0.6,0.73,0.84")
    return replace(cfg, eval=replace(cfg.eval, prompts=prompts, samples=2, checkpoints=checkpoints,
                                     checkpoint_prompts=min(20, prompts) if checkpoints else None),
                   grpo=replace(cfg.grpo, fast_path=fast_path),
                   learning_rate=replace(cfg.learning_rate, schedule="cosine", warmup=0.1))


def _schedule(cfg, point: int = 0):
    from race.flops.grid import plan_grid

    return plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[point]


def _untimed(result) -> dict:
    """A result or a pause as plain values without its seconds and ``extra["pauses"]``."""
    d = json.loads(json.dumps(result.to_dict()))
    d.pop("wall_seconds", None)
    d["extra"] = {k: v for k, v in d.get("extra", {}).items() if k != "pauses"}
    for c in d.get("checkpoints", []):
        c.pop("seconds")
    return d


RESUME = """
import json, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {root!r})
from tests.test_continuation import _config, _schedule
from race.engine.pilot import run_pilots
cfg = _config()
out = run_pilots(cfg, _schedule(cfg), [0, 1], stop_at={mark!r}, state_dir={state_dir!r}, resume=True)
json.dump([p.to_dict() for p in out], open({out!r}, "w"))
"""


def _check_pause(pause, straight, mark: float) -> None:
    """A pause at ``mark`` is the straight pilot's prefix: where a pilot of budget ``mark`` would stop."""
    from race.engine.continuation import PilotPaused

    assert isinstance(pause, PilotPaused) and pause.seed == straight.seed and pause.mark == mark
    n, spent = pause.steps, [0.0] + [f for f, _ in straight.curve]
    assert 1 < n < straight.extra["steps"] and pause.curve == straight.curve[:n]
    # where a pilot of budget ``mark`` stops: the last step began below the mark, the next would overshoot
    # it by more than half a step (PilotLoop's rule)
    assert pause.flops.total == spent[n] and spent[n - 1] < mark < spent[n] + 0.5 * (spent[n] - spent[n - 1])
    assert _untimed_cps(pause.checkpoints) == _untimed_cps(c for c in straight.checkpoints if c.step <= n)
    assert set(pause.evals) == set(straight.evals) and len(pause.evals["reward"]) == len(straight.evals["reward"])
    assert pause.eval_flops.total > 0 and 0 <= pause.score("reward") <= 1 and os.path.isfile(pause.state_file)


def _untimed_cps(cps) -> list:
    return [{k: v for k, v in c.to_dict().items() if k != "seconds"} for c in cps]


def test_a_lean_group_paused_twice_and_resumed_in_a_new_process_is_the_straight_run(torch_one_thread, tmp_path):
    """Seeds 0 and 1 in lockstep: straight to the budget, against paused at 1/3 (here), resumed to
    2/3 in a new process and paused again, then resumed to the end in a fresh engine; and seed 1
    alone from the same 2/3 state. The same results bit for bit, timings and pauses aside."""
    from race.core.records import PilotResult
    from race.engine.continuation import PilotPaused, state_file
    from race.engine.pilot import run_pilots

    cfg = _config()
    schedule = _schedule(cfg)
    straight = run_pilots(cfg, schedule, [0, 1])
    assert all(r.extra["steps"] >= 10 for r in straight) and straight[0].curve != straight[1].curve
    first, second = cfg.budget / 3, 2 * cfg.budget / 3
    paused = run_pilots(cfg, schedule, [0, 1], stop_at=first, state_dir=str(tmp_path))
    for p, r in zip(paused, straight):
        _check_pause(p, r, first)
        assert p.state_file == state_file(str(tmp_path), schedule, r.seed)

    out = tmp_path / "second.json"
    code = RESUME.format(root=ROOT, mark=second, state_dir=str(tmp_path), out=str(out))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    for d, r in zip(json.loads(out.read_text()), straight):
        _check_pause(PilotPaused.from_dict(d), r, second)

    alone = run_pilots(cfg, schedule, [1], state_dir=str(tmp_path), resume=True)[0]
    ended = run_pilots(cfg, schedule, [0, 1], state_dir=str(tmp_path), resume=True)
    for r, e in zip(straight, ended):
        assert isinstance(e, PilotResult) and _untimed(e) == _untimed(r)
        assert [p["mark"] for p in e.extra["pauses"]] == [first, second]
        assert all(e.wall_seconds[k] > 0 for k in ("setup", "rollout", "update", "readings"))
    assert (alone.curve, alone.evals, alone.flops) == (straight[1].curve, straight[1].evals, straight[1].flops)
    assert _untimed_cps(alone.checkpoints) == _untimed_cps(straight[1].checkpoints)


def test_a_peft_pilot_paused_and_resumed_is_the_straight_run(torch_one_thread, tmp_path):
    """The HF + peft path (one seed, its merged sampling copy rebuilt from the restored adapter)."""
    from race.engine.pilot import run_pilot, run_pilots

    cfg = _config(fast_path=False, budget=1.2e10)
    schedule = _schedule(cfg, 2)
    straight = run_pilot(cfg, schedule, seed=1)
    paused = run_pilots(cfg, schedule, [1], stop_at=cfg.budget / 3, state_dir=str(tmp_path))[0]
    _check_pause(paused, straight, cfg.budget / 3)
    ended = run_pilots(cfg, schedule, [1], state_dir=str(tmp_path), resume=True)[0]
    assert _untimed(ended) == _untimed(straight) and straight.extra["steps"] >= 6


# ---------------------------------------------------------------------------------------- refusals

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A lean pilot of seed 0 paused at a third of its budget: (config, schedule, its state folder)."""
    import torch

    from race.engine.pilot import run_pilots

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = _config(budget=6e9, checkpoints=0, prompts=8)
    schedule = _schedule(cfg)
    folder = str(tmp_path_factory.mktemp("state"))
    run_pilots(cfg, schedule, [0], stop_at=cfg.budget / 3, state_dir=folder)
    torch.set_num_threads(n)
    return cfg, schedule, folder


@pytest.fixture
def no_compute(monkeypatch):
    """Building the engine (loading a model) fails the test: every refusal must come first."""
    import race.engine.pilot as pilot

    def engine(*a, **k):  # noqa: ARG001
        raise AssertionError("the engine was built before the refusal")

    monkeypatch.setattr(pilot, "SeedAxisEngine", engine)


def _refused(match: str, cfg, schedule, seeds=(0,), **kw) -> str:
    from race.core.errors import RaceError
    from race.engine.continuation import PilotStateError
    from race.engine.pilot import pilot_events

    with pytest.raises(PilotStateError, match=re.escape(match)) as e:
        next(pilot_events(cfg, schedule, list(seeds), **kw))
    assert isinstance(e.value, RaceError) and "\n" not in str(e.value)
    return str(e.value)


def _copy(saved, tmp_path, schedule=None, seed=0, change=None) -> str:
    """The saved state of seed 0 in a new folder as the file of ``schedule`` and ``seed``, its bytes
    passed through ``change``; returns the folder."""
    from race.engine.continuation import state_file

    cfg, sched, folder = saved
    data = open(state_file(folder, sched, 0), "rb").read()
    tmp_path.mkdir(parents=True, exist_ok=True)
    with open(state_file(str(tmp_path), schedule or sched, seed), "wb") as fh:
        fh.write(change(data) if change else data)
    return str(tmp_path)


def test_a_missing_linked_damaged_or_foreign_file_is_refused(saved, tmp_path, no_compute):
    from race.engine.continuation import state_file

    cfg, schedule, folder = saved
    _refused("does not exist", cfg, schedule, state_dir=str(tmp_path / "empty"), resume=True)
    link = tmp_path / "link"
    link.mkdir()
    os.symlink(state_file(folder, schedule, 0), state_file(str(link), schedule, 0))
    _refused("is a symbolic link", cfg, schedule, state_dir=str(link), resume=True)
    flip = lambda b: b[:-100] + bytes([b[-100] ^ 1]) + b[-99:]  # noqa: E731 — one bit of the payload
    _refused("is damaged: its checksum", cfg, schedule, resume=True,
             state_dir=_copy(saved, tmp_path / "a", change=flip))
    _refused("is damaged", cfg, schedule, state_dir=_copy(saved, tmp_path / "b", change=lambda b: b[:len(b) // 2]),
             resume=True)
    _refused("is not a RACE pilot state", cfg, schedule, resume=True,
             state_dir=_copy(saved, tmp_path / "c", change=lambda b: b"rho: 0.6\nseed: 0\n"))
    _refused("has format '9'", cfg, schedule, resume=True,
             state_dir=_copy(saved, tmp_path / "d", change=lambda b: b.replace(b"STATE 1 ", b"STATE 9 ", 1)))


def test_a_state_of_another_config_rho_seed_or_library_is_refused(saved, tmp_path, no_compute, monkeypatch):
    from dataclasses import replace

    import race.engine.loading as loading

    cfg, schedule, folder = saved
    other = replace(cfg, grpo=replace(cfg.grpo, temperature=0.9))
    msg = _refused("is of another pilot: config.grpo.temperature is 1.0 in the file, expected 0.9", other,
                   schedule, state_dir=folder, resume=True)
    assert folder in msg
    rho = _schedule(cfg, 1)
    _refused(f"schedule.rho_target is {schedule.rho_target!r} in the file, expected {rho.rho_target!r}", cfg, rho,
             state_dir=_copy(saved, tmp_path / "rho", schedule=rho), resume=True)
    _refused("seed is 0 in the file, expected 1", cfg, schedule, seeds=[1], resume=True,
             state_dir=_copy(saved, tmp_path / "seed", seed=1))
    versions = loading.software_versions()
    monkeypatch.setattr(loading, "software_versions", lambda: {**versions, "torch": "9.9.9"})
    _refused(f"library version software.torch is '{versions['torch']}' in the file, expected '9.9.9'", cfg,
             schedule, state_dir=folder, resume=True)


def test_bad_marks_are_refused(saved, tmp_path, no_compute, monkeypatch):
    from dataclasses import replace

    import race.engine.backends as backends

    cfg, schedule, folder = saved
    _refused("is not past pilot state", cfg, schedule, stop_at=cfg.budget / 10, state_dir=folder, resume=True)
    for bad in (0, -1.0, cfg.budget, 2 * cfg.budget):
        _refused("must lie between 0 and the pilot's budget", cfg, schedule, stop_at=bad, state_dir=str(tmp_path))
    for bad in (True, "1e9", float("nan"), float("inf")):
        _refused("is not a number of FLOPs", cfg, schedule, stop_at=bad, state_dir=str(tmp_path))
    _refused("needs state_dir", cfg, schedule, stop_at=cfg.budget / 2)
    _refused("needs state_dir", cfg, schedule, resume=True)
    monkeypatch.setattr(backends, "vllm_installed", lambda: True)     # resolve_backend asks; nothing imports it
    _refused("vllm backend cannot pause", replace(cfg, backend="vllm"), schedule, stop_at=cfg.budget / 2,
             state_dir=str(tmp_path))


def test_a_state_is_never_written_through_a_link(saved, tmp_path, torch_one_thread):
    """The pause's write refuses a link planted at the state file's name (race.core.safeio.write_inside)."""
    from race.core.safeio import UnsafeWrite
    from race.engine.continuation import state_file
    from race.engine.pilot import run_pilots

    cfg, schedule, folder = saved
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    os.symlink(target, state_file(str(tmp_path), schedule, 0))
    with pytest.raises(UnsafeWrite, match="is a symbolic link"):
        run_pilots(cfg, schedule, [0], stop_at=cfg.budget / 3, state_dir=str(tmp_path))
    assert target.read_text() == "keep"


def test_the_continuation_module_loads_no_torch():
    """``import race.engine.continuation`` (and race.engine.pilot, which imports it) stays light."""
    code = ("import sys, race, race.engine.pilot, race.engine.continuation; "
            "assert 'torch' not in sys.modules, 'torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-1000:]
