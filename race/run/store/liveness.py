"""Who runs a trial, and whether that process is gone: host, boot id, pid namespace, pid and
start time. Invariant: a process is declared dead only when it certainly ran on this machine
(same host, boot and pid namespace) and its pid is gone or now belongs to a younger process;
anything elsewhere is judged by missed heartbeats instead (race.run.store.study)."""
from __future__ import annotations

import os
import socket
from typing import Any, Mapping


def age_seconds(start) -> float | None:
    """Seconds since optuna's ``datetime_start`` (naive local time of the claiming machine)."""
    if start is None:
        return None
    import datetime as _dt

    now = _dt.datetime.now(start.tzinfo) if start.tzinfo else _dt.datetime.now()
    return (now - start).total_seconds()


def owner_info() -> dict[str, Any]:
    """Who runs a trial: host, boot id, pid namespace, pid and process start time, so that a
    process on the same machine can tell for sure that the owner is gone."""
    info: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            info["boot"] = fh.read().strip()
        info["pidns"] = os.readlink("/proc/self/ns/pid")
        info["start"] = _proc_start(os.getpid())
    except OSError:
        pass
    return info


def _proc_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_is_dead(owner: Mapping[str, Any] | None, me: Mapping[str, Any]) -> bool:
    """True only when ``owner`` certainly ran on this machine (same host, boot, pid namespace)
    and its process no longer exists (or the pid now belongs to a younger process)."""
    if not owner or "boot" not in me:
        return False
    if any(owner.get(k) != me.get(k) for k in ("host", "boot", "pidns")):
        return False
    pid = int(owner.get("pid", -1))
    if pid == me["pid"]:
        return False
    start = _proc_start(pid)
    return start is None or (owner.get("start") is not None and start != owner["start"])
