"""Pilot grids on optuna storage: the coordinator behind ``race pilot`` and ``race worker``.

The coordinator (``run_study``) opens or creates the study (race.run.store), calibrates and plans
only when it creates it, enqueues every pilot that is missing (or, with ``adaptive``, the next
rung of the adaptive policy: ``informative`` or ``halving``), runs pilots itself (``workers``
processes at a time, 0 = none), waits for pilots other workers hold, and classifies what is
complete. A worker (``run_worker``) joins an existing study and runs the pilots it can take
until none is left.
Both retry a pilot that failed (an exception, an out-of-memory kill) up to ``retries`` times
and re-enqueue the pilots of dead processes (race.run.store.Store.sweep).

No optuna here: every storage call goes through race.run.store, imported when a grid runs.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from race.config.configfile import GridConfig, config_from_dict
from race.run.options import RunOptions
# the pre-run checks moved to race.run.prechecks; their names stay importable from here for one release
from race.run.prechecks import check_eval_tasks, check_importable, check_share, check_task_size  # noqa: F401
from race.core.records import PilotResult, Schedule
from race.stats.results import Results, pilots_meta, results_lock, save_results, stored_probes

Key = tuple[float, int]
DEFAULT_SHARE = 0.5       # pilots of an adaptive grid, as a share of the full grid's


# ---------------------------------------------------------------- adaptive grid

def successive_halving(grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
                       given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
    """The pilots an adaptive grid needs so far, and whether that list is final.

    Successive halving over ρ with seeds as the resource (η = 2): rung 0 runs seed 0 at every
    grid point; rung k gives seed k to the best ⌈P / 2^k⌉ points of rung k − 1 (mean primary
    score over their seeds so far), until the grid has spent ``share`` of the full grid's pilots
    (``adaptive_cap``; at least one point gets a second seed, which the regime rule needs). Every
    pilot has the full per-pilot budget, so the fit stays IsoFLOP; the dropped points keep their
    one seed.
    """
    grid, P = sorted(grid), len(grid)
    cap = adaptive_cap(P, seeds, share)
    keys: list[Key] = [(r, 0) for r in grid]
    alive, total = list(grid), P
    for k in range(1, seeds):
        prev = [(r, k - 1) for r in alive]
        if any(key not in scores and key not in given_up for key in prev):
            return keys, False
        n = min(math.ceil(P / 2 ** k), cap - total)
        if n <= 0:
            break
        ranked = sorted((r for r in alive if all((r, s) in scores for s in range(k))),
                        key=lambda r: (-sum(scores[(r, s)] for s in range(k)) / k, r))
        alive = ranked[:n]
        if not alive:
            break
        keys += [(r, k) for r in alive]
        total += len(alive)
    return keys, True


ADAPTIVE_POLICIES = ("informative", "halving")           # the first is what --adaptive runs
ADAPTIVE_ATTRS = {"informative": {"policy": "informative", "rungs": 2},
                  "halving": {"policy": "successive-halving", "eta": 2}}
ADAPTIVE_DESCRIPTIONS = {"informative": "seed 0 everywhere, then the seeds that sharpen the leading verdict most",
                         "halving": "successive halving over ρ"}


def resolve_adaptive(adaptive: bool | str | None) -> str | None:
    """None (full grid) or a policy name; True means the default policy."""
    if adaptive is None or adaptive is False:
        return None
    if adaptive is True:
        return ADAPTIVE_POLICIES[0]
    if adaptive not in ADAPTIVE_POLICIES:
        from race.core.errors import ConfigError

        raise ConfigError(f"adaptive policy {adaptive!r} is not known: expected one of {', '.join(ADAPTIVE_POLICIES)}")
    return adaptive


def adaptive_cap(P: int, seeds: int, share: float = DEFAULT_SHARE) -> int:
    """Pilots an adaptive grid runs: ``share`` of the full grid's (rounded down), at least one
    second seed, at most the full grid."""
    return min(P * seeds, max(P + 1, math.floor(share * P * seeds + 1e-9)))


def informative_seeds(grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
                      given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Key], bool]:
    """The pilots an adaptive grid needs so far, and whether that list is final.

    Rung 0 runs seed 0 at every grid point. Rung 1 (the last) spends the rest of the adaptive
    budget (``adaptive_cap``: ``share`` of the full grid's pilots) at once, one seed at a time, where an
    extra seed most sharpens the statistic the leading verdict of rung 0 rests on
    (``allocate_seeds``): the curvature and the argmax of the quadratic in log ρ when rung 0 is
    concave with its vertex inside the grid, else the log-linear slope. Every pilot has the
    full per-pilot budget, so the fit stays IsoFLOP.
    """
    grid = sorted(grid)
    keys: list[Key] = [(r, 0) for r in grid]
    if any(key not in scores and key not in given_up for key in keys):
        return keys, False
    rung0 = {r: scores[(r, 0)] for r in grid if (r, 0) in scores}
    n = allocate_seeds(grid, rung0, extra=adaptive_cap(len(grid), seeds, share) - len(grid), max_seeds=seeds)
    keys += [(r, k) for r in grid for k in range(1, n[r])]
    return keys, True


def allocate_seeds(grid: Sequence[float], rung0: Mapping[float, float], *, extra: int,
                   max_seeds: int) -> dict[float, int]:
    """Seeds per grid point after giving ``extra`` seeds, one at a time, to the points whose
    next seed most reduces ``J`` (points without a rung-0 score get none).

    The regime rule fits unweighted least squares to the point means, so a coefficient is
    Σ wᵢ·ȳᵢ with fixed weights w (a row of the design's pseudo-inverse) and its variance is
    σ²·Σ wᵢ²/nᵢ (seed and evaluation noise both shrink as 1/nᵢ). J is the largest
    variance / margin² over the conditions the leading verdict needs — a squared inverse
    z-score of its weakest condition:

    - concave with the vertex v = −b/2c strictly inside the grid (a *balanced* candidate): the
      curvature c (margin |c|) and v (delta method; margin: its distance to the nearer end);
    - otherwise (a trend, or noise): the log-linear slope (margin 1: its variance alone).

    Ties go to the better-scoring point, then the lower ρ. Deterministic; no randomness.
    """
    import numpy as np

    grid = sorted(grid)
    n = {r: (1 if r in rung0 else 0) for r in grid}
    pts = [r for r in grid if r in rung0]
    if len(pts) < 2 or extra <= 0:
        return n
    x = np.log(np.asarray(pts, dtype=float))
    y = np.asarray([rung0[r] for r in pts], dtype=float)
    conditions: list[tuple[np.ndarray, float]] = []
    if len(pts) >= 3:
        wq = np.linalg.pinv(np.vander(x, 3, increasing=True))      # rows: weights of a, b, c
        _, b, c = wq @ y
        if c < 0:
            v = -b / (2 * c)
            margin = min(v - x.min(), x.max() - v)
            if margin > 0:
                conditions = [(wq[2], abs(c)), (-wq[1] / (2 * c) + b / (2 * c * c) * wq[2], margin)]
    if not conditions:
        conditions = [(np.linalg.pinv(np.vander(x, 2, increasing=True))[1], 1.0)]

    def J(counts: np.ndarray) -> float:
        return max(float(np.sum(w * w / counts)) / (m * m) for w, m in conditions)

    counts = np.ones(len(pts))
    for _ in range(extra):
        free = [i for i in range(len(pts)) if counts[i] < max_seeds]
        if not free:
            break

        def after(i: int) -> float:
            trial = counts.copy()
            trial[i] += 1
            return J(trial)

        i = min(free, key=lambda i: (round(after(i), 12), -y[i], x[i]))
        counts[i] += 1
    n.update({r: int(k) for r, k in zip(pts, counts)})
    return n


def adaptive_needed(policy: str, grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
                    given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE,
                    first_seed: int = 0) -> tuple[list[Key], bool]:
    """The pilots adaptive ``policy`` needs so far (``share`` of the full grid's), and whether
    that list is final. The rules number seeds 0 … seeds − 1 (rung k runs seed k); a grid whose
    seeds start at ``first_seed`` runs rung k's pilots with seed ``first_seed + k``."""
    rule = {"informative": informative_seeds, "halving": successive_halving}[resolve_adaptive(policy)]
    if not first_seed:
        return rule(grid, seeds, scores, given_up, share=check_share(share))
    scores = {(r, s - first_seed): v for (r, s), v in scores.items()}
    given_up = {(r, s - first_seed) for r, s in given_up}
    keys, final = rule(grid, seeds, scores, given_up, share=check_share(share))
    return [(r, s + first_seed) for r, s in keys], final


def adaptive_subset(policy: str, grid: Sequence[float], seeds: int, score: Callable[[Key], float],
                    share: float = DEFAULT_SHARE, first_seed: int = 0) -> list[Key]:
    """The pilots ``policy`` runs when pilot ``key`` scores ``score(key)``: its rule fed rung by
    rung with the scores of what it already ran (for replays on a stored full grid)."""
    scores: dict[Key, float] = {}
    while True:
        keys, final = adaptive_needed(policy, grid, seeds, scores, share=share, first_seed=first_seed)
        new = [k for k in keys if k not in scores]
        for k in new:
            scores[k] = score(k)
        if final and not new:
            return keys


# ---------------------------------------------------------------- shared loop

class _Loop:
    """Run the pilots of one study through race.run.processes.run_jobs, talking to the store."""

    def __init__(self, store: Any, *, device: str, workers: int, retries: int, quiet: bool, first_number: int,
                 group_size: int = 1):
        from race.run.processes import Job, Progress

        self.store, self.info = store, store.info
        self.device, self.workers, self.retries, self.quiet = device, workers, retries, quiet
        self.first_number = first_number
        self.run_config = config_from_dict(self.info.run_config)
        self.schedules = {float(s["rho_target"]): Schedule.from_dict(s) for s in self.info.plan["schedules"]}
        self.primary = self.info.classify.get("primary_target", "reward")
        self.held: dict[Key, Any] = {}
        self.ran: list[PilotResult] = []
        self.Job = Job
        self.progress = Progress(0, self.run_config.budget, enabled=not quiet)
        self.on_change = lambda: None
        self.group_size = max(1, group_size)

    def next_job(self):
        """The next pilot, or with lockstep the next group: one claimed trial and up to
        ``group_size − 1`` more waiting trials of its grid point (race.engine.lean_engine)."""
        claim = self.store.claim()
        if claim is None:
            return None
        claims = [claim]
        while len(claims) < self.group_size:
            more = self.store.claim(rho=claim.key[0])
            if more is None:
                break
            claims.append(more)
        for c in claims:
            self.held[c.key] = c
        jobs = [self.Job(self.schedules[c.key[0]], c.key[1]) for c in claims]
        return jobs if self.group_size > 1 else jobs[0]

    def on_start(self, job, pid: int) -> None:
        self.store.set_pid(self.held[job.key], pid)

    def on_progress(self, job, step: int, spent: float) -> None:
        self.progress.update(job, step, spent)
        if job.key in self.held:
            self.store.progress(self.held[job.key], step, spent)

    def on_result(self, job, result: PilotResult) -> None:
        claim = self.held.pop(job.key)
        self.ran.append(result)
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
        self.on_change()

    def run(self, keep_going) -> None:
        """Pilots until ``keep_going()`` (throttled; it also sweeps for dead workers' pilots) says stop."""
        from race.run.processes import busy_machine_warning, run_jobs

        warn = busy_machine_warning(self.workers, self.device) if not self.quiet and self.workers else None
        if warn:
            print(f"warning: {warn}", file=sys.stderr, flush=True)
        halt = self.store.heartbeats(lambda: list(self.held.values()))
        try:
            run_jobs(self.run_config, [], workers=self.workers, device=self.device, on_result=self.on_result,
                     on_progress=self.on_progress, next_job=self.next_job, on_start=self.on_start,
                     on_tick=keep_going, keep_going=keep_going, poll=min(1.0, self.store.heartbeat / 2),
                     group_size=self.group_size)
        finally:
            halt()


def _complete_scores(store: Any) -> dict[Key, float]:
    from race.run.store import key_of

    out: dict[Key, float] = {}
    for t in store.trials():
        if t.state.name == "COMPLETE" and t.value is not None:
            k = key_of(t)
            if k is not None:
                out.setdefault(k, float(t.value))
    return out


def _busy_keys(store: Any) -> set[Key]:
    from race.run.store import key_of

    return {key_of(t) for t in store.trials() if t.state.name in ("WAITING", "RUNNING")}


# ---------------------------------------------------------------- coordinator

def run_study(config: GridConfig, options: RunOptions | None = None, *, calibration: Any = None,
              classify_kw: dict | None = None, announce: Callable[[], None] | None = None, **kw: Any) -> Results:
    """Run (or resume) the pilot grid of ``config`` as an optuna study; see the module docstring.

    ``options``: how it runs (race.run.options.RunOptions: out_dir, storage, study, workers, device,
    quiet, adaptive, adaptive_share, retries, heartbeat, import_pilots, engine), checked once and
    passed down whole; or those as keyword arguments (``**kw``), as before.

    ``import_pilots``: a results file (or its folder) whose complete pilots, run elsewhere with the
    same run config (a lost storage, another machine), are recorded in the study before any pilot
    runs, so only the missing ones run (a different config is one line, exit 2). ``announce``: called
    once every check before compute has passed and the storage is open (the CLI's banner).

    ``adaptive``: False (the full grid), True (the default policy, ``informative``) or a policy
    name from ``ADAPTIVE_POLICIES``. ``adaptive_share``: the share of the full grid's pilots it
    runs (None: the study's own on a resume, else 0.5); stored with the study.
    ``engine``: ``auto`` (lockstep groups of a grid point's seeds on CPU where the lean path runs:
    race.engine.lean_engine), ``lockstep`` or ``solo`` (one pilot per process)."""
    from race.run import store as S
    from race.engine.backends import resolve_backend

    o = (options if options is not None else RunOptions.from_kwargs(**kw)).check()
    out_dir, storage, study, heartbeat = o.out_dir, o.storage, o.study, o.heartbeat
    # before anything is written: a run that cannot start leaves no storage behind (race.run.prechecks.CHECKS)
    from race.run.prechecks import run_checks

    policy = resolve_adaptive(o.adaptive if o.adaptive_share is None else (o.adaptive or True))
    run_checks(config, o)
    backend = resolve_backend(config.backend)
    url = storage or S.default_url(out_dir)
    fresh = [p for p in (out_dir, os.path.join(out_dir, "race.db")) if not os.path.exists(p)] if storage is None else []
    st = S.Store(url, study or config.name, heartbeat=heartbeat or S.DEFAULT_HEARTBEAT)
    if announce is not None:             # every check before compute has passed, the storage is open
        announce()
    try:
        return _start(st, config, o, policy=policy, backend=backend, calibration=calibration,
                      classify_kw=classify_kw)
    except BaseException:
        if fresh and not st.exists():          # a refusal or a failed calibration leaves nothing behind
            st.close()
            for path in reversed(fresh):
                for p in (path, path + "-journal", path + "-wal", path + "-shm"):
                    if os.path.isfile(p):
                        os.remove(p)
                if os.path.isdir(path) and not os.listdir(path):
                    os.rmdir(path)
        raise


# the name the CLI, race.diagnose and the benchmarks call: calibrate, plan and run every pilot of a
# config as an optuna study, rewrite DIR/results.json after every finished pilot, return the results
run_grid = run_study


def signal_line(pass_rate: float | None, group: int) -> str | None:
    """One line, before any pilot, when the base pass rate leaves most groups without a reward that
    varies (race.stats.design.signal: the grid would learn nothing); None when it does not, or cannot tell."""
    from race.stats.design import signal

    if pass_rate is None or group < 2:
        return None
    return signal(pass_rate, group).line


def _start(st: Any, config: GridConfig, o: RunOptions, *, policy: str | None, backend: str, calibration: Any,
           classify_kw: dict | None) -> Results:
    """Create or resume the study in ``st``, then coordinate it (``o``: the run's options)."""
    device, quiet, heartbeat, import_pilots = o.device, o.quiet, o.heartbeat, o.import_pilots
    user_cfg = config.to_dict()
    resumed = st.exists()
    if resumed:
        from race.run.store import UnreadyStudy

        try:
            st.load()
        except UnreadyStudy:
            if not st.remove_unready():    # never made ready and holds no trial: an interrupted start
                raise
            resumed = False
            if not quiet:
                print(f"race: removed study {st.name!r} in {st.masked}: an earlier start left it unfinished "
                      "(no pilots)", file=sys.stderr, flush=True)
    if resumed:
        st.check_compatible(user_cfg)
        if heartbeat:
            st.update_heartbeat(heartbeat)
    else:
        from race.flops.grid import plan_grid
        from race.engine.calibration import calibrate

        cal = calibration or calibrate(config, device=device)
        run_cfg = replace(config, grpo=replace(config.grpo, **cal.healthy)) if cal.healthy is not None else config
        plan = plan_grid(run_cfg, prompt_len=cal.prompt_len, completion_len=cal.completion_len)
        classify = {"primary_target": "reward", "n_boot": 1000, "seed": 0, **(classify_kw or {})}
        reward = config.reward.kind + (f" ({config.reward.function})" if config.reward.kind == "custom" else "")
        meta = {"model": config.model, "reward": reward, "backend": backend, "task": config.task,
                "budget_per_pilot": config.budget, "seeds": config.seeds}
        if config.reward.kind == "custom":     # what a worker must have, byte for byte, before it runs it
            from race.tasks.rewards.base import reward_source, source_digest

            src = reward_source(config.reward.function)
            if src:
                meta["reward_source"] = {"function": config.reward.function, "file": src, "sha256": source_digest(src)}
        if plan.warnings:
            meta["flop_warnings"] = list(plan.warnings)
        for key, line in (("data_warning", cal.data_warning()), ("reward_warning", cal.reward_warning()),
                          ("signal_warning", signal_line(getattr(cal, "pass_rate", None), run_cfg.schedule.n_train))):
            if line:
                meta[key] = line
        if not quiet:
            from race.core.safeio import one_line

            for w in [*plan.warnings, *(meta[k] for k in ("data_warning", "reward_warning", "signal_warning")
                                        if k in meta)]:
                print(f"warning: {one_line(w)}", file=sys.stderr, flush=True)
        plan_dict = {**plan.to_dict(), "calibration": cal.to_dict()}
        if import_pilots:            # the imported schedules against this plan, before the study exists
            from race.run.prechecks import check_import

            check_import(import_pilots, run_cfg.to_dict(), plan_dict,
                         [(float(r), s) for r in run_cfg.grid for s in run_cfg.seed_ids])
        if st.create(config=user_cfg, run_config=run_cfg.to_dict(), plan=plan_dict,
                     classify=classify, meta=meta, adaptive=None):
            pass
        else:                       # another process created it a moment ago
            st.load()
            st.check_compatible(user_cfg)
    st.claim_coordination()         # one coordinator per study: a second one gets one line, exit 2
    if import_pilots:
        try:
            n = import_finished(st, import_pilots)
        except BaseException:
            st.release_coordination()
            raise
        if not quiet:
            print(f"imported {n} finished pilot(s) from {import_pilots}", file=sys.stderr, flush=True)
    try:
        return _coordinate(st, config, o, policy=policy, resumed=resumed)
    finally:
        st.release_coordination()


def _coordinate(st: Any, config: GridConfig, o: RunOptions, *, policy: str | None, resumed: bool) -> Results:
    """The coordinator's loop over a study it holds: enqueue, run, sweep, save, classify."""
    out_dir, device, workers, quiet, retries = o.out_dir, o.device, o.workers, o.quiet, o.retries
    adaptive, adaptive_share, engine = o.adaptive, o.adaptive_share, o.engine
    from race.run.processes import default_workers

    info = st.info
    if adaptive in (True, False) and policy and info.adaptive:   # a plain --adaptive keeps the study's policy
        policy = next((k for k, v in ADAPTIVE_ATTRS.items() if v["policy"] == info.adaptive.get("policy")), policy)
    share = adaptive_share if adaptive_share is not None else \
        float((info.adaptive or {}).get("share", DEFAULT_SHARE)) if policy else DEFAULT_SHARE
    adaptive_attrs = {**ADAPTIVE_ATTRS[policy], "share": share} if policy else None
    st.set_adaptive(adaptive_attrs)
    st.set_finished(False)
    first_number = len(st.trials())
    if workers is None:
        workers = default_workers(device)
    from race.engine.lean_engine import group_size_for

    group_size = group_size_for(config_from_dict(info.run_config), engine, device, workers=workers)
    loop = _Loop(st, device=device, workers=workers, retries=retries, quiet=quiet, first_number=first_number,
                 group_size=group_size)
    given_up: set[Key] = set()
    state = {"done": False, "last": 0.0}
    all_keys = info.keys()

    def needed(scores: Mapping[Key, float]) -> tuple[list[Key], bool]:
        if policy:
            return adaptive_needed(policy, info.grid, info.seeds, scores, given_up, share=share,
                                   first_seed=info.first_seed)
        return all_keys, True

    def advance(force: bool = False) -> bool:
        now = time.monotonic()
        if not force and now - state["last"] < min(1.0, st.heartbeat / 2):
            return state["done"]
        state["last"] = now
        st.beat_coordination()
        st.sweep()
        scores = _complete_scores(st)
        busy = _busy_keys(st)
        need, final = needed(scores)
        for key in need:
            if key in scores or key in busy or key in given_up:
                continue
            if st.failures_since(key, first_number) > retries:
                given_up.add(key)
                continue
            st.enqueue(key)
            busy.add(key)
        loop.progress.total = loop.progress.done + sum(1 for k in need if k not in scores and k not in given_up)
        state["done"] = final and not busy and all(k in scores or k in given_up for k in need)
        return state["done"]

    def save(diagnosis=None, failed: Sequence[str] = ()) -> Results:
        pilots = st.pilots()
        have = {(p.rho_target, p.seed) for p in pilots}
        failures = st.failed_pilots(k for k in given_up if k not in have)
        with results_lock(out_dir):        # one writer; a length probe stored in the file (race probe) is kept
            probes = stored_probes(out_dir)
            res = Results(pilots=tuple(sorted(pilots + failures, key=lambda p: (p.rho_target, p.seed))),
                          diagnosis=diagnosis, config=info.run_config, plan=info.plan, classify=info.classify,
                          meta={"backend": info.meta.get("backend"), "device": device, "storage": st.masked,
                                "study": st.name, **({"adaptive": ADAPTIVE_ATTRS[policy]["policy"]} if policy else {}),
                                **({"flop_warnings": info.meta["flop_warnings"]} if info.meta.get("flop_warnings")
                                   else {}),
                                **({"failed": list(failed)} if failed else {}),
                                **({"probes": probes} if probes else {})})
            save_results(out_dir, res)
        return res

    loop.on_change = lambda: save()
    scores0 = _complete_scores(st)
    advance(force=True)
    if not quiet:
        print(f"RACE study {st.name!r} in {st.masked}: " + (
            f"resuming, {len(scores0)} pilots complete, {loop.progress.total} to run"
            if resumed else f"created, {loop.progress.total} pilots to run")
            + (f" (adaptive: {ADAPTIVE_DESCRIPTIONS[policy]})" if policy else ""), file=sys.stderr, flush=True)
    save()
    loop.run(lambda: not advance())
    advance(force=True)
    pilots = st.pilots()
    failed = [f"ρ={p.rho_target:g} seed {p.seed}: {p.extra.get('error')}" for p in st.failed_pilots(given_up)]
    from race.stats.regime import classify as classify_fn

    diagnosis = None
    kw = dict(info.classify)
    # the report names the backend that actually produced the pilots (each records its own)
    meta = pilots_meta(info.meta, pilots, adaptive=adaptive_attrs, full_grid=len(info.grid) * info.seeds)
    try:
        diagnosis = classify_fn(pilots, meta=meta, **kw)
    except ValueError:
        if not failed:
            raise
    if diagnosis is not None:
        st.save_diagnosis(diagnosis, pilots)
    st.set_finished(True)
    return save(diagnosis, failed)


# ---------------------------------------------------------------- worker

def import_finished(st: Any, path: str) -> int:
    """Record the complete pilots of results file ``path`` in study ``st`` (those of its grid, not
    complete there yet); their run config must be the study's up to the grid's shape, and each one's
    schedule the one this study planned for its ρ. Returns how many were added."""
    from race.run.prechecks import check_import

    # all checked before any is added: a refusal imports nothing
    pilots = check_import(path, st.info.run_config, st.info.plan, st.info.keys())
    primary = st.info.classify.get("primary_target", "reward")
    return sum(st.add_finished(p, primary, source=os.path.abspath(path)) for p in pilots)


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
    st = S.Store(storage, study)
    info = st.load()
    check_reward_consent(info, trust_reward=trust_reward, quiet=quiet)
    first_number = len(st.trials())
    from race.engine.lean_engine import group_size_for

    workers = workers if workers is not None else default_workers(device)
    loop = _Loop(st, device=device, workers=workers, retries=retries, quiet=quiet, first_number=first_number,
                 group_size=group_size_for(config_from_dict(info.run_config), engine, device, workers=workers))
    keys = set(info.keys())
    state = {"idle_since": None, "last": 0.0, "go": True}

    def on_change() -> None:   # our own failed pilot: enqueue it again while retries last
        for p in loop.ran[-1:]:
            key = (p.rho_target, p.seed)
            if p.status != "complete" and st.failures_since(key, first_number) <= retries:
                if key not in _busy_keys(st) and key not in _complete_scores(st):
                    st.enqueue(key, retry_of_failure=True)

    loop.on_change = on_change
    loop.progress.total = len(keys)

    def keep_going() -> bool:
        now = time.monotonic()
        if now - state["last"] < min(1.0, st.heartbeat / 2):
            return state["go"]
        state["last"] = now
        st.sweep()
        if _busy_keys(st):
            state["idle_since"], state["go"] = None, True
        elif st.finished() or (not st.study.user_attrs.get("race:adaptive") and keys <= set(_complete_scores(st))):
            state["go"] = False
        else:
            state["idle_since"] = state["idle_since"] or now
            state["go"] = now - state["idle_since"] < wait
        return state["go"]

    if not quiet:
        print(f"RACE worker {os.getpid()} on study {st.name!r} in {st.masked}", file=sys.stderr, flush=True)
    loop.run(keep_going)
    done = [p for p in loop.ran if p.status == "complete"]
    return {"ran": len(loop.ran), "complete": len(done), "failed": len(loop.ran) - len(done),
            "study": st.name, "storage": st.masked}
