"""Helpers for tests that run the real ``race`` command in subprocesses against real storages."""
import json
import os
import subprocess
import sys
import time

from conftest import ROOT


def race(*args) -> list[str]:
    return [sys.executable, "-m", "race", *map(str, args)]


def write_config(path, **overrides) -> str:
    """A YAML config: the embedded tiny default with small budgets (≈ 0.7 s per pilot on one core at 2e10 FLOPs)."""
    import yaml

    from race.config import presets

    cfg = {**presets.DEFAULT, "budget": 2e10, "grid": [0.6, 0.75, 0.92], "seeds": 1,
           "eval": {"prompts": 50, "samples": 2, "temperature": 1.0}, **overrides}
    with open(path, "w") as fh:
        yaml.safe_dump(json.loads(json.dumps(cfg)), fh)
    return str(path)


STARTED: list[subprocess.Popen] = []


def start(args, log_prefix, **kw) -> subprocess.Popen:
    """Start ``race ARGS`` in its own process group (so a test can kill -9 all of it)."""
    out = open(f"{log_prefix}.out", "w")
    err = open(f"{log_prefix}.err", "w")
    proc = subprocess.Popen(race(*args), stdout=out, stderr=err, cwd=ROOT, start_new_session=True, **kw)
    STARTED.append(proc)
    return proc


def kill_leftovers() -> None:
    """After a test: no coordinator or worker it started may outlive it (a failed test included)."""
    import signal

    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def read(log_prefix) -> tuple[str, str]:
    return open(f"{log_prefix}.out").read(), open(f"{log_prefix}.err").read()


def open_study(url: str, name: str, *, timeout: float = 300, proc: subprocess.Popen | None = None):
    """The race.run.store.Store of ``name`` once its creator has set it up."""
    from race.run.store import Store

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited ({proc.returncode}) before study {name!r} was ready")
        path = url.split(":///", 1)[-1] if url.startswith("sqlite") else url.split(":", 1)[-1]
        if url.startswith("postgresql") or os.path.exists(path):
            store = Store(url, name, heartbeat=1)
            if store.exists():
                try:
                    store.load(wait=5)
                    return store
                except Exception:  # noqa: BLE001 — still being set up
                    pass
        time.sleep(0.3)
    raise AssertionError(f"study {name!r} never appeared in {url}")


def wait_for(predicate, *, timeout: float = 300, interval: float = 0.2, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for p in procs:
            assert p.poll() is None, f"process {p.args[3:5]} exited with {p.returncode} before the condition held"
        time.sleep(interval)
    raise AssertionError("condition never held")


def by_state(store, state: str):
    return [t for t in store.trials() if t.state.name == state]


def midway(t) -> bool:
    return t.state.name == "RUNNING" and (t.user_attrs.get("progress") or {}).get("step", 0) >= 1
