"""Running a study's pilots: the queue a coordinator and a worker share, and ``race worker``.

``PilotQueue`` claims pilots from the study's storage (a lockstep group: up to ``group_size`` trials
of one grid point), runs them through race.run.processes.run_jobs, and records each result (complete,
or failed with its retries counted); a stage of budget halving (a trial with a ``rung``) runs to its
rung's mark and is recorded paused, with its state under the study's state folder (``stage_job``). ``run_worker`` joins an existing study and runs the pilots no one
holds until none is left; a custom reward named by the storage runs only by consent
(``check_reward_consent``).

No optuna here: every storage call goes through race.run.store, imported when a grid runs.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any, Iterator

from race.config.configfile import config_from_dict
from race.core.records import PilotResult, Schedule
from race.run.adaptive import Key


class PilotQueue:
    """The pilots of one study, claimed from its storage and run through race.run.processes.run_jobs:
    the loop a coordinator (race.run.study) and a worker (``run_worker``) share."""

    def __init__(self, store: Any, *, device: str, workers: int, retries: int, quiet: bool, first_number: int,
                 group_size: int = 1, halving: Any = None):
        from race.run.processes import Job, Progress

        self.store, self.info = store, store.info
        self.device, self.workers, self.retries, self.quiet = device, workers, retries, quiet
        self.first_number = first_number
        self.run_config = config_from_dict(self.info.run_config)
        self.schedules = {float(s["rho_target"]): Schedule.from_dict(s) for s in self.info.plan["schedules"]}
        self.primary = self.info.classify.get("primary_target", "reward")
        self.held: dict[Key, Any] = {}
        self.ran: list[PilotResult] = []
        self.stopped: dict[Any, Any] = {}      # budget halving: each stage paused here and not (yet) continued to an end
        self.Job = Job
        self.progress = Progress(0, self.run_config.budget, enabled=not quiet)
        self.group_size = max(1, group_size)
        self.pool = None            # the last run's race.run.processes.PilotPool: its profile() stays readable
        self.halving = halving      # budget halving: the study's race:adaptive (eta, rungs, states), else None

    def next_job(self):
        """The next pilot, or with lockstep the next group: one claimed trial and up to
        ``group_size − 1`` more waiting trials of its grid point (race.engine.seed_axis)."""
        claim = self.store.claim()
        if claim is None:
            return None
        claims = [claim]
        while len(claims) < self.group_size:
            more = self.store.claim(rho=claim.key[0], rung=claim.rung)
            if more is None:
                break
            claims.append(more)
        for c in claims:
            self.held[c.key] = c
        jobs = [self.stage_job(c) for c in claims]
        return jobs if self.group_size > 1 else jobs[0]

    def stage_job(self, claim) -> Any:
        """The job of ``claim``: its pilot, and for a stage of budget halving its pause (race.run.adaptive.budget):
        rung r < R stops at the rung's mark with its state in ``STATES/rung<r>``, continuing from
        ``STATES/rung<r − 1>`` when r > 0; the top rung R continues from ``STATES/rung<R − 1>`` to the budget."""
        schedule = self.schedules[claim.key[0]]
        if claim.rung is None:
            return self.Job(schedule, claim.key[1])
        from race.core.errors import RaceError
        from race.run.adaptive import rung_marks

        h = self.halving or {}
        if not h.get("states"):
            raise RaceError(f"study {self.store.name!r} holds budget-halving stages but names no state folder")
        rungs, r = int(h["rungs"]), int(claim.rung)
        folder = lambda k: os.path.join(str(h["states"]), f"rung{k}")  # noqa: E731
        if r >= rungs:
            return self.Job(schedule, claim.key[1], state_dir=folder(rungs - 1), resume_from=folder(rungs - 1))
        mark = rung_marks(self.run_config.budget, int(h["eta"]), rungs)[r]
        return self.Job(schedule, claim.key[1], stop_at=mark, state_dir=folder(r),
                        resume_from=folder(r - 1) if r > 0 else None)

    def record(self, event) -> None:
        """Store what ``event`` (race.run.processes' events) says: a pilot's process id, its progress,
        its result (complete, or failed with its retries counted)."""
        from race.run.processes import Finished, Paused, Progressed, Started

        if isinstance(event, Paused):
            self._paused(event.job, event.paused)
        elif isinstance(event, Started):
            for job in event.jobs:
                self.store.set_pid(self.held[job.key], event.pid)
        elif isinstance(event, Progressed):
            self.progress.update(event.job, event.step, event.spent)
            if event.job.key in self.held:
                self.store.progress(self.held[event.job.key], event.step, event.spent)
        elif isinstance(event, Finished):
            self._finished(event.job, event.result)

    def _paused(self, job, paused: Any) -> None:
        claim = self.held.pop(job.key)
        self.stopped[job.key] = paused
        self.store.pause(claim, paused, self.primary)
        self.progress.paused(job, paused, claim.rung)

    def _finished(self, job, result: PilotResult) -> None:
        claim = self.held.pop(job.key)
        self.ran.append(result)
        self.stopped.pop(job.key, None)         # its stages' seconds and FLOPs are in its result now
        self.progress.total = max(self.progress.total, self.progress.done + 1)
        if result.status == "complete":
            self.store.complete(claim, result, self.primary)
            self.progress.finish(job, result)
        else:
            self.store.fail(claim, result.extra.get("error", "failed"), result.extra.get("traceback", ""))
            self.progress.finish(job, result)
            n = self.store.failures_since(claim.key, self.first_number)
            if not self.quiet:
                what = (f"retrying ({n} of {self.retries} retries)" if n <= self.retries
                        else f"giving up after {n} failures (re-run to try again)")
                print(f"  ρ={claim.key[0]:g} seed {claim.key[1]}: {what}", file=sys.stderr, flush=True)

    def events(self) -> Iterator:
        """The events of this queue's pilot processes (race.run.processes.PilotPool), each stored
        (``record``) before it is yielded. At every ``Tick`` the free process slots are filled with claimed
        pilots first; the caller stops iterating when it wants no more pilots (a ``Tick`` with nothing
        running or waiting: stopping then leaves nothing behind; any other time, the processes end).
        The study's heartbeats beat while it runs."""
        from race.run.processes import PilotPool, Tick, busy_machine_warning

        warn = busy_machine_warning(self.workers, self.device) if not self.quiet and self.workers else None
        if warn:
            print(f"warning: {warn}", file=sys.stderr, flush=True)
        halt = self.store.heartbeats(lambda: list(self.held.values()))
        try:
            with PilotPool(self.run_config, workers=self.workers, device=self.device,
                           poll=min(1.0, self.store.heartbeat / 2), group_size=self.group_size) as pool:
                self.pool = pool
                for event in pool:
                    if isinstance(event, Tick):
                        while pool.free and (got := self.next_job()):
                            pool.submit(got)
                        event = Tick(len(pool.running), len(pool.waiting))
                    else:
                        self.record(event)
                    yield event
        finally:
            halt()

def complete_scores(store: Any) -> dict[Key, float]:
    """The primary score of each complete pilot of ``store``."""
    from race.run.store import key_of

    out: dict[Key, float] = {}
    for t in store.trials():
        if t.state.name == "COMPLETE" and t.value is not None:
            k = key_of(t)
            if k is not None:
                out.setdefault(k, float(t.value))
    return out


def stage_scores(store: Any) -> dict[tuple[float, int, int], float]:
    """Budget halving: the score of each stage (ρ, seed, rung) of ``store`` that ended: a paused stage's
    reading, the top stage's primary score."""
    from race.run.store import key_of

    out = {k: float(v) for k, v in ((k, p.score(store.info.classify.get("primary_target", "reward")))
                                    for k, p in store.readings().items())}
    for t in store.trials():
        if t.state.name == "COMPLETE" and t.value is not None and t.user_attrs.get("rung") is not None:
            k = key_of(t)
            if k is not None:
                out.setdefault(k + (int(t.user_attrs["rung"]),), float(t.value))
    return out


def busy_stages(store: Any) -> set[tuple[float, int, int]]:
    """Budget halving: the stages of ``store`` waiting or running."""
    from race.run.store import key_of

    return {key_of(t) + (int(t.user_attrs["rung"]),) for t in store.trials()
            if t.state.name in ("WAITING", "RUNNING") and t.user_attrs.get("rung") is not None and key_of(t)}


def busy_keys(store: Any) -> set[Key]:
    """The pilots of ``store`` waiting or running."""
    from race.run.store import key_of

    return {key_of(t) for t in store.trials() if t.state.name in ("WAITING", "RUNNING")}


def budget_halving_attrs(adaptive: Any) -> dict | None:
    """The study's ``race:adaptive`` when it is budget halving (its eta, rungs and state folder), else None."""
    from race.run.adaptive import is_budget, policy_stored

    return dict(adaptive) if adaptive and is_budget(policy_stored(adaptive)) else None


def check_reward_consent(info: Any, *, trust_reward: bool = False, quiet: bool = False) -> None:
    """A worker runs a custom reward named by the study's storage only by consent: the file it
    would import here must have the sha256 the coordinator recorded, or the user passes
    ``trust_reward`` (``race worker --trust-reward``). Whoever can write the storage otherwise
    chooses code that every worker runs. The file and its hash are named either way."""
    rc = info.run_config.get("reward") or {}
    if rc.get("kind") != "custom":
        return
    from race.core.errors import RaceError
    from race.tasks.rewards.base import reward_source, source_digest

    function = str(rc.get("function"))
    recorded = (info.meta or {}).get("reward_source") or {}
    here = reward_source(function)
    digest = source_digest(here) if here else None
    line = (f"the study's reward is custom {function!r}: here {here or 'no such file'}"
            + (f" (sha256 {digest[:16]}…)" if digest else "")
            + (f"; the coordinator recorded sha256 {str(recorded.get('sha256'))[:16]}…" if recorded.get("sha256")
               else "; the coordinator recorded no hash"))
    if not quiet:
        print(f"race worker: {line}", file=sys.stderr, flush=True)
    if trust_reward:
        return
    if not here or not recorded.get("sha256") or digest != recorded.get("sha256"):
        raise RaceError(f"{line}: a worker runs a reward from storage only when the same file is here, byte for "
                        "byte; copy it, or pass --trust-reward to run it anyway")


def run_worker(storage: str, study: str, *, workers: int | None = None, device: str = "cpu", quiet: bool = False,
               retries: int = 1, wait: float = 30.0, engine: str = "auto", trust_reward: bool = False) -> dict[str, Any]:
    """Join ``study`` in ``storage`` and run the pilots no one holds until the study needs none
    (heartbeat interval: the study's). Returns what this worker did: pilots run, complete, failed."""
    from race.run import store as S
    from race.engine.loading import check_device
    from race.run.processes import default_workers

    check_device(device)
    S.require_storage_file(storage, "no study to join")
    st = S.Store(storage, study)
    info = st.load()
    check_reward_consent(info, trust_reward=trust_reward, quiet=quiet)
    first_number = len(st.trials())
    from race.engine.lean_engine import group_size_for

    workers = workers if workers is not None else default_workers(device)
    halving = budget_halving_attrs(st.study.user_attrs.get("race:adaptive"))
    loop = PilotQueue(st, device=device, workers=workers, retries=retries, quiet=quiet, first_number=first_number,
                 group_size=group_size_for(config_from_dict(info.run_config), engine, device, workers=workers),
                 halving=halving)
    keys = set(info.keys())
    state = {"idle_since": None, "last": 0.0, "go": True}

    def retry(p: PilotResult) -> None:   # our own failed pilot: enqueue it again while retries last
        key = (p.rho_target, p.seed)
        if halving is None and p.status != "complete" and st.failures_since(key, first_number) <= retries:
            if key not in busy_keys(st) and key not in complete_scores(st):
                st.enqueue(key, retry_of_failure=True)

    loop.progress.total = len(keys)

    def keep_going() -> bool:
        now = time.monotonic()
        if now - state["last"] < min(1.0, st.heartbeat / 2):
            return state["go"]
        state["last"] = now
        st.sweep()
        if busy_keys(st):
            state["idle_since"], state["go"] = None, True
        elif st.finished() or (not st.study.user_attrs.get("race:adaptive") and keys <= set(complete_scores(st))):
            state["go"] = False
        else:
            state["idle_since"] = state["idle_since"] or now
            state["go"] = now - state["idle_since"] < wait
        return state["go"]

    if not quiet:
        print(f"RACE worker {os.getpid()} on study {st.name!r} in {st.masked}", file=sys.stderr, flush=True)
    from race.run.processes import Finished, Tick

    with contextlib.closing(loop.events()) as events:
        for event in events:
            if isinstance(event, Finished):
                retry(event.result)
            elif isinstance(event, Tick) and not keep_going() and not (event.running or event.waiting):
                break
    done = [p for p in loop.ran if p.status == "complete"]
    return {"ran": len(loop.ran), "complete": len(done), "failed": len(loop.ran) - len(done),
            "study": st.name, "storage": st.recorded}
