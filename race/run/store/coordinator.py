"""The coordinator of a study: at most one ``race pilot`` process runs a study's grid at a time;
it records itself (``race:coordinator``: who, since when, a token, a heartbeat) and any other
``race pilot`` is refused with a one-line ``StoreError`` naming it while it lives.

``Coordination`` is a part of ``race.run.store.study.Store`` (a mixin): it reads the store's
``study``, ``me``, ``heartbeat``, ``name`` and ``masked``. Invariant: a record whose process died
on this machine, is this very process, or missed ``GRACE_FACTOR`` heartbeats is no coordinator."""
from __future__ import annotations

import os
import time
from typing import Any, Mapping

from race.run.store.base import COORDINATOR, GRACE_FACTOR, StoreError
from race.run.store.liveness import owner_is_dead


class Coordination:
    """The coordinator record of ``Store``'s study: claim, beat, release."""

    def _coordinator_gone(self, record: Mapping[str, Any]) -> bool:
        """Whether the coordinator ``record`` describes is no longer running: its process died on
        this machine, it is this very process, or it missed 3 heartbeats (another machine)."""
        if owner_is_dead(record, self.me):
            return True
        if all(record.get(k) == self.me.get(k) for k in ("host", "boot", "pidns", "pid")):
            return True
        return time.time() - float(record.get("beat", 0.0)) > GRACE_FACTOR * self.heartbeat

    def _coordinator_error(self, record: Mapping[str, Any]) -> StoreError:
        started = time.strftime("%H:%M:%S", time.localtime(float(record.get("since", 0.0))))
        return StoreError(f"study {self.name!r} in {self.masked} is already coordinated by race pilot "
                          f"(pid {record.get('pid')} on {record.get('host')}, since {started}): wait for it to finish, "
                          f"or help it with race worker --storage URL --study {self.name}")

    def claim_coordination(self) -> None:
        """Record this process as the study's coordinator, or raise ``StoreError`` (one line)
        naming the live one. Two claims at the same moment: the later write wins, the other sees
        it on its re-read and steps back."""
        assert self.study is not None
        current = self.study.user_attrs.get(COORDINATOR)
        if current and not self._coordinator_gone(current):
            raise self._coordinator_error(current)
        token = f"{self.me.get('host')}:{os.getpid()}:{time.time_ns()}"
        now = time.time()
        self.study.set_user_attr(COORDINATOR, {**self.me, "since": now, "beat": now, "token": token})
        time.sleep(0.2)
        current = self.study.user_attrs.get(COORDINATOR) or {}
        if current.get("token") != token:
            raise self._coordinator_error(current)
        self._coordination = {"token": token, "since": now, "last": now}

    def beat_coordination(self) -> None:
        """Refresh the coordinator record (at most once per heartbeat interval)."""
        mine = getattr(self, "_coordination", None)
        if mine is None or time.time() - mine["last"] < self.heartbeat:
            return
        mine["last"] = time.time()
        self.study.set_user_attr(COORDINATOR, {**self.me, "since": mine["since"], "beat": mine["last"],
                                               "token": mine["token"]})

    def release_coordination(self) -> None:
        """Clear the coordinator record if it is still this process's (best effort, at exit)."""
        mine = getattr(self, "_coordination", None)
        if mine is None or self.study is None:
            return
        self._coordination = None
        try:
            if (self.study.user_attrs.get(COORDINATOR) or {}).get("token") == mine["token"]:
                self.study.set_user_attr(COORDINATOR, None)
        except Exception:  # noqa: BLE001 — a storage gone at exit: the record goes stale by itself
            pass
