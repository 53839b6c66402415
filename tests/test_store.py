"""Pilots on optuna storage: round trips, exclusive claims on real storages (PostgreSQL, SQLite,
journal), refusal of incompatible studies, masked passwords, unreachable storages.

The PostgreSQL server is the one .ci/run starts (.ci/postgres.sh → RACE_TEST_POSTGRES_URL);
without it these tests skip locally and fail under CI=true.
"""
import json
import os
import subprocess
import sys
import uuid

import pytest
from click.testing import CliRunner

from conftest import ROOT, require
from race.run.cli import main
from race.core.records import FlopBreakdown, PilotResult, Schedule

PG_URL = os.environ.get("RACE_TEST_POSTGRES_URL", "")


def postgres_url() -> str:
    ok = False
    if PG_URL:
        try:
            import psycopg2

            psycopg2.connect(PG_URL.replace("postgresql://", "postgresql://", 1), connect_timeout=5).close()
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
    require(ok, "PostgreSQL (RACE_TEST_POSTGRES_URL, started by .ci/postgres.sh)")
    return PG_URL


def storage_url(kind: str, tmp_path) -> str:
    if kind == "postgres":
        return postgres_url()
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'race.db'}"
    return f"journal:{tmp_path / 'race.log'}"


STORAGES = ["postgres", "sqlite", "journal"]


def tiny_config(**kw):
    from race.config import presets
    from race.run.api import build_config

    return build_config({**presets.DEFAULT, "name": kw.pop("name", "t"), **kw})


def make_store(url: str, name: str, config):
    from race.run.store import Store

    store = Store(url, name, heartbeat=1)
    schedule = Schedule(0.6, 8, 16, 8, 1, 10, 1e-3, 8, FlopBreakdown(1e9, 2e9), FlopBreakdown(1e10, 2e10))
    plan = {"schedules": [{**schedule.to_dict(), "rho_target": r} for r in config.grid]}
    assert store.create(config=config.to_dict(), run_config=config.to_dict(), plan=plan,
                        classify={"primary_target": "reward", "n_boot": 200, "seed": 0},
                        meta={"model": config.model}, adaptive=None)
    return store


def a_pilot(rho=0.6, seed=0, prompts=500, steps=2500) -> PilotResult:
    import random

    rng = random.Random(seed)
    evals = {"reward": tuple(rng.choice((0.0, 0.25, 0.5, 0.75, 1.0)) for _ in range(prompts)),
             "pass@1": tuple(rng.random() for _ in range(prompts))}
    curve = tuple((1e7 * (i + 1) + rng.random(), rng.random()) for i in range(steps))
    sched = Schedule(rho, 8, 16, 8, 1, steps, 1e-3, 8, FlopBreakdown(1e7, 2e7), FlopBreakdown(1e10, 2e10))
    from race.core.records import Checkpoint

    # held-out checkpoints: 9 × 2 targets × 500 per-prompt scores, more than one attribute holds as JSON
    checkpoints = tuple(Checkpoint(i / 8, i * 300, FlopBreakdown(1e9 * i + rng.random(), 2e9 * i),
                                   {t: tuple(rng.random() for _ in range(prompts)) for t in evals},
                                   FlopBreakdown(1e8 + rng.random(), 0.0, 0.0), rng.random()) for i in range(9))
    return PilotResult(rho, seed, FlopBreakdown(1e10 + 0.5, 2e10 + 0.25, 0.0), evals, sched, curve,
                       {"rollout": 1.5, "update": 2.25}, "complete", {"steps": steps, "device": "cpu"}, checkpoints)


@pytest.mark.parametrize("url,masked", [
    ("postgresql://race:s3cr%40t@db.example:5432/race", "postgresql://race:***@db.example:5432/race"),
    ("mysql+pymysql://u:p@h/db?charset=utf8", "mysql+pymysql://u:***@h/db?charset=utf8"),
    ("postgresql://h/db?user=u&password=hunter2", "postgresql://h/db?password=***&user=u"),
    ("sqlite:////tmp/x/race.db", "sqlite:////tmp/x/race.db"),
    ("postgresql://nopass@h/db", "postgresql://nopass@h/db"),
])
def test_mask_url(url, masked):
    from race.run.store import mask_url
    from race.core.urls import redact

    assert mask_url(url) == masked
    assert redact(f"error at {url} (refused)", url) == f"error at {masked} (refused)"


@pytest.mark.parametrize("kind", STORAGES)
def test_pilot_round_trips_through_storage(kind, tmp_path):
    """A finished pilot comes back from storage bit for bit (evals compact, long curve and
    held-out checkpoints chunked);
    its curve is in the intermediate values and its breakdown, schedule and scores in attrs."""
    url = storage_url(kind, tmp_path)
    name = f"rt-{uuid.uuid4().hex[:8]}"
    cfg = tiny_config(grid=[0.45, 0.6, 0.73], seeds=2)
    store = make_store(url, name, cfg)
    store.enqueue((0.6, 1))
    claim = store.claim()
    assert claim.key == (0.6, 1)
    pilot = a_pilot(0.6, 1)
    store.complete(claim, pilot, "reward")
    assert store.claim() is None
    from race.run.store import Store

    again = Store(url, name)
    again.load()
    assert again.pilots() == [pilot]
    t = again.trials()[0]
    assert t.state.name == "COMPLETE" and t.params == {"rho": 0.6, "seed": 1}
    assert t.value == pytest.approx(pilot.score("reward"))
    assert t.user_attrs["flops"]["total"] == pilot.flops.total and t.user_attrs["schedule"]["steps"] == 2500
    assert t.user_attrs["scores"]["pass@1"] == pytest.approx(pilot.score("pass@1"))
    assert len(t.intermediate_values) == 200                  # downsampled curve for the dashboard
    assert max(len(json.dumps(v)) for v in t.user_attrs.values()) <= 30_100


CLAIMER = r"""
import json, sys, time
from race.run.store import Store
s = Store(sys.argv[1], sys.argv[2], heartbeat=1)
s.load()
time.sleep(max(0.0, float(sys.argv[3]) - time.time()))     # all three start claiming together
got = []
while True:
    c = s.claim()
    if c is None:
        break
    got.append(list(c.key))
    time.sleep(0.05)                                          # a pilot would run here
print(json.dumps(got))
"""


@pytest.mark.parametrize("kind", STORAGES)
def test_concurrent_claims_are_exclusive(kind, tmp_path):
    """Three processes take trials from one queue at the same time: each pilot goes to exactly one."""
    url = storage_url(kind, tmp_path)
    name = f"claims-{uuid.uuid4().hex[:8]}"
    cfg = tiny_config(grid=[0.3, 0.45, 0.6, 0.75], seeds=4)
    store = make_store(url, name, cfg)
    keys = store.info.keys()
    for k in keys:
        store.enqueue(k)
    import time

    go = str(time.time() + 6)
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, url, name, go], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT) for _ in range(3)]
    taken = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    flat = [tuple(k) for got in taken for k in got]
    assert sorted(flat) == sorted(keys)                       # none twice, none lost
    assert sum(1 for got in taken if got) >= 2                # the work was really shared


@pytest.mark.parametrize("kind", STORAGES)
def test_a_claim_killed_before_it_recorded_itself_is_failed_and_requeued(kind, tmp_path):
    """A process killed between WAITING → RUNNING and writing its owner and heartbeat leaves a
    RUNNING trial that optuna's heartbeat check never sees (no heartbeat row); a grid waiting for
    it hung (seen under load in test_kill_9_mid_grid_then_resume). sweep() fails it once it is
    older than the grace period (3 heartbeats) and enqueues its pilot again."""
    import time

    from optuna.trial import TrialState

    url = storage_url(kind, tmp_path)
    store = make_store(url, f"orphan-{uuid.uuid4().hex[:8]}", tiny_config(grid=[0.3, 0.45, 0.6], seeds=1))
    store.enqueue((0.45, 0))
    (waiting,) = store.trials((TrialState.WAITING,))
    store.study._storage.set_trial_state_values(waiting._trial_id, state=TrialState.RUNNING)  # then killed
    assert store.sweep() == []                          # within the grace period: maybe a live claimer
    time.sleep(3 * store.heartbeat + 0.5)
    assert store.sweep() == [(0.45, 0)]
    failed = store.study._storage.get_trial(waiting._trial_id)
    assert failed.state == TrialState.FAIL and failed.user_attrs["stale"] is True
    assert "died before recording itself" in failed.user_attrs["error"]
    (again,) = store.trials((TrialState.WAITING,))
    assert again.user_attrs["retry_of"] == failed.number
    claim = store.claim()                               # and the pilot can be taken again
    assert claim is not None and claim.key == (0.45, 0)
    assert store.sweep() == []                          # a live claim is left alone


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_unreachable_storage_is_one_line_without_password(tmp_path):
    url = "postgresql://race:Sup3rSecret@127.0.0.1:1/race"
    for args in (("report", "--storage", url, "--study", "x"),
                 ("worker", "--storage", url, "--study", "x"),
                 ("pilot", "--out", str(tmp_path), "--storage", url, "--quiet")):
        r = run(*args)
        assert r.exit_code == 2, r.output
        assert "unreachable" in r.output and "postgresql://race:***@127.0.0.1:1/race" in r.output
        assert "Sup3rSecret" not in r.output and "Traceback" not in r.output
    r = run("report", "--storage", "redis://h/0", "--study", "x")
    assert r.exit_code == 2 and "not an optuna storage URL" in r.output


def test_missing_study_and_incompatible_config_are_refused(tmp_path):
    """A worker on a study that does not exist, and a pilot whose grid or config differs from the
    study's, stop before any work with one line (exit 2); the study is left as it was."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    r = run("worker", "--storage", url, "--study", "nobody")
    assert r.exit_code == 2 and "does not exist: no study to join" in r.output and not os.listdir(tmp_path)
    cfg = tiny_config(name="s", grid=[0.45, 0.6, 0.73], seeds=1, budget=2e10)
    store = make_store(url, "s", cfg)
    r = run("worker", "--storage", url, "--study", "nobody")
    assert r.exit_code == 2 and "study 'nobody' does not exist" in r.output
    store.enqueue((0.45, 0))
    cfg_file = tmp_path / "c.yaml"
    import yaml

    yaml.safe_dump({**json.loads(json.dumps(cfg.to_dict()))}, open(cfg_file, "w"))
    r = run("pilot", str(cfg_file), "--out", str(tmp_path), "--storage", url, "--grid", "0.5,0.6,0.7", "--quiet")
    assert r.exit_code == 2, r.output
    assert "was created with grid [0.45, 0.6, 0.73] × 1 seeds; this run asks for [0.5, 0.6, 0.7] × 1" in r.output
    r = run("pilot", str(cfg_file), "--out", str(tmp_path), "--storage", url, "--budget", "3e10", "--quiet")
    assert r.exit_code == 2 and "budget is 2e+10 there, 3e+10 here" in r.output, r.output
    assert [t.state.name for t in store.trials()] == ["WAITING"]
