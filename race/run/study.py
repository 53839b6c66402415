"""A pilot grid as an optuna study: the coordinator behind ``race pilot`` and ``race.diagnose``.

The coordinator (``run_study``) runs the checks before anything is written (race.run.prechecks),
opens or creates the study (race.run.store), calibrates and plans only when it creates it
(``create_study``), enqueues every pilot that is missing (or, with an adaptive policy, the next rung:
race.run.adaptive; with budget halving the next rung's stages, each a pilot paused at a FLOP mark or
continued from its saved state under ``OUT/states``: race.run.adaptive.budget, race.run.rungs), runs pilots itself (``workers`` processes at a time, 0 = none; race.run.workers),
waits for pilots other workers hold, and classifies what is complete (``Coordinator``). It retries a
pilot that failed (an exception, an out-of-memory kill) up to ``retries`` times and re-enqueues the
pilots of dead processes (race.run.store.Store.sweep).

Invariants: options arrive checked (race.run.options.RunOptions.check) and are passed down whole; a
run that cannot start leaves no storage behind; one coordinator per study; results.json is rewritten
under its lock after every finished pilot. No optuna here: every storage call goes through
race.run.store, imported when a grid runs.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from race.config.configfile import GridConfig, config_from_dict
from race.core.records import CALIBRATION_WARNINGS
from race.run.adaptive import DEFAULT_SHARE, Key, adaptive_needed, is_budget, policy_named, policy_stored
from race.run.options import RunOptions
from race.run.workers import PilotQueue, busy_keys, busy_stages, complete_scores, stage_scores
from race.stats.results import Results, pilots_meta, results_lock, save_results, stored_probes


def run_study(config: GridConfig, options: RunOptions | None = None, *, calibration: Any = None,
              classify_kw: dict | None = None, banner: str | None = None, **kw: Any) -> Results:
    """Run (or resume) the pilot grid of ``config`` as an optuna study; see the module docstring.

    ``options``: how it runs (race.run.options.RunOptions: out_dir, storage, study, workers, device,
    quiet, adaptive, adaptive_share, retries, heartbeat, import_pilots, engine), checked once and
    passed down whole; or those as keyword arguments (``**kw``), as before.

    ``import_pilots``: a results file (or its folder) whose complete pilots, run elsewhere with the
    same run config (a lost storage, another machine), are recorded in the study before any pilot
    runs, so only the missing ones run (a different config is one line, exit 2). ``banner``: a line
    printed to stderr (unless quiet) once every check before compute has passed and the storage is open.

    ``adaptive``: False (the full grid), True (the default policy, ``informative``) or a policy
    name from race.run.adaptive.POLICIES. ``adaptive_share``: the share of the full grid's pilots it
    runs (None: the study's own on a resume, else 0.5); stored with the study.
    ``engine``: ``auto`` (lockstep groups of a grid point's seeds on CPU where the lean path runs:
    race.engine.lean_engine), ``lockstep`` or ``solo`` (one pilot per process)."""
    from race.run import store as S
    from race.engine.backends import resolve_backend

    o = (options if options is not None else RunOptions.from_kwargs(**kw)).check()
    out_dir, storage, study, heartbeat = o.out_dir, o.storage, o.study, o.heartbeat
    # before anything is written: a run that cannot start leaves no storage behind (race.run.prechecks.CHECKS)
    from race.run.prechecks import run_checks

    policy = o.policy
    run_checks(config, o)
    backend = resolve_backend(config.backend)
    url = storage or S.default_url(out_dir)
    fresh = [*_missing_folders(out_dir), os.path.join(out_dir, "race.db")] if storage is None else []
    fresh = [p for p in fresh if not os.path.exists(p)]
    st = S.Store(url, study or config.name, heartbeat=heartbeat or S.DEFAULT_HEARTBEAT)
    if banner is not None and not o.quiet:     # every check before compute has passed, the storage is open
        from race.core.safeio import terminal_safe

        print(terminal_safe(banner), file=sys.stderr, flush=True)
    try:
        return start_study(st, config, o, policy=policy, backend=backend, calibration=calibration,
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


def _missing_folders(path: str) -> list[str]:
    """The folders of ``path`` that do not exist yet, outermost first (the storage makes them all): what a
    refusal removes again, when they are still empty."""
    missing, p = [], os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        missing.append(p)
        p = os.path.dirname(p)
    return missing[::-1]


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


def start_study(st: Any, config: GridConfig, o: RunOptions, *, policy: str | None, backend: str, calibration: Any,
                classify_kw: dict | None) -> Results:
    """Create or resume the study in ``st``, then coordinate it (``o``: the run's options)."""
    t0 = time.monotonic()
    resumed = resume_study(st, config, o)
    if not resumed:
        create_study(st, config, o, backend=backend, calibration=calibration, classify_kw=classify_kw)
    setup = time.monotonic() - t0           # calibration and planning (none on a resume)
    st.claim_coordination()         # one coordinator per study: a second one gets one line, exit 2
    if o.import_pilots:
        try:
            n = import_finished(st, o.import_pilots)
        except BaseException:
            st.release_coordination()
            raise
        if not o.quiet:
            print(f"imported {n} finished pilot(s) from {o.import_pilots}", file=sys.stderr, flush=True)
    try:
        return Coordinator(st, config, o, policy=policy, resumed=resumed, started=t0, setup=setup).run()
    finally:
        st.release_coordination()


def resume_study(st: Any, config: GridConfig, o: RunOptions) -> bool:
    """Load the study in ``st`` if it exists and is ready (checked against ``config``); False when there
    is none to resume (an interrupted start that made no pilot is removed first)."""
    if not st.exists():
        return False
    from race.run.store import UnreadyStudy

    try:
        st.load()
    except UnreadyStudy:
        if not st.remove_unready():    # never made ready and holds no trial: an interrupted start
            raise
        if not o.quiet:
            print(f"race: removed study {st.name!r} in {st.masked}: an earlier start left it unfinished "
                  "(no pilots)", file=sys.stderr, flush=True)
        return False
    st.check_compatible(config.to_dict())
    if o.heartbeat:
        st.update_heartbeat(o.heartbeat)
    return True


def create_study(st: Any, config: GridConfig, o: RunOptions, *, backend: str, calibration: Any,
                 classify_kw: dict | None) -> None:
    """Calibrate, plan and create the study in ``st`` (or load the one another process created a
    moment ago); the imported pilots' schedules are checked against the plan before it exists."""
    from race.engine.calibration import calibrate
    from race.flops.grid import plan_grid

    user_cfg = config.to_dict()
    cal = calibration or calibrate(config, device=o.device)
    run_cfg = replace(config, grpo=replace(config.grpo, **cal.healthy)) if cal.healthy is not None else config
    plan = plan_grid(run_cfg, prompt_len=cal.prompt_len, completion_len=cal.completion_len)
    classify = {"primary_target": "reward", "n_boot": 1000, "seed": 0, **(classify_kw or {})}
    meta = study_meta(config, run_cfg, plan, cal, backend=backend, design=o.design)
    if not o.quiet:
        from race.core.safeio import one_line

        for w in [*plan.warnings, *(meta[k] for k in CALIBRATION_WARNINGS if k in meta)]:
            print(f"warning: {one_line(w)}", file=sys.stderr, flush=True)
    plan_dict = {**plan.to_dict(), "calibration": cal.to_dict()}
    if o.import_pilots:            # the imported schedules against this plan, before the study exists
        from race.run.prechecks import check_import

        check_import(o.import_pilots, run_cfg.to_dict(), plan_dict,
                     [(float(r), s) for r in run_cfg.grid for s in run_cfg.seed_ids])
    if not st.create(config=user_cfg, run_config=run_cfg.to_dict(), plan=plan_dict,
                     classify=classify, meta=meta, adaptive=None):
        st.load()                   # another process created it a moment ago
        st.check_compatible(user_cfg)


def study_meta(config: GridConfig, run_cfg: GridConfig, plan: Any, cal: Any, *, backend: str,
               design: Any = None) -> dict[str, Any]:
    """What a new study records beside its plan: the model, reward (a custom one with its file's
    sha256, what a worker must have byte for byte), backend, task, budget, and the warnings of the plan
    and the calibration (``share_warning``: a sized ``design`` whose evaluation at the calibrated lengths
    takes its pilots over their share of F, race.run.sizing.overrun_line)."""
    from race.run.sizing import overrun_line

    reward = config.reward.kind + (f" ({config.reward.function})" if config.reward.kind == "custom" else "")
    meta = {"model": config.model, "reward": reward, "backend": backend, "task": config.task,
            "budget_per_pilot": config.budget, "seeds": config.seeds}
    if config.reward.kind == "custom":
        from race.tasks.rewards.base import reward_source, source_digest

        src = reward_source(config.reward.function)
        if src:
            meta["reward_source"] = {"function": config.reward.function, "file": src, "sha256": source_digest(src)}
    if plan.warnings:
        meta["flop_warnings"] = list(plan.warnings)
    for key, line in (("data_warning", cal.data_warning()), ("reward_warning", cal.reward_warning()),
                      ("signal_warning", signal_line(getattr(cal, "pass_rate", None), run_cfg.schedule.n_train)),
                      ("share_warning", overrun_line(design, run_cfg, cal.prompt_len, cal.completion_len)
                       if isinstance(design, Mapping) else None)):
        if line:
            meta[key] = line
    return meta


class Coordinator:
    """The coordinator's loop over a study it holds: enqueue, run, sweep, save, classify."""

    def __init__(self, st: Any, config: GridConfig, o: RunOptions, *, policy: str | None, resumed: bool,
                 started: float | None = None, setup: float = 0.0):
        from race.engine.lean_engine import group_size_for
        from race.run.processes import default_workers

        self.st, self.o, self.resumed, self.info = st, o, resumed, st.info
        info = self.info
        if o.adaptive in (True, False) and policy and info.adaptive:   # a plain --adaptive keeps the study's policy
            kept = policy_stored(info.adaptive)
            policy = kept.name if kept is not None else policy
        self.policy = policy
        self.share = o.adaptive_share if o.adaptive_share is not None else \
            float((info.adaptive or {}).get("share", DEFAULT_SHARE)) if policy else DEFAULT_SHARE
        self.budget = bool(policy) and is_budget(policy_named(policy))     # stages (ρ, seed, rung), not pilots
        self.first_number = len(st.trials())
        self.rule = self._rule(info.adaptive) if policy else None         # the policy object (budget halving: its ladder)
        self.adaptive_attrs = self._adaptive_attrs(info.adaptive) if policy else None
        st.set_adaptive(self.adaptive_attrs)
        st.set_finished(False)
        workers = o.workers if o.workers is not None else default_workers(o.device)
        group_size = group_size_for(config_from_dict(info.run_config), o.engine, o.device, workers=workers)
        self.queue = PilotQueue(st, device=o.device, workers=workers, retries=o.retries, quiet=o.quiet,
                                first_number=self.first_number, group_size=group_size,
                                halving=self.adaptive_attrs if self.budget else None)
        self.given_up: set[Key] = set()
        self.done, self.last = False, 0.0
        self.started, self.setup = (time.monotonic() if started is None else started), setup
        self.profile: dict | None = None    # --profile: the wall split, once the pool has run
        self.all_keys = info.keys() if o.design is None else \
            [(float(r), info.first_seed + int(k)) for r, k in o.design["pilots"]]     # a sized design's pilots

    def _rule(self, stored: Mapping[str, Any] | None) -> Any:
        """The policy object: the table's, or for budget halving the ladder asked for (``halving_ladder``); a
        resumed budget-halving study keeps its own ladder, and one asked for that differs is one line."""
        from race.core.errors import RaceError
        from race.run.adaptive import BudgetHalving, Ladder

        if not self.budget:
            return policy_named(self.policy)
        asked = replace(self.o, adaptive=self.policy).rule
        kept = policy_stored(stored)
        if not (self.first_number and kept is not None and is_budget(kept)):
            return asked
        have = BudgetHalving(Ladder.from_stored(stored))
        if self.o.halving_ladder is not None and asked != have:
            raise RaceError(f"study {self.st.name!r} in {self.st.masked} ran budget halving with {have.ladder.line()}; "
                            f"the ladder asked for ({asked.ladder.line()}) differs: run it with the study's ladder, "
                            "or use another --out / --study")
        return have

    def _adaptive_attrs(self, stored: Mapping[str, Any] | None) -> dict[str, Any]:
        """The study's ``race:adaptive``: the policy's, with its share, or for budget halving its state folder
        (the study's own on a resume). A study that holds trials of whole pilots takes no stages of budget
        halving, nor the reverse: one line."""
        from race.core.errors import RaceError

        kept = policy_stored(stored)
        if self.first_number and (kept is not None and is_budget(kept)) != self.budget:
            raise RaceError(f"study {self.st.name!r} in {self.st.masked} holds "
                            + ("budget-halving stages" if not self.budget else "whole pilots")
                            + f"; {'budget halving' if self.budget else 'this grid'} cannot continue it: run the same "
                            "policy again, or use another --out / --study")
        attrs = dict(self.rule.stored)
        if not self.budget:
            return {**attrs, "share": self.share}
        return {**attrs, "states": (stored or {}).get("states") if kept is not None and is_budget(kept) and
                (stored or {}).get("states") else os.path.abspath(os.path.join(self.o.out_dir, "states"))}

    def needed(self, scores: Mapping[Key, float]) -> tuple[list[Key], bool]:
        """The pilots the grid needs so far, and whether that list is final."""
        if self.policy:
            return adaptive_needed(self.policy, self.info.grid, self.info.seeds, scores, self.given_up,
                                   share=self.share, first_seed=self.info.first_seed, rule=self.rule)
        return self.all_keys, True

    def advance(self, force: bool = False) -> bool:
        """Sweep, enqueue what is needed and not held (a pilot past its retries is given up); True when
        the grid is done. Throttled to twice per heartbeat unless ``force``."""
        st = self.st
        now = time.monotonic()
        if not force and now - self.last < min(1.0, st.heartbeat / 2):
            return self.done
        self.last = now
        st.beat_coordination()
        st.sweep()
        scores = stage_scores(st) if self.budget else complete_scores(st)
        busy = busy_stages(st) if self.budget else busy_keys(st)
        need, final = self.needed(scores)
        for key in need:               # a pilot (ρ, seed), or a stage (ρ, seed, rung) of budget halving
            if key in scores or key in busy or key in self.given_up:
                continue
            if st.failures_since(key[:2], self.first_number, *key[2:]) > self.o.retries:
                self.given_up.add(key)
                continue
            st.enqueue(key[:2], **({"rung": key[2]} if self.budget else {}))
            busy.add(key)
        progress = self.queue.progress
        progress.total = progress.done + sum(1 for k in need if k not in scores and k not in self.given_up)
        self.done = final and not busy and all(k in scores or k in self.given_up for k in need)
        return self.done

    def pilots(self, final: bool = False) -> tuple[list, dict[str, Any]]:
        """The complete pilots, and for budget halving its record (race.run.rungs); ``final``: with the
        points it dropped as their last readings (what the fit takes)."""
        pilots = self.st.pilots()
        if not self.budget:
            return pilots, {}
        from race.core.records import Schedule
        from race.run.rungs import dropped_pilots, halving_record

        readings = self.st.readings()
        if final:
            schedules = {float(d["rho_target"]): Schedule.from_dict(d) for d in self.info.plan["schedules"]}
            pilots = pilots + dropped_pilots(readings, {(p.rho_target, p.seed) for p in pilots}, schedules)
        marks = self.rule.marks(float(self.info.run_config["budget"]))
        record = halving_record(self.adaptive_attrs, marks, readings, pilots, points=len(self.info.grid),
                                seeds=self.info.seeds, primary=self.info.classify.get("primary_target", "reward"),
                                final=final)
        return pilots, {"budget_halving": record}

    def save(self, diagnosis: Any = None, failed: Sequence[str] = (), final: bool = False) -> Results:
        """Rewrite results.json from the storage (one writer; a stored length probe is kept)."""
        st, info = self.st, self.info
        pilots, halving = self.pilots(final)
        have = {(p.rho_target, p.seed) for p in pilots}
        failures = st.failed_pilots(k[:2] for k in self.given_up if k[:2] not in have)
        with results_lock(self.o.out_dir):
            probes = stored_probes(self.o.out_dir)
            res = Results(pilots=tuple(sorted(pilots + failures, key=lambda p: (p.rho_target, p.seed))),
                          diagnosis=diagnosis, config=info.run_config, plan=info.plan, classify=info.classify,
                          meta={"backend": info.meta.get("backend"), "device": self.o.device, "storage": st.recorded,
                                "study": st.name,
                                **({"adaptive": policy_named(self.policy).stored["policy"]} if self.policy else {}),
                                **({"design": design_meta(self.o.design)} if self.o.design else {}),
                                **({"profile": self.profile} if self.profile else {}), **halving,
                                **({"flop_warnings": info.meta["flop_warnings"]} if info.meta.get("flop_warnings")
                                   else {}),
                                **({"failed": list(failed)} if failed else {}),
                                **({"probes": probes} if probes else {})})
            save_results(self.o.out_dir, res)
        return res

    def run(self) -> Results:
        """Run the grid to its end, then classify what is complete and save it."""
        from race.run.processes import Finished, Paused, Tick

        st = self.st
        scores0 = complete_scores(st)
        self.advance(force=True)
        if not self.o.quiet:
            print(f"RACE study {st.name!r} in {st.masked}: " + (
                f"resuming, {len(scores0)} pilots complete, {self.queue.progress.total} to run"
                if self.resumed else f"created, {self.queue.progress.total} pilots to run")
                + (f" (adaptive: {self.rule.description})" if self.policy else ""),
                file=sys.stderr, flush=True)
        self.save()
        with contextlib.closing(self.queue.events()) as events:     # the pool's events, each stored by the queue
            for event in events:
                if isinstance(event, (Finished, Paused)):
                    self.save()
                elif isinstance(event, Tick) and self.advance() and not (event.running or event.waiting):
                    break
        self.advance(force=True)
        if self.o.profile:
            self.report_profile()
        return self.classify()

    def report_profile(self) -> None:
        """``--profile``: where the grid's wall time went (race.run.processes.wall_split), on stderr and kept for
        results.json; calibration is the study's setup here (none on a resume)."""
        from race.run.processes import render_wall_split, wall_split

        pool = self.queue.pool
        if pool is None or not pool.workers:    # no pilot ran here: all imported, or --workers 0 (race worker's time)
            print("profile: no pilot ran in this process (imported, or run by `race worker`), so there is no wall "
                  "split to give", file=sys.stderr, flush=True)
            return
        self.profile = wall_split(list(self.queue.ran), pool.profile(), calibration_seconds=self.setup,
                                  total_seconds=time.monotonic() - self.started, stopped=self.queue.stopped.values())
        print("\n".join(render_wall_split(self.profile)), file=sys.stderr, flush=True)

    def classify(self) -> Results:
        """The diagnosis of the complete pilots (none when every pilot failed), stored and saved."""
        from race.stats.regime import classify as classify_fn

        st, info = self.st, self.info
        pilots, halving = self.pilots(final=True)
        have = {(p.rho_target, p.seed) for p in pilots}
        failed = [f"ρ={p.rho_target:g} seed {p.seed}: {p.extra.get('error')}"
                  for p in st.failed_pilots({k[:2] for k in self.given_up} - have)]
        diagnosis = None
        # the report names the backend that actually produced the pilots (each records its own)
        meta = pilots_meta(info.meta, pilots, adaptive=self.adaptive_attrs, full_grid=len(self.all_keys))
        if halving:
            from race.run.rungs import halving_line

            top = sum(1 for p in pilots if p.status == "complete" and "budget_halving" not in p.extra)
            meta["adaptive"] = f"{self.adaptive_attrs['policy']}, {top} of {len(self.all_keys)} pilots to the top budget"
            meta["budget_halving"] = halving_line(halving["budget_halving"])
        try:
            diagnosis = classify_fn(pilots, meta=meta, **dict(info.classify))
        except ValueError:
            if not failed:
                raise
        if diagnosis is not None:
            st.save_diagnosis(diagnosis, pilots)
        st.set_finished(True)
        return self.save(diagnosis, failed, final=True)


def design_meta(design: Mapping[str, Any]) -> dict[str, Any]:
    """What results.json records of a sized design (race.run.sizing): its name, F, share, budget per pilot,
    F / B, evaluation FLOPs, the thinner evaluation it ran (``eval``: None for the config's), why it chose
    those pilots, and for ``halving`` its ladder and spend (``halving``: η, rungs, keep, ρ alive and mark per rung)."""
    return {k: design[k] for k in ("design", "full_run", "share", "budget", "factor", "eval_flops", "eval", "spent",
                                   "why", "halving")
            if k in design}


def import_finished(st: Any, path: str) -> int:
    """Record the complete pilots of results file ``path`` in study ``st`` (those of its grid, not
    complete there yet); their run config must be the study's up to the grid's shape, and each one's
    schedule the one this study planned for its ρ. Returns how many were added."""
    from race.run.prechecks import check_import

    # all checked before any is added: a refusal imports nothing
    pilots = check_import(path, st.info.run_config, st.info.plan, st.info.keys())
    primary = st.info.classify.get("primary_target", "reward")
    return sum(st.add_finished(p, primary, source=os.path.abspath(path)) for p in pilots)
