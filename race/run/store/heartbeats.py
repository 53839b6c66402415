"""Liveness of a study's trials: the heartbeats of the trials this process holds (with their
progress), and the sweep that fails RUNNING trials whose process is gone and enqueues their
pilots again (docs/storage.md).

``Heartbeats`` is a part of ``race.run.store.study.Store`` (a mixin): it reads and updates the
store's ``study``, ``storage``, ``heartbeat``, ``me``, ``url``, ``requeued`` and its bookkeeping
(``_last_beat``, ``_progress``, ``_mine``), and lists trials with ``Store.trials``. Invariants: a
RUNNING trial is failed as abandoned only when its owner certainly died on this machine, when it
was claimed more than the grace period (``GRACE_FACTOR`` heartbeats) ago by a process that never
recorded itself, or when its heartbeat is older than the grace period (optuna's
``fail_stale_trials``); the pilot of a trial failed so is enqueued again, the new trial saying why
(``retry_of``, ``retry_reason``)."""
from __future__ import annotations

import sys
import time
import warnings
from typing import Callable, Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from race.run.store.base import GRACE_FACTOR, OWNER
from race.run.store.engine import JournalHeartbeatStorage, first_line
from race.run.store.info import Claim
from race.run.store.liveness import age_seconds, owner_is_dead
from race.run.store.trials import Key, key_of


class Heartbeats:
    """The heartbeats of ``Store``'s trials and the sweep of abandoned ones."""

    def set_heartbeat(self, seconds: int) -> None:
        """Heartbeat interval (and grace = 3 intervals) of this process, from the study's setting."""
        self.heartbeat = max(1, int(seconds))
        grace = GRACE_FACTOR * self.heartbeat
        if isinstance(self.storage, JournalHeartbeatStorage):
            self.storage._race_hb = (self.heartbeat, grace, self.storage._race_hb[2])
        else:
            self.storage.heartbeat_interval, self.storage.grace_period = self.heartbeat, grace

    def update_heartbeat(self, seconds: int) -> None:
        """Change the study's heartbeat (processes that join later use it)."""
        assert self.study is not None
        self.study.set_user_attr("race:heartbeat", max(1, int(seconds)))
        self.set_heartbeat(seconds)


    def _beat_one(self, trial_id: int) -> None:
        """One heartbeat of trial ``trial_id`` (when the storage keeps heartbeats)."""
        from optuna.storages._heartbeat import is_heartbeat_enabled

        st = self.study._storage if self.study is not None else self.storage
        if is_heartbeat_enabled(st):
            st.record_heartbeat(trial_id)

    def progress(self, claim: Claim, step: int, flops: float) -> None:
        """Note ``claim``'s latest step and FLOPs; the next ``beat`` stores them."""
        self._progress[claim.trial_id] = {"step": int(step), "flops": float(flops)}

    def beat(self, claims: Iterable[Claim], *, force: bool = False) -> None:
        """Heartbeats (and the latest progress) of the trials this process holds, every interval."""
        now = time.monotonic()
        if not force and now - self._last_beat < self.heartbeat:
            return
        self._last_beat = now
        assert self.study is not None
        for c in claims:
            try:
                self._beat_one(c.trial_id)
                if c.trial_id in self._progress:
                    self.study._storage.set_trial_user_attr(c.trial_id, "progress", self._progress.pop(c.trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass   # failed as stale meanwhile: complete() still keeps the result if no retry finished

    def heartbeats(self, claims: Callable[[], Iterable[Claim]]) -> Callable[[], None]:
        """Beat for ``claims()`` from a background thread (a pilot process can take long to start);
        returns the function that stops it."""
        import threading

        stop = threading.Event()

        def run() -> None:
            while not stop.wait(self.heartbeat):
                try:
                    self.beat(list(claims()), force=True)
                except Exception as e:  # noqa: BLE001 — a storage hiccup must not kill the grid
                    print(f"race: heartbeat failed: {first_line(e, self.url)}", file=sys.stderr, flush=True)

        thread = threading.Thread(target=run, name="race-heartbeat", daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join(timeout=5)

        return halt

    def set_pid(self, claim: Claim, pid: int) -> None:
        """Record the pid of the process running ``claim``'s pilot (a trial failed meanwhile takes none)."""
        assert self.study is not None
        try:
            self.study._storage.set_trial_user_attr(claim.trial_id, "pilot_pid", int(pid))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass

    def sweep(self) -> list[Key]:
        """Fail RUNNING trials whose process is gone (dead on this machine, or heartbeat stale)
        and enqueue their pilots again; returns the pilots re-enqueued."""
        assert self.study is not None
        self.requeued = []
        st = self.study._storage
        grace = GRACE_FACTOR * self.heartbeat
        for t in self.trials((TrialState.RUNNING,)):
            owner = t.system_attrs.get(OWNER)
            if owner is None:
                # claimed (WAITING → RUNNING) by a process killed before it recorded itself or a
                # heartbeat: nothing else would ever fail it, and a grid waiting for it would hang
                age = age_seconds(t.datetime_start)
                if age is None or age <= grace:
                    continue
                why = (f"it was claimed {age:.0f} s ago by a process that died before recording itself "
                       "(no owner, no heartbeat)")
            elif owner_is_dead(owner, self.me):
                why = f"its process {owner.get('host')}:{owner.get('pid')} died"
            else:
                continue
            try:   # attributes first: a finished trial takes none
                st.set_trial_user_attr(t._trial_id, "error", f"pilot abandoned: {why}")
                st.set_trial_user_attr(t._trial_id, "stale", True)
                if not st.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            self._mark_stale(t, why)
        for tid in list(self._mine):           # our own trials are alive, whatever our heartbeat thread did
            try:
                self._beat_one(tid)
            except optuna.exceptions.UpdateFinishedTrialError:
                self._mine.discard(tid)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        return self.requeued

    def _on_stale(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """optuna's heartbeat-stale callback: this process failed ``trial``; enqueue its pilot again."""
        owner = trial.system_attrs.get(OWNER) or {}
        self._mark_stale(trial, f"no heartbeat for {GRACE_FACTOR * self.heartbeat} s from "
                                f"{owner.get('host', '?')}:{owner.get('pid', '?')} (worker died or lost the storage)",
                         study=study)

    def _mark_stale(self, t: FrozenTrial, why: str, study: optuna.Study | None = None) -> None:
        """Enqueue the pilot of a trial failed for want of a live owner; the new trial says why."""
        study = study or self.study
        assert study is not None
        key = key_of(t)
        if key is not None:            # a stage of budget halving stays that stage
            rung = {"rung": t.user_attrs["rung"]} if t.user_attrs.get("rung") is not None else {}
            study.enqueue_trial({"rho": key[0], "seed": key[1]},
                                user_attrs={"retry_of": t.number, "retry_reason": f"pilot abandoned: {why}", **rung})
            self.requeued.append(key)
