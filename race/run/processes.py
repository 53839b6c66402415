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
from typing import Any, Iterable, Iterator

from race.config.configfile import GridConfig, config_from_dict
from race.core.records import PilotResult, Schedule
from race.core.signals import raise_if_terminated

_PRELOAD = ["torch", "transformers", "peft", "race.engine.pilot", "race.engine.grpo", "race.engine.backends.hf",
            "race.engine.seed_axis", "race.engine.backends.lockstep"]


@dataclass(frozen=True)
class Job:
    """One pilot to run: its schedule and seed, and for a stage of budget halving (race.run.adaptive.budget)
    where it pauses (``stop_at``: a FLOP mark; None: its budget), the folder its state is saved in
    (``state_dir``) and the one it continues from (``resume_from``; None: from scratch)."""

    schedule: Schedule
    seed: int
    stop_at: float | None = None
    state_dir: str | None = None
    resume_from: str | None = None

    @property
    def key(self) -> tuple[float, int]:
        return (self.schedule.rho_target, self.seed)

    @property
    def pause(self) -> dict[str, Any] | None:
        """What the pilot process passes on to race.engine.pilot.pilot_events (None: an ordinary pilot)."""
        if self.state_dir is None:
            return None
        return {"stop_at": self.stop_at, "state_dir": self.state_dir, "resume_from": self.resume_from}


def lockstep_groups(jobs: list[Job], size: int) -> list[list[Job]]:
    """``jobs`` as lockstep groups: the jobs of one schedule (grid point) and one pause (mark, state
    folders) together, at most ``size`` per group, in first-seen order (``size`` 1: every job alone)."""
    by_point: dict[tuple, list[Job]] = {}
    for job in jobs:
        by_point.setdefault((job.schedule.rho_target, job.stop_at, job.state_dir, job.resume_from), []).append(job)
    return [grp[i:i + max(1, size)] for grp in by_point.values() for i in range(0, len(grp), max(1, size))]


def _child(conn, config: dict, schedule: dict, seeds: list[int], threads: int, device: str,
           pause: dict | None = None) -> None:
    """Entry point of a pilot process: the pilots of ``seeds`` (one seed, or a lockstep group of one
    schedule) through race.engine.pilot.pilot_events, sending progress and each result back as it comes.
    ``pause`` (``Job.pause``): a stage of budget halving, whose seeds send a ``paused`` message at the mark."""
    try:
        import torch

        torch.set_num_threads(threads)
        cfg = config_from_dict(config)
        sched = Schedule.from_dict(schedule)
        from race.engine.pilot import pilot_events

        last: dict[int, float] = {}
        for event in pilot_events(cfg, sched, list(seeds), device=device, **_continuation(sched, seeds, pause)):
            if isinstance(event, PilotResult):
                conn.send(("result", event.to_dict()))
            elif hasattr(event, "state_file"):          # race.engine.continuation.PilotPaused
                conn.send(("paused", event.to_dict()))
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


def _continuation(schedule: Schedule, seeds: list[int], pause: dict | None) -> dict:
    """``pilot_events``' pause arguments for ``Job.pause``: a stage that continues from another rung's
    folder first copies each seed's state there into its own (through race.core.safeio.write_inside; the
    source read without following a link), so a stage killed mid-way restarts from the same state, and the
    state it saves never overwrites the one it started from."""
    if not pause:
        return {}
    state_dir, source = pause["state_dir"], pause.get("resume_from")
    if source and os.path.abspath(source) != os.path.abspath(state_dir):
        from race.engine.continuation import copy_state

        for seed in seeds:
            copy_state(source, state_dir, schedule, seed)
    return {"stop_at": pause.get("stop_at"), "state_dir": state_dir, "resume": bool(source)}


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


@dataclass(frozen=True)
class Started:
    """A pilot process started for ``jobs`` (one job, or a grid point's seeds in lockstep)."""

    jobs: tuple[Job, ...]
    pid: int


@dataclass(frozen=True)
class Progressed:
    """A running pilot's steps done and FLOPs spent."""

    job: Job
    step: int
    spent: float


@dataclass(frozen=True)
class Finished:
    """A pilot's result: complete, or failed with the reason in ``extra["error"]``."""

    job: Job
    result: PilotResult


@dataclass(frozen=True)
class Paused:
    """A stage of budget halving stopped at its mark: ``paused`` is its
    race.engine.continuation.PilotPaused (the held-out reading there, its state file)."""

    job: Job
    paused: Any


@dataclass(frozen=True)
class Tick:
    """About every ``poll`` seconds: how many processes run and how many groups wait for a slot.
    A caller that feeds the pool (``submit``) does it here; ``running + waiting == 0``: the pool is idle."""

    running: int
    waiting: int


Event = Started | Progressed | Finished | Paused | Tick


class PilotPool:
    """At most ``workers`` pilot processes at once, their messages turned into events.

    ``submit(jobs)`` queues jobs (grouped by grid point, ``lockstep_groups``); iterating yields
    ``Started``, ``Progressed``, ``Finished`` and ``Tick`` events as they happen, for as long as the
    caller iterates (a ``Tick`` with nothing running or waiting says the pool is idle). The pool calls
    nothing of its caller's. Used as a context manager, it ends every process still running when the
    block is left (an error, Ctrl-C, SIGTERM), so none outlives the caller. A group that dies fails
    every pilot of it not yet returned; the ones it returned are kept."""

    def __init__(self, config: GridConfig, *, workers: int, device: str = "cpu", poll: float = 1.0,
                 group_size: int = 1):
        from race.engine.backends import resolve_backend

        # vLLM's import takes 10–20 s: the fork server does it once for all pilots
        vllm = resolve_backend(config.backend) == "vllm"
        self.ctx = _context(("vllm.entrypoints.llm", "race.engine.backends.vllm") if vllm else ())
        self.cfg, self.threads, self.device = config.to_dict(), pilot_threads(workers, device), device
        self.workers, self.poll, self.group_size = workers, poll, max(1, group_size)
        self.running: dict = {}            # pipe → (process, {seed: job not yet returned})
        self.waiting: list[list[Job]] = []
        self.t0, self.process_seconds, self._born = time.monotonic(), 0.0, {}

    def profile(self) -> dict:
        """Where the pool's process slots went so far: ``seconds`` since it opened, ``slots`` (workers),
        ``process_seconds`` (the pilot processes' lifetimes, the running ones' so far) and
        ``idle_seconds`` (slot-seconds with no process: waiting for pilots to claim or for the last
        process of a round)."""
        now = time.monotonic()
        alive = sum(now - born for born in self._born.values())
        seconds = now - self.t0
        busy = self.process_seconds + alive
        return {"seconds": seconds, "slots": self.workers, "process_seconds": busy,
                "idle_seconds": max(0.0, self.workers * seconds - busy)}

    def __enter__(self) -> "PilotPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        _stop(self.running)

    def submit(self, jobs: "Job | list[Job]") -> None:
        """Queue ``jobs``: a job, or jobs grouped by grid point into lockstep groups of ``group_size``
        (a list handed by a queue is one group of one schedule)."""
        self.waiting += lockstep_groups(jobs if isinstance(jobs, list) else [jobs], self.group_size)

    @property
    def free(self) -> int:
        """Process slots that no running or waiting group takes."""
        return max(0, self.workers - len(self.running) - len(self.waiting))

    def __iter__(self) -> Iterator[Event]:
        while True:
            raise_if_terminated()       # a SIGTERM whose raise was lost (race.core.signals)
            while self.waiting and len(self.running) < self.workers:
                yield self._start(self.waiting.pop(0))
            yield Tick(len(self.running), len(self.waiting))
            if not self.running:
                if not self.waiting:
                    time.sleep(self.poll)
                continue
            ready = wait(list(self.running) + [p.sentinel for p, _ in self.running.values()], timeout=self.poll)
            for conn in list(self.running):
                yield from self._collect(conn, ready)

    def _start(self, group: list[Job]) -> Started:
        """One process for ``group`` (one job, or a grid point's seeds in lockstep)."""
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_child, args=(child, self.cfg, group[0].schedule.to_dict(),
                                                     [j.seed for j in group], self.threads, self.device,
                                                     group[0].pause), daemon=True)
        with _unimportable_main_hidden():
            proc.start()
        child.close()
        self.running[parent] = (proc, {j.seed: j for j in group})
        self._born[parent] = time.monotonic()
        return Started(tuple(group), proc.pid)

    def _collect(self, conn: Any, ready: list) -> Iterator[Event]:
        """The events of what the process behind ``conn`` sent; when it is done (every seed returned, an
        error, or it died), fail the seeds it did not return and forget it."""
        proc, left = self.running[conn]
        done, error = False, None
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "progress" and msg[1] in left:
                    yield Progressed(left[msg[1]], msg[2], msg[3])
                elif msg[0] in ("result", "paused"):     # a seed's end: its result, or its reading at a mark
                    if msg[0] == "result":
                        record, event = PilotResult.from_dict(msg[1]), Finished
                    else:
                        from race.engine.continuation import PilotPaused

                        record, event = PilotPaused.from_dict(msg[1]), Paused
                    job = left.pop(record.seed, None)
                    if job is not None:
                        yield event(job, record)
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
            del self.running[conn]
            self.process_seconds += time.monotonic() - self._born.pop(conn)
            conn.close()
            for job in list(left.values()):
                yield Finished(job, _failed(job, *error))


def run_jobs(config: GridConfig, jobs: list[Job], *, workers: int, device: str = "cpu", poll: float = 1.0,
             group_size: int = 1) -> Iterator[Event]:
    """The events of running ``jobs`` with at most ``workers`` pilot processes at once (``PilotPool``),
    until every one is ``Finished``: failed pilots come with ``status="failed"`` and the reason in
    ``extra["error"]``. ``group_size`` > 1 runs the seeds of a grid point in lockstep groups. Closing the
    generator (or an error while it runs) ends every process still running."""
    with PilotPool(config, workers=workers, device=device, poll=poll, group_size=group_size) as pool:
        pool.submit(list(jobs))
        for event in pool:
            if isinstance(event, Tick) and not (event.running or event.waiting):
                return
            yield event


def finished_results(events: Iterator[Event]) -> list[PilotResult]:
    """The results of ``events`` (``run_jobs``'), in the order they finished."""
    return [e.result for e in events if isinstance(e, Finished)]


# a pilot's wall_seconds by what they bought: the counted step (its FLOPs are the pilot's budget), the
# held-out evaluations (their FLOPs are recorded apart, never in C_total), loading the policy
COUNTED_PHASES = ("rollout", "reward", "update", "sync")
EVAL_PHASES = ("eval", "checkpoints", "downstream", "readings")    # readings: budget halving's at each rung


def wall_split(pilots: list[PilotResult], pool: dict, *, calibration_seconds: float | None = None,
               total_seconds: float | None = None, stopped: Iterable[Any] = ()) -> dict:
    """Where a grid's wall time went, from its pilots' ``wall_seconds`` and its pool's ``profile()``.

    The pool's slot-seconds (``slots`` × its seconds) split into counted pilot work, held-out
    evaluation, loading the policy (each pilot's ``setup``), process start and the rest of a pilot
    process's life (imports, data, results back: its lifetime less its pilots' phases) and idle
    slots; each divided by ``slots`` is its share of the pool's wall seconds. With
    ``total_seconds``, the rest of the grid's wall beside calibration and the pool is ``coordination``
    (storage, planning, classifying). ``counted_flops``: the complete pilots' metered FLOPs. ``stopped``: budget
    halving's stages that paused at a rung and went no further (race.engine.continuation.PilotPaused): their
    seconds and training FLOPs count as a pilot's."""
    stopped = list(stopped)
    walls = [p.wall_seconds for p in pilots] + [s.wall_seconds for s in stopped]

    def phase(names: tuple[str, ...]) -> float:
        return sum(w.get(k, 0.0) for w in walls for k in names)

    work, evals, loading = phase(COUNTED_PHASES), phase(EVAL_PHASES), phase(("setup",))
    start = pool["process_seconds"] - sum(sum(w.values()) for w in walls)
    slots = {"counted_work": work, "held_out_eval": evals, "loading": loading,
             "process_start_and_other": max(0.0, start), "idle": pool["idle_seconds"]}
    out = {"slots": pool["slots"], "pool_seconds": pool["seconds"], "slot_seconds": slots,
           "counted_flops": sum(p.flops.total for p in pilots if p.status == "complete")
           + sum(s.flops.total for s in stopped),
           "calibration_seconds": calibration_seconds, "total_seconds": total_seconds}
    if total_seconds is not None:
        out["coordination_seconds"] = max(0.0, total_seconds - pool["seconds"] - (calibration_seconds or 0.0))
    return out


def render_wall_split(split: dict, *, peak_flop_s: float | None = None) -> list[str]:
    """``wall_split`` as lines: the pool's wall seconds by part (slot-seconds ÷ slots), calibration and
    coordination beside it, and with ``peak_flop_s`` (the machine's matmul peak, all cores) the counted
    FLOPs as a fraction of what that peak does in the grid's wall time."""
    n, total = split["slots"], split["total_seconds"]
    parts = {"counted pilot work": split["slot_seconds"]["counted_work"],
             "held-out evaluation": split["slot_seconds"]["held_out_eval"],
             "loading the policy": split["slot_seconds"]["loading"],
             "process start and the rest": split["slot_seconds"]["process_start_and_other"],
             "idle slots (waiting on workers)": split["slot_seconds"]["idle"]}
    whole = total or split["pool_seconds"]
    lines = [f"wall {whole:.1f} s; the pilot pool {split['pool_seconds']:.1f} s on {n} slots:"]
    lines += [f"  {name:34s} {v / n:7.1f} s  {v / n / whole:6.1%}" for name, v in parts.items()]
    for name, key in (("calibration", "calibration_seconds"), ("coordination (storage, classify)",
                                                              "coordination_seconds")):
        if split.get(key) is not None:
            lines.append(f"  {name:34s} {split[key]:7.1f} s  {split[key] / whole:6.1%}")
    flops, work = split["counted_flops"], split["slot_seconds"]["counted_work"]
    lines.append(f"counted FLOPs {flops:.3g}" + (f"; at the matmul peak ({peak_flop_s / 1e9:.0f} GFLOP/s) "
                                                f"{flops / peak_flop_s:.1f} s: {flops / peak_flop_s / whole:.1%} "
                                                "of the physical limit" if peak_flop_s else ""))
    if peak_flop_s and work:         # the steps themselves: their FLOP rate per slot against a slot's peak
        rate = flops / work
        lines.append(f"counted work runs at {rate / 1e9:.1f} GFLOP/s per slot: {rate * n / peak_flop_s:.1%} "
                     "of a slot's peak")
    return lines


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


def eta_seconds(*, elapsed: float, done: int, total: int, running: Iterable[float] = ()) -> float:
    """Seconds left if the remaining work goes at the pace so far: a finished pilot is one unit of
    work, a running one the share of its FLOPs it has spent (``running``, each in [0, 1]). Pilots run
    in parallel and in groups that finish together, so the pace is elapsed / units done, not one
    pilot's time; 0 when all are done or nothing is done yet."""
    units = done + sum(min(1.0, max(0.0, f)) for f in running)
    if units <= 0 or done >= total:
        return 0.0
    return elapsed / units * max(0.0, total - units)


class Progress:
    """One status line on stderr: grid point, seed, step and FLOPs of running pilots."""

    def __init__(self, total: int, budget: float, enabled: bool = True):
        self.total, self.budget, self.enabled = total, budget, enabled
        self.done, self.live = 0, {}
        self._start: dict = {}        # a running pilot's FLOPs at its first progress report
        self._share: dict = {}        # … and the share of its remaining work done since (the ETA's pace)
        self.tty = sys.stderr.isatty()
        self.t0 = time.monotonic()

    def update(self, job: Job, step: int, spent: float) -> None:
        self.live[job.key] = (step, spent)
        start = self._start.setdefault(job.key, spent)            # a continued stage starts part-way
        target = job.stop_at if job.stop_at is not None else self.budget
        self._share[job.key] = (spent - start) / (target - start) if target > start else 0.0
        self._draw()

    def finish(self, job: Job, result: PilotResult) -> None:
        self._forget(job)
        if not self.enabled:
            return
        score = f"reward {result.score('reward'):.3f}" if result.status == "complete" else result.extra.get("error")
        self._clear()
        elapsed = time.monotonic() - self.t0
        left = eta_seconds(elapsed=elapsed, done=self.done, total=self.total, running=self._share.values())
        print(f"[{self.done}/{self.total}] ρ={job.schedule.rho_target:g} seed {job.seed}: {result.status}, "
              f"ρ measured {result.rho:.3f}, {result.flops.total:.3g} FLOPs, {score} "
              f"(pilot {sum(result.wall_seconds.values()):.0f} s, {elapsed:.0f} s elapsed"
              + (f", ~{left:.0f} s left)" if left else ")"), file=sys.stderr, flush=True)

    def paused(self, job: Job, paused: Any, rung: int | None) -> None:
        """A stage of budget halving stopped at its rung's mark: one line with its reading."""
        self._forget(job)
        if not self.enabled:
            return
        self._clear()
        reading = paused.score("reward") if "reward" in paused.evals else float("nan")
        print(f"[{self.done}/{self.total}] ρ={job.schedule.rho_target:g} seed {job.seed}: paused at rung {rung} "
              f"({paused.flops.total:.3g} of {self.budget:.3g} FLOPs, {paused.steps} steps), reading reward "
              f"{reading:.3f} ({time.monotonic() - self.t0:.0f} s elapsed)", file=sys.stderr, flush=True)

    def _forget(self, job: Job) -> None:
        """``job`` ended (finished, failed or paused): one more done, and no longer running."""
        self.done += 1
        for table in (self.live, self._start, self._share):
            table.pop(job.key, None)

    def _clear(self) -> None:
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr)

    def _draw(self) -> None:
        if not (self.enabled and self.tty):
            return
        parts = [f"ρ={r:g}/s{s} step {st} {sp / self.budget:4.0%}" for (r, s), (st, sp) in sorted(self.live.items())]
        print(f"\r\033[K[{self.done}/{self.total} done] " + " | ".join(parts), end="", file=sys.stderr, flush=True)
