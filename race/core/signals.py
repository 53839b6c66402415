"""SIGTERM taken the way Ctrl-C is: ``Terminated`` (a ``KeyboardInterrupt``), raised in the main thread.

A raise from a signal handler can be lost: when the signal lands inside C code that clears a pending
exception (seen: a SIGTERM during numpy's lazy ``import numpy.random``, whose Cython module init
dropped it), the command ran to its end and exited 0. So the handler also sets a flag, and the long
loops call ``raise_if_terminated`` at their safe points (the pilot pool polls it every second).

Invariants: nothing is installed unless ``on_sigterm`` is called (the CLI does; ``race.diagnose``
leaves the caller's handlers alone); only the main thread installs; stdlib only.
"""
from __future__ import annotations

import signal
import threading

_received = threading.Event()


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken the way Ctrl-C is (the storage keeps every finished pilot), then named."""


def _handler(signum, frame) -> None:  # noqa: ANN001, ARG001
    _received.set()
    raise Terminated()


def on_sigterm() -> None:
    """Install the handler (main thread only; elsewhere, or where signals cannot be set, nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _received.clear()
    try:
        signal.signal(signal.SIGTERM, _handler)
    except (ValueError, OSError):
        pass


def raise_if_terminated() -> None:
    """Raise ``Terminated`` again if a SIGTERM came and its first raise was swallowed on the way."""
    if _received.is_set():
        raise Terminated()
