"""Pilot processes: run a list of pilot jobs, each in its own process, at most N at a time.

``race.run.study`` drives it (calibrate → plan → pilots → classify, over an optuna study);
this module knows nothing of studies. The process model (docs/interfaces.md): every pilot runs in a child process
started by a fork server that has torch / transformers / peft imported once, so a
child starts in milliseconds yet a crash or an out-of-memory kill takes only that
pilot down. The parent owns every write: after each finished pilot it rewrites
``DIR/results.json`` atomically, so nothing finished is ever lost.
"""
from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable

from race.config.configfile import GridConfig, config_from_dict
from race.core.records import PilotResult, Schedule

_PRELOAD = ["torch", "transformers", "peft", "race.engine.pilot", "race.engine.grpo", "race.engine.backends.hf",
            "race.engine.seed_axis", "race.engine.backends.lockstep"]


@dataclass(frozen=True)
class Job:
    schedule: Schedule
    seed: int

    @property
    def key(self) -> tuple[float, int]:
        return (self.schedule.rho_target, self.seed)


def lockstep_groups(jobs: list[Job], size: int) -> list[list[Job]]:
    """``jobs`` as lockstep groups: the jobs of one schedule (grid point) together, at most
    ``size`` per group, in first-seen order (``size`` 1: every job alone)."""
    by_point: dict[float, list[Job]] = {}
    for job in jobs:
        by_point.setdefault(job.schedule.rho_target, []).append(job)
    return [grp[i:i + max(1, size)] for grp in by_point.values() for i in range(0, len(grp), max(1, size))]


def _child(conn, config: dict, schedule: dict, seeds: list[int], threads: int, device: str) -> None:
    """Entry point of a pilot process: the pilots of ``seeds`` (one seed, or a lockstep group of one
    schedule) through race.engine.pilot.pilot_events, sending progress and each result back as it comes."""
    try:
        import torch

        torch.set_num_threads(threads)
        cfg = config_from_dict(config)
        sched = Schedule.from_dict(schedule)
        from race.engine.pilot import pilot_events

        last: dict[int, float] = {}
        for event in pilot_events(cfg, sched, list(seeds), device=device):
            if isinstance(event, PilotResult):
                conn.send(("result", event.to_dict()))
            elif time.monotonic() - last.get(event.seed, 0.0) > 0.5:      # progress: at most 2 lines a second
                last[event.seed] = time.monotonic()
                conn.send(("progress", event.seed, event.steps, event.spent))
    except BaseException as e:  # report, then die: the parent records every unfinished pilot as failed
        # the parent may be gone or stopping (SIGTERM, Ctrl-C): its end of the pipe is closed and the
        # report has no reader; leave quietly rather than print a BrokenPipeError after its last line
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
    finally:
        conn.close()


def _context(extra_preload: tuple[str, ...] = ()):
    if sys.platform.startswith("linux"):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD + list(extra_preload))
        return ctx
    return mp.get_context("spawn")


@contextlib.contextmanager
def _unimportable_main_hidden():
    """Pilot processes never need the caller's ``__main__``, but multiprocessing re-runs it from
    its ``__file__`` in every child: a script read from stdin (``python -``, ``<stdin>``) or a
    file deleted since has none to re-run, and each pilot would die. Hide such a ``__file__``
    while processes start (``python -c`` and notebooks have none; real scripts keep theirs)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    hide = path is not None and getattr(main, "__spec__", None) is None and not os.path.isfile(path)
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = path


def default_workers(device: str) -> int:
    """Two pilots at a time on a CPU with ≥ 2 cores (small models are overhead-bound, so two
    single-threaded pilots beat one two-threaded one); one per GPU otherwise."""
    if device.startswith("cuda"):
        return 1
    return max(1, min(2, os.cpu_count() or 1))


def pilot_threads(workers: int, device: str) -> int:
    """Torch threads per pilot process: the cores shared among ``workers`` processes on a CPU (1 on a
    GPU), or ``OMP_NUM_THREADS`` when set (several worker processes on one machine)."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, (os.cpu_count() or 1) // max(1, workers)) if not device.startswith("cuda") else 1


def busy_machine_warning(workers: int, device: str) -> str | None:
    """A line when pilots would run several OpenMP threads each on a CPU already busy with other
    work (1-minute load average ≥ half the cores): their threads then wait on each other while other
    processes hold the cores, and a pilot can take several times its quiet time (measured: a 1.5e12
    pilot that takes ≈ 80-150 s with one thread had not finished after 18 min with two, beside four
    other busy processes on 2 cores). None otherwise."""
    threads = pilot_threads(workers, device)
    if threads < 2 or device.startswith("cuda") or not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < cores / 2:
        return None
    return (f"the machine is busy (load average {load:.1f} on {cores} cores) and each pilot would run {threads} "
            f"threads: they stall each other beside other work; OMP_NUM_THREADS=1 (or --workers {cores}) is "
            "faster here")


def run_jobs(config: GridConfig, jobs: list[Job], *, workers: int, device: str = "cpu",
             on_result: Callable[[Job, PilotResult], None] | None = None,
             on_progress: Callable[[Job, int, float], None] | None = None,
             next_job: Callable[[], "Job | list[Job] | None"] | None = None,
             on_start: Callable[[Job, int], None] | None = None,
             on_tick: Callable[[], None] | None = None,
             keep_going: Callable[[], bool] | None = None, poll: float = 1.0,
             group_size: int = 1) -> list[PilotResult]:
    """Run ``jobs`` with at most ``workers`` pilot processes at once; failed pilots come back with
    ``status="failed"`` and the reason in ``extra["error"]``.

    One process runs one pilot, or a lockstep group (race.engine.seed_axis): ``group_size`` > 1 groups
    ``jobs`` by grid point (``lockstep_groups``), and ``next_job()`` may hand a list of jobs of one
    schedule. A group that dies fails every pilot of it not yet returned; the ones it returned are
    kept. For a job queue that fills while it runs (race.run.study: trials of an optuna study),
    ``next_job()`` hands the next job (or group) or None, ``keep_going()`` says whether to wait for
    more once nothing runs, ``on_start(job, pid)`` sees each pilot's process start and ``on_tick()``
    runs about every ``poll`` seconds (heartbeats)."""
    from race.engine.backends import resolve_backend

    # vLLM's import takes 10–20 s: the fork server does it once for all pilots
    ctx = _context(("vllm.entrypoints.llm", "race.engine.backends.vllm") if resolve_backend(config.backend) == "vllm" else ())
    pool = _Pool(ctx, config.to_dict(), pilot_threads(workers, device), device, on_result=on_result,
                 on_progress=on_progress, on_start=on_start)
    pending: list[list[Job]] = lockstep_groups(list(jobs), group_size)
    try:
        while pending or pool.running or (keep_going is not None and keep_going()):
            while len(pool.running) < workers:
                got = pending.pop(0) if pending else (next_job() if next_job else None)
                if not got:
                    break
                pool.start(list(got) if isinstance(got, list) else [got])
            if on_tick:
                on_tick()
            if not pool.running:
                time.sleep(poll)
                continue
            ready = wait(list(pool.running) + [p.sentinel for p, _ in pool.running.values()], timeout=poll)
            for conn in list(pool.running):
                pool.collect(conn, ready)
    except BaseException:  # stopping (SIGTERM, Ctrl-C, an error in a callback): no pilot outlives the caller
        _stop(pool.running)
        raise
    return pool.results


class _Pool:
    """The pilot processes of one ``run_jobs`` call: each runs one job or one lockstep group, its
    messages read from its pipe (progress, a result per seed, or an error)."""

    def __init__(self, ctx: Any, cfg: dict, threads: int, device: str, *,
                 on_result: Callable[[Job, PilotResult], None] | None,
                 on_progress: Callable[[Job, int, float], None] | None,
                 on_start: Callable[[Job, int], None] | None):
        self.ctx, self.cfg, self.threads, self.device = ctx, cfg, threads, device
        self.on_result, self.on_progress, self.on_start = on_result, on_progress, on_start
        self.running: dict = {}            # pipe → (process, {seed: job not yet returned})
        self.results: list[PilotResult] = []

    def start(self, group: list[Job]) -> None:
        """One process for ``group`` (one job, or a grid point's seeds in lockstep)."""
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_child, args=(child, self.cfg, group[0].schedule.to_dict(),
                                                     [j.seed for j in group], self.threads, self.device), daemon=True)
        with _unimportable_main_hidden():
            proc.start()
        child.close()
        self.running[parent] = (proc, {j.seed: j for j in group})
        if self.on_start:
            for job in group:
                self.on_start(job, proc.pid)

    def finish(self, job: Job, result: PilotResult) -> None:
        self.results.append(result)
        if self.on_result:
            self.on_result(job, result)

    def collect(self, conn: Any, ready: list) -> None:
        """Read what the process behind ``conn`` sent; when it is done (every seed returned, an error, or
        it died), fail the seeds it did not return and forget it."""
        proc, left = self.running[conn]
        done, error = False, None
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "progress" and self.on_progress and msg[1] in left:
                    self.on_progress(left[msg[1]], msg[2], msg[3])
                elif msg[0] == "result":
                    result = PilotResult.from_dict(msg[1])
                    job = left.pop(result.seed, None)
                    if job is not None:
                        self.finish(job, result)
                    done = not left
                elif msg[0] == "error":
                    error, done = (msg[1], msg[2]), True
        except (EOFError, OSError):
            done = True
        if not done and proc.sentinel in ready and not proc.is_alive():
            done = True
        if done:
            proc.join(timeout=5)
            if error is None and left:
                code = proc.exitcode
                why = ("killed by signal 9 (out of memory?)" if code == -9 else f"exited with code {code}")
                error = (f"pilot process {why}", "")
            for job in list(left.values()):
                self.finish(job, _failed(job, *error))
            del self.running[conn]
            conn.close()


def _stop(running: dict) -> None:
    """End every pilot process still running and wait for it, so that none writes to the terminal
    after the caller's last line (each pilot's storage row is the caller's to settle)."""
    for proc, _ in running.values():
        with contextlib.suppress(Exception):
            proc.terminate()
    for conn, (proc, _) in list(running.items()):
        with contextlib.suppress(Exception):
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        with contextlib.suppress(Exception):
            conn.close()
    running.clear()


def _failed(job: Job, error: str, tb: str) -> PilotResult:
    from race.core.records import FlopBreakdown

    return PilotResult(rho_target=job.schedule.rho_target, seed=job.seed, flops=FlopBreakdown(), evals={},
                       schedule=job.schedule, status="failed", extra={"error": error, "traceback": tb[-4000:]})


def eta_seconds(*, elapsed: float, done: int, total: int) -> float:
    """Seconds left if the remaining pilots go at the pace so far (pilots run in parallel, so
    the pace is elapsed / done, not one pilot's time); 0 when all are done."""
    if done <= 0 or done >= total:
        return 0.0
    return elapsed / done * (total - done)


class Progress:
    """One status line on stderr: grid point, seed, step and FLOPs of running pilots."""

    def __init__(self, total: int, budget: float, enabled: bool = True):
        self.total, self.budget, self.enabled = total, budget, enabled
        self.done, self.live = 0, {}
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def update(self, job: Job, step: int, spent: float) -> None:
        self.live[job.key] = (step, spent)
        self._draw()

    def finish(self, job: Job, result: PilotResult) -> None:
        self.done += 1
        self.live.pop(job.key, None)
        if not self.enabled:
            return
        score = f"reward {result.score('reward'):.3f}" if result.status == "complete" else result.extra.get("error")
        self._clear()
        elapsed = time.monotonic() - self.t0
        left = eta_seconds(elapsed=elapsed, done=self.done, total=self.total)
        print(f"[{self.done}/{self.total}] ρ={job.schedule.rho_target:g} seed {job.seed}: {result.status}, "
              f"ρ measured {result.rho:.3f}, {result.flops.total:.3g} FLOPs, {score} "
              f"(pilot {sum(result.wall_seconds.values()):.0f} s, {elapsed:.0f} s elapsed"
              + (f", ~{left:.0f} s left)" if left else ")"), file=sys.stderr, flush=True)

    def _clear(self) -> None:
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr)

    def _draw(self) -> None:
        if not (self.enabled and self.tty):
            return
        parts = [f"ρ={r:g}/s{s} step {st} {sp / self.budget:4.0%}" for (r, s), (st, sp) in sorted(self.live.items())]
        print(f"\r\033[K[{self.done}/{self.total} done] " + " | ".join(parts), end="", file=sys.stderr, flush=True)
