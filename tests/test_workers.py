"""`race worker` processes sharing one study, at the same time, on a real PostgreSQL server
(the one .ci/run starts), on SQLite and on an optuna journal file. On PostgreSQL one worker is
killed -9 mid-pilot: its pilot is taken over once its heartbeat is stale, and nothing runs twice."""
import os
import signal
import subprocess
import uuid

import pytest

from conftest import ROOT
from pilot_cli import kill_leftovers, by_state, midway, open_study, race, read, start, wait_for, write_config
from race.run.store import key_of
from test_store import STORAGES, storage_url

KEYS = [(0.6, 0), (0.75, 0), (0.92, 0)]


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    yield
    kill_leftovers()


def _owner(t):
    return (t.system_attrs.get("race:owner") or {}).get("pid")


@pytest.mark.parametrize("kind", STORAGES)
def test_workers_share_a_study(kind, tmp_path):
    url = storage_url(kind, tmp_path)
    name = f"w-{kind}-{uuid.uuid4().hex[:6]}"
    # on PostgreSQL a worker is killed mid-pilot: pilots long enough to be caught running
    cfg = write_config(tmp_path / "c.yaml", name=name, budget=1.5e11 if kind == "postgres" else 2e10)
    coord = start(["pilot", cfg, "--out", tmp_path / "coord", "--storage", url, "--workers", "0",
                   "--heartbeat", "2"], tmp_path / "coord")
    store = open_study(url, name, proc=coord)
    one_thread = {**os.environ, "OMP_NUM_THREADS": "1"}          # two worker processes on two cores
    workers = [start(["worker", "--storage", url, "--study", name, "--workers", "1"],     # the study's heartbeat: 2 s
                     tmp_path / f"w{i}", env=one_thread) for i in range(2)]
    pids = [w.pid for w in workers]
    killed = None
    if kind == "postgres":   # kill -9 the second worker while both hold a pilot, its own in its first half
        def both_running():
            ts = store.trials()
            mine = [t for t in ts if midway(t) and _owner(t) == pids[1] and t.user_attrs["progress"]["flops"] < 7.5e10]
            return mine[0] if mine and any(t.state.name == "RUNNING" and _owner(t) == pids[0] for t in ts) else None

        killed = wait_for(both_running, procs=workers + [coord])
        os.killpg(pids[1], signal.SIGKILL)
    assert coord.wait(timeout=600) == 0, read(tmp_path / "coord")[1]
    assert workers[0].wait(timeout=120) == 0, read(tmp_path / "w0")[1]
    workers[1].wait(timeout=120)

    trials = store.trials()
    complete = by_state(store, "COMPLETE")
    assert sorted(key_of(t) for t in complete) == KEYS                  # every pilot once, none twice
    assert not any(t.state.name == "RUNNING" or t.state.name == "WAITING" for t in trials)
    span = {}
    for t in trials:
        if t.datetime_start is not None and t.datetime_complete is not None:
            span.setdefault(_owner(t), []).append((t.datetime_start, t.datetime_complete))
    assert any(max(a[0], b[0]) < min(a[1], b[1]) for a in span[pids[0]] for b in span[pids[1]])   # overlap
    if kind == "postgres":
        assert workers[1].returncode == -signal.SIGKILL
        dead = store.study._storage.get_trial(killed._trial_id)
        assert dead.state.name == "FAIL"
        # its retry, and the retries of that retry should a starved machine (this suite beside other
        # work) let one's heartbeat lapse too, end in the one complete trial of its key
        chain, tip = [], killed.number
        while (nxt := [t for t in trials if t.user_attrs.get("retry_of") == tip]):
            assert len(nxt) == 1                         # a failed trial is retried once
            chain.append(nxt[0])
            tip = nxt[0].number
        assert chain and "no heartbeat" in chain[0].user_attrs["retry_reason"]
        assert chain[-1].state.name == "COMPLETE" and key_of(chain[-1]) == key_of(killed)
        assert _owner(chain[0]) != pids[1]
    else:
        assert workers[1].returncode == 0
        assert {_owner(t) for t in complete} == set(pids)              # both did real work
    stdout, _ = read(tmp_path / "coord")
    rep = subprocess.run(race("report", "--storage", url, "--study", name), capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert rep.returncode == 0 and rep.stdout == stdout and "RACE diagnosis" in stdout
    if kind == "postgres":   # the password of the storage URL is in no output and no file
        from race.core.urls import passwords

        secret = passwords(url)[0]
        texts = [*read(tmp_path / "coord"), *read(tmp_path / "w0"), *read(tmp_path / "w1"), rep.stdout, rep.stderr,
                 open(tmp_path / "coord" / "results.json").read()]
        assert all(secret not in t for t in texts)
        assert "postgresql://race:***@" in read(tmp_path / "coord")[1]
