"""Custom rewards run in a child process, with a time limit per batch.

A user's reward is untrusted code: it may hang, call ``sys.exit``, raise ``KeyboardInterrupt``
or print to stdout. ``IsolatedReward`` runs it in its own Python process (one per pilot, and
one for calibration), started with ``subprocess`` (pilot processes are daemonic and may not
fork multiprocessing children), and talks to it over JSON lines on a pipe that user ``print``
cannot reach (the child's fd 1 is pointed at stderr). Invariants:

- a batch that does not come back within ``timeout`` seconds kills the child, with everything it
  started (``kill_tree``: descendants by /proc parent links, ``setsid`` ones too, then its group), and raises
  ``RewardFailed`` naming the reward and the limit; so does a child that exits (``sys.exit``,
  ``os._exit``, a crash) or whose reward raises a ``BaseException`` that is not an
  ``Exception``: the pilot fails with that one line, never the coordinator;
- an ordinary ``Exception`` from one sample scores that sample 0 and is counted, as
  in-process rewards are (``race.tasks.rewards.score_completions``);
- importing the reward happens in the child too, under the same limit, so a module whose
  import hangs cannot hang the process that checks it.

Built-in rewards (rules, PRMs) stay in-process: math checkers that rely on ``signal.alarm``
keep working there.

``call_forked`` is the same machinery for a Python callable that has no importable name (the
full-run watch's checker, race.fullrun.watch): it runs ``fn()`` in a forked child (its own session,
a copy of this process, nothing to import), reads the pickled answer back over a pipe under the
same deadline, and on a timeout ends the child with ``kill_tree``: a checker that never returns
leaves nothing running behind.
"""
from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import time
from typing import NoReturn, Sequence

from race.core.errors import RaceError

DEFAULT_TIMEOUT = 60.0          # seconds per scored batch (reward.timeout)


class RewardFailed(RaceError):
    """A custom reward that hung, exited or raised a BaseException: the pilot stops with this line."""


def _encode(obj) -> bytes:
    return (json.dumps(obj, allow_nan=False) + "\n").encode()


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` by parent links in /proc (Linux; elsewhere none), children
    that started their own session (``setsid``) included, as long as their parent lives."""
    kids: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode("ascii", "replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a reward process and everything it started: its descendants first (found while it is
    alive to parent them, so a ``setsid`` child does not outlive it), then its process group, then it."""
    import signal

    for pid in _descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)       # its own group (start_new_session): any child left in it
    except OSError:
        pass
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()


class _Forked:
    """A forked child as ``kill_tree`` handles it (the part of ``subprocess.Popen`` it uses)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        import signal

        os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            except ChildProcessError:
                self.returncode = -1
        return self.returncode


def can_fork() -> bool:
    """Whether ``call_forked`` can run here (a POSIX ``os.fork``)."""
    return hasattr(os, "fork") and hasattr(os, "setsid")


def _pickled(value: object) -> bytes:
    """The child's answer, pickled: the value, or (an iterator, a generator) its items as a list, or
    a TypeError saying it cannot be sent back."""
    import pickle

    try:
        return pickle.dumps(("value", value))
    except Exception:  # noqa: BLE001
        pass
    try:
        return pickle.dumps(("value", list(value)))          # type: ignore[call-overload]
    except Exception:  # noqa: BLE001
        return pickle.dumps(("raised", ("TypeError", f"returned a {type(value).__name__}, which cannot be sent back "
                                                     "from its process (expected a list of numbers)")))


def _child(fn, r: int, w: int) -> NoReturn:
    """``call_forked``'s child: closes the read end ``r``, runs ``fn`` in a session of its own, writes its
    answer (pickled) to ``w``, and exits (code 3 when the pipe is gone); never returns."""
    import pickle

    code = 0
    try:
        os.close(r)
        os.setsid()                            # its own group: kill_tree ends what it starts too
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 — reported to the parent, whatever it is
            payload = pickle.dumps(("raised", (type(e).__name__, str(e)[:2000])))
        else:
            payload = _pickled(value)
        with os.fdopen(w, "wb") as out:
            out.write(payload)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    except BaseException:  # noqa: BLE001 — the pipe is gone (the parent gave up): leave quietly
        code = 3
    finally:
        os._exit(code)


def call_forked(fn, timeout: float) -> tuple[str, object]:
    """``fn()`` in a forked child under ``timeout`` seconds (module docstring). Returns ``("value", v)``,
    ``("raised", (type name, message))`` for any exception (``SystemExit`` included), ``("timeout",
    None)`` after killing the child and all it started, or ``("exited", code)`` when the child died
    without an answer (``os._exit``, a signal). ``v`` must pickle; an iterator is sent as a list."""
    import pickle

    timeout = float(timeout)
    for stream in (sys.stdout, sys.stderr):        # nothing buffered here is written twice by the child
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                   # the child: never returns into the caller's code
        _child(fn, r, w)
    os.close(w)
    child = _Forked(pid)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kill_tree(child)
                return "timeout", None
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    except BaseException:
        kill_tree(child)                           # interrupted while waiting: the child does not outlive it
        raise
    finally:
        os.close(r)
    code = child.wait()
    if not chunks:
        return "exited", code
    try:
        return pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001 — a child that died mid-answer
        return "exited", code


class IsolatedReward:
    """``fn(prompt, completion, reference)`` of ``spec`` ("module:fn" or "file.py:fn") in a child
    process; ``score_batch`` scores many samples in one round trip."""

    def __init__(self, spec: str, *, timeout: float = DEFAULT_TIMEOUT):
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and math.isfinite(timeout)
                and timeout > 0):
            raise RaceError(f"reward.timeout {timeout!r} must be a positive number of seconds")
        self.spec, self.timeout = spec, float(timeout)
        self._proc: subprocess.Popen | None = None
        self._buffer = b""

    # -- process
    def start(self) -> "IsolatedReward":
        """Start the child and import the reward there (``RewardError``-style one line if it cannot)."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        env = dict(os.environ)
        self._proc = subprocess.Popen([sys.executable, "-c", "from race.tasks.rewards.isolated import serve; serve()"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=os.getcwd(),
                                      start_new_session=True)       # its own group: kill_tree ends it whole
        self._buffer = b""
        reply = self._ask({"op": "init", "spec": self.spec, "path": list(sys.path)}, what="importing it")
        if reply.get("error"):
            self.close()
            from race.tasks.rewards.base import RewardError

            raise RewardError(reply["error"])
        return self

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    kill_tree(proc)
        except OSError:
            pass

    def __del__(self) -> None:          # pragma: no cover — best effort at interpreter exit
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def _fail(self, why: str) -> RewardFailed:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            kill_tree(proc)
        return RewardFailed(f"reward {self.spec!r} {why}")

    def _ask(self, message: dict, *, what: str) -> dict:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(_encode(message))
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._fail(f"ended its process (exit code {proc.poll()}) before {what}") from None
        deadline = time.monotonic() + self.timeout
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"did not return within {self.timeout:g} s (reward.timeout) while {what}")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = proc.wait()
                raise self._fail(f"ended its process (exit code {code}) while {what}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line)
        if reply.get("fatal"):
            raise self._fail(reply["fatal"] + f" while {what}")
        return reply

    # -- scoring
    def score_batch(self, prompts: Sequence[str], completions: Sequence[str], references: Sequence[str]):
        from race.tasks.rewards.base import RewardBatch

        self.start()
        n = len(prompts)
        t0 = time.process_time()
        reply = self._ask({"op": "score", "prompts": list(prompts), "completions": list(completions),
                           "references": list(references)}, what=f"scoring a batch of {n} samples")
        return RewardBatch(scores=[float(v) for v in reply["scores"]], errors=int(reply["errors"]),
                           cpu_seconds=float(reply["cpu_seconds"]) + time.process_time() - t0, flops=0.0,
                           first_error=reply.get("first_error"))

    def __call__(self, prompt: str, completion: str, reference: str) -> float:
        return self.score_batch([prompt], [completion], [reference]).scores[0]


def serve() -> None:
    """The child's loop: JSON lines in on stdin, out on the original stdout (user prints go to stderr)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        try:
            out.write(_encode(obj))
            out.flush()
        except (BrokenPipeError, OSError):     # the parent is gone (killed on a timeout): leave quietly
            os._exit(0)

    reward = None
    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        if msg["op"] == "init":
            sys.path[:] = msg["path"]
            try:
                from race.tasks.rewards.base import get_reward

                reward = get_reward(msg["spec"])
                send({"ok": True})
            except Exception as e:  # noqa: BLE001 — an import error is the user's to see, in one line
                send({"error": str(e).splitlines()[0] if str(e) else type(e).__name__})
            except BaseException as e:  # noqa: BLE001 — SystemExit / KeyboardInterrupt at import
                send({"fatal": f"raised {type(e).__name__}({e})"})
                os._exit(3)
            continue
        from race.tasks.rewards.base import score_each

        try:
            batch = score_each(reward, msg["prompts"], msg["completions"], msg["references"])
        except BaseException as e:  # noqa: BLE001 — sys.exit(), KeyboardInterrupt…: the pilot stops
            send({"fatal": f"raised {type(e).__name__}({e})"})
            os._exit(3)
        send({"scores": batch.scores, "errors": batch.errors, "first_error": batch.first_error,
              "cpu_seconds": batch.cpu_seconds})
