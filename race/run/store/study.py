"""One RACE study in one optuna storage: the ``Store`` class (create, load, claim, enqueue, sweep,
save) and ``load_results`` (a diagnosis from storage alone); the layout it keeps is described
below. ``Store`` takes its coordinator record from ``race.run.store.coordinator``, its heartbeats
and sweep from ``race.run.store.heartbeats``; ``StudyInfo``, ``Claim`` and the config comparisons
live in ``race.run.store.info`` (and are importable from here).

The storage package (race.run.store) is the only RACE package that imports optuna (``import race``
never loads it).

Layout of a study (docs/storage.md):

- study name: the config's ``name`` (or ``--study``); direction *maximize* (the trial value is the
  pilot's mean primary-target score);
- study user attrs: ``race:config`` (the config as given: what a resume is checked against),
  ``race:run_config`` (the config the pilots run: calibration may switch on the healthy recipe),
  ``race:plan`` (schedules, calibration), ``race:classify``, ``race:meta``, ``race:adaptive``,
  ``race:curve_step_flops``, ``race:ready``; after a grid, ``race:diagnosis`` and ``race:finished``;
- one trial per pilot: params ``rho`` (a categorical over the grid) and ``seed`` (an int in
  ``[first_seed, first_seed + seeds)``) enqueued for every grid point × seed when the study is created, so the grid
  lives in the study and each worker takes one by moving a WAITING trial to RUNNING — an
  atomic transition in every optuna storage (a row lock in RDB storages, the log order in the
  journal), so no two workers get the same trial;
- user attrs of a finished trial: ``flops`` (search / learning / reward / total / rho),
  ``schedule``, ``scores`` (mean per target), ``evals:<target>`` (per-prompt scores, compact:
  zlib-compressed float64, base64), ``curve`` (the whole reward-vs-FLOPs curve, same encoding),
  ``checkpoints`` (the held-out checkpoints with their per-prompt scores: zlib-compressed JSON,
  base64, chunked like every long value; absent in trials of pilots without checkpoints),
  ``result`` (everything else of the ``PilotResult``); the reward-vs-FLOPs curve is also
  reported as intermediate values (step = FLOPs spent / ``race:curve_step_flops``), so
  optuna-dashboard draws the learning curves;
- budget halving (race.run.adaptive.budget): one trial per stage (ρ, seed, rung), its rung in the
  user attr ``rung`` given when it is enqueued; a stage below the top ends PRUNED (optuna's state of a
  trial stopped at an intermediate budget) with ``paused`` (its ``PilotPaused``, compressed JSON) and
  ``reading`` (its primary score), its value the reading; the top stage ends COMPLETE like any pilot;
- liveness: the process running a trial records heartbeats (optuna's RDB heartbeat; for the
  journal a heartbeat in a system attr through the same optuna interface); a RUNNING trial
  whose heartbeat is older than the grace period is failed by whoever notices
  (``optuna.storages.fail_stale_trials``) and its grid point enqueued again. A process that
  finds a RUNNING trial owned by a dead process on its own machine fails it at once.

Storage URLs may carry passwords: ``race.core.urls`` (SQLAlchemy's URL parser) masks them in every
message and every stored value, and refuses URLs whose password cannot be told apart.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from race.core import urls
from race.core.records import Diagnosis, PilotResult
from race.run.store.base import CURVE_POINTS, DEFAULT_HEARTBEAT, OWNER, SCHEMA, StoreError, UnreadyStudy
from race.run.store.codec import get_chunked, json_blob, put_chunked, unjson_blob
from race.run.store.coordinator import Coordination
from race.run.store.engine import first_line, open_storage, system_failure
from race.run.store.heartbeats import Heartbeats
from race.run.store.info import Claim, StudyInfo, fill_missing, first_difference, normalized, short_value
from race.run.store.liveness import owner_info
from race.run.store.trials import (Key, downsample, is_pilot_failure, key_of, paused_attrs, paused_from_attrs, pilot_attrs,
                                   pilot_from_attrs, rung_of)

__all__ = ["Claim", "Store", "StudyInfo", "fill_missing", "first_difference", "load_results", "normalized"]


class Store(Coordination, Heartbeats):
    """One RACE study in one optuna storage (its coordinator record: ``Coordination``; heartbeats and
    the sweep of abandoned trials: ``Heartbeats``)."""

    def __init__(self, url: str, study_name: str, *, heartbeat: int = DEFAULT_HEARTBEAT):
        urls.check(url)
        self.url, self.masked, self.name = url, urls.masked(url), study_name
        self.recorded = urls.masked(urls.absolute(url))     # what a results file keeps: the same file from any folder
        self.heartbeat = max(1, int(heartbeat))
        self.storage = open_storage(url, heartbeat=self.heartbeat, on_stale=self._on_stale)
        self.me = owner_info()
        self.study: optuna.Study | None = None
        self.info: StudyInfo | None = None
        self._last_beat = 0.0
        self._progress: dict[int, dict] = {}
        self._mine: set[int] = set()
        self.requeued: list[Key] = []
        self._paused: dict[int, Any] = {}      # budget halving: decoded readings by trial id

    def close(self) -> None:
        """Release the storage's connections (an SQLite file can then be removed)."""
        engine = getattr(self.storage, "engine", None)
        if engine is not None:
            engine.dispose()

    # -- study life cycle
    def _sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=0)   # never samples: every trial is enqueued

    def exists(self) -> bool:
        try:
            self.storage.get_study_id_from_name(self.name)
            return True
        except KeyError:
            return False
        except Exception as e:  # noqa: BLE001
            raise StoreError(f"storage {self.masked!r} failed: {first_line(e, self.url)}") from None

    def load(self, *, wait: float = 60.0) -> StudyInfo:
        """Open an existing study (waiting up to ``wait`` s for its creator to finish setting it up)."""
        try:
            self.study = optuna.load_study(study_name=self.name, storage=self.storage, sampler=self._sampler())
        except KeyError:
            names = [s.study_name for s in optuna.get_all_study_summaries(self.storage, include_best_trial=False)]
            raise StoreError(f"study {self.name!r} does not exist in {self.masked}: "
                             f"start it with race pilot --storage URL --study {self.name}"
                             + (f" (studies there: {', '.join(names[:8])})" if names else "")) from None
        deadline = time.monotonic() + wait
        while True:
            attrs = self.study.user_attrs
            if attrs.get("race:ready"):
                break
            if time.monotonic() > deadline:
                raise UnreadyStudy(f"study {self.name!r} in {self.masked} is not a RACE study (no race:ready): "
                                   "expected one created by race pilot")
            time.sleep(0.5)
        if attrs.get("race:heartbeat"):           # every process of a study beats and judges alike
            self.set_heartbeat(int(attrs["race:heartbeat"]))
        if attrs.get("race:schema") != SCHEMA:
            raise StoreError(f"study {self.name!r} in {self.masked} has RACE storage schema "
                             f"{attrs.get('race:schema')!r}: this RACE reads {SCHEMA}")
        self.info = StudyInfo(config=attrs["race:config"], run_config=attrs["race:run_config"],
                              plan=unjson_blob(get_chunked(attrs, "race:plan")), classify=attrs["race:classify"],
                              meta=attrs["race:meta"], adaptive=attrs.get("race:adaptive"),
                              curve_step_flops=float(attrs["race:curve_step_flops"]))
        return self.info

    def create(self, *, config: dict, run_config: dict, plan: dict, classify: dict, meta: dict,
               adaptive: dict | None) -> bool:
        """Create the study with its grid; False when another process created it first."""
        try:
            self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction="maximize",
                                             sampler=self._sampler(), load_if_exists=False)
        except optuna.exceptions.DuplicatedStudyError:
            return False
        budget = float(run_config["budget"])
        unit = 10.0 ** math.ceil(math.log10(budget)) / 1e8   # ≤ 1e8 steps: fits a 32-bit column
        s = self.study
        try:
            s.set_user_attr("race:schema", SCHEMA)
            s.set_user_attr("race:config", normalized(config))
            s.set_user_attr("race:run_config", normalized(run_config))
            put_chunked(s.set_user_attr, "race:plan", json_blob(plan))
            s.set_user_attr("race:classify", normalized(classify))
            s.set_user_attr("race:meta", normalized(meta))
            s.set_user_attr("race:adaptive", adaptive)
            s.set_user_attr("race:curve_step_flops", unit)
            s.set_user_attr("race:heartbeat", self.heartbeat)
            s.set_user_attr("race:ready", True)
        except BaseException:
            self.remove_unready()    # a half-made study (a full disk, Ctrl-C) would stall the next run
            raise
        self.load()
        return True

    def remove_unready(self) -> bool:
        """Delete this study if it holds no trial and was never made ready (``race:ready``): what
        an interrupted or refused ``create`` leaves; True when it was removed. Best effort."""
        try:
            study = optuna.load_study(study_name=self.name, storage=self.storage, sampler=self._sampler())
            if study.user_attrs.get("race:ready") or study.get_trials(deepcopy=False):
                return False
            optuna.delete_study(study_name=self.name, storage=self.storage)
        except Exception:  # noqa: BLE001 — a storage that cannot even do this: the error already raised says why
            return False
        self.study, self.info = None, None
        return True

    def check_compatible(self, config: dict) -> None:
        """Refuse to resume with a config other than the study's (one line naming the difference)."""
        assert self.info is not None
        here = {k: v for k, v in normalized(config).items() if k != "name"}
        from race.config.configfile import default_settings

        # a setting added after the study was created ran at its default there
        there = {k: v for k, v in fill_missing(self.info.config, normalized(default_settings())).items() if k != "name"}
        if here.get("grid") != there.get("grid") or here.get("seeds") != there.get("seeds"):
            raise StoreError(f"study {self.name!r} in {self.masked} was created with grid {there.get('grid')} × "
                             f"{there.get('seeds')} seeds; this run asks for {here.get('grid')} × {here.get('seeds')}"
                             ": use the same grid, or another --study / --out (with --import-pilots "
                             "OLD/results.json a larger grid takes the finished pilots of this one)")
        diff = first_difference(there, here)
        if diff:
            path, a, b = diff
            raise StoreError(f"study {self.name!r} in {self.masked} was created with another config: {path} is "
                             f"{short_value(a)} there, {short_value(b)} here: resume with the same config, or use another "
                             "--study / --out")

    def set_adaptive(self, adaptive: dict | None) -> None:
        assert self.study is not None
        self.study.set_user_attr("race:adaptive", adaptive)

    def set_finished(self, finished: bool) -> None:
        assert self.study is not None
        self.study.set_user_attr("race:finished", bool(finished))

    def finished(self) -> bool:
        assert self.study is not None
        return bool(self.study.user_attrs.get("race:finished"))

    # -- trials
    def trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        assert self.study is not None
        return self.study.get_trials(deepcopy=False, states=tuple(states) if states else None)

    def enqueue(self, key: Key, **user_attrs: Any) -> None:
        assert self.study is not None
        self.study.enqueue_trial({"rho": key[0], "seed": key[1]}, user_attrs=user_attrs or None)

    def _distributions(self) -> dict[str, Any]:
        assert self.info is not None
        return {"rho": CategoricalDistribution(self.info.grid), "seed": IntDistribution(self.info.seed_ids[0], self.info.seed_ids[-1])}

    def claim(self, rho: float | None = None, rung: int | None = None) -> Claim | None:
        """Take one WAITING trial (atomic WAITING → RUNNING), of grid point ``rho`` and budget-halving
        rung ``rung`` when ``rho`` is given (the rest of a lockstep group); None when there is none."""
        assert self.study is not None and self.info is not None
        st = self.study._storage
        for t in self.trials((TrialState.WAITING,)):
            if rho is not None and ((key_of(t) or (None,))[0] != rho or rung_of(t) != rung):
                continue
            try:
                if not st.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            # heartbeat before owner: a process killed between the two leaves a trial optuna's
            # heartbeat check fails; one killed before both is failed by sweep's orphan rule
            self._beat_one(t._trial_id)
            st.set_trial_system_attr(t._trial_id, OWNER, self.me)
            key = key_of(t)
            trial = optuna.trial.Trial(self.study, t._trial_id)
            trial.suggest_categorical("rho", list(self.info.grid))
            trial.suggest_int("seed", self.info.seed_ids[0], self.info.seed_ids[-1])
            if key is None or self._duplicate(t._trial_id, key, rung_of(t)):
                st.set_trial_user_attr(t._trial_id, "duplicate", True)
                self.study.tell(trial, state=TrialState.PRUNED)
                continue
            self._mine.add(t._trial_id)
            return Claim(t._trial_id, t.number, key, trial, rung_of(t))
        return None

    def _duplicate(self, trial_id: int, key: Key, rung: int | None = None) -> bool:
        """Another trial of the same pilot already finished, or runs and started first (a stage of budget
        halving: another trial of the same stage paused already, or runs and started first)."""
        assert self.study is not None
        mine = self.study._storage.get_trial(trial_id)
        for t in self.trials((TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED)):
            if t._trial_id == trial_id or key_of(t) != key:
                continue
            if t.state == TrialState.PRUNED:
                if rung is not None and rung_of(t) == rung and "paused" in t.user_attrs:
                    return True
                continue
            if t.state == TrialState.COMPLETE:
                return True
            if rung_of(t) != rung:
                continue
            if (t.datetime_start, t.number) < (mine.datetime_start, mine.number):
                return True
        return False

    def complete(self, claim: Claim, result: PilotResult, primary_target: str) -> None:
        """Record a finished pilot: attributes, learning curve, then COMPLETE with its score."""
        assert self.study is not None and self.info is not None
        st, tid = self.study._storage, claim.trial_id
        self._mine.discard(tid)
        value = result.score(primary_target) if primary_target in result.evals else float("nan")
        if not math.isfinite(value):
            self.fail(claim, f"the pilot reported no finite {primary_target!r} score")
            return
        attrs, steps = self._trial_record(result)
        try:
            for k, v in attrs.items():
                st.set_trial_user_attr(tid, k, v)
            for step, reward in steps.items():
                st.set_trial_intermediate_value(tid, step, reward)
            self.study.tell(claim.trial, value)
        except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            # someone failed our trial as stale while we worked (a stalled heartbeat, a network
            # partition): keep the pilot anyway, as a new COMPLETE trial, unless its retry finished
            if not any(key_of(t) == claim.key for t in self.trials((TrialState.COMPLETE,))):
                self._add_complete(claim.key, value, {**attrs, "recovered_from": claim.number}, steps)

    def pause(self, claim: Claim, paused: Any, primary_target: str) -> None:
        """Record a stage of budget halving that paused at its mark: its ``PilotPaused`` and reading,
        then PRUNED with the reading as its value (kept as a new PRUNED trial if someone failed ours as
        stale meanwhile and no other trial of the stage paused)."""
        assert self.study is not None
        st, tid = self.study._storage, claim.trial_id
        self._mine.discard(tid)
        attrs: dict[str, Any] = {"rung": claim.rung}
        for k, v in paused_attrs(paused, primary_target).items():
            if isinstance(v, str):
                put_chunked(attrs.__setitem__, k, v)
            else:
                attrs[k] = v
        try:
            for k, v in attrs.items():
                st.set_trial_user_attr(tid, k, v)
            st.set_trial_intermediate_value(tid, 0, float(attrs["reading"]))
            self.study.tell(claim.trial, state=TrialState.PRUNED)
        except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            if claim.key + (claim.rung,) not in self.readings():
                self.study.add_trial(optuna.trial.create_trial(
                    params={"rho": claim.key[0], "seed": claim.key[1]}, distributions=self._distributions(),
                    state=TrialState.PRUNED, user_attrs={**attrs, "recovered_from": claim.number},
                    intermediate_values={0: float(attrs["reading"])}))

    def readings(self) -> dict[tuple[float, int, int], Any]:
        """The ``PilotPaused`` of every stage of budget halving that paused, keyed (ρ, seed, rung) (the
        first trial of each)."""
        out: dict[tuple[float, int, int], Any] = {}
        for t in sorted(self.trials((TrialState.PRUNED,)), key=lambda t: t.number):
            k, rung = key_of(t), rung_of(t)
            if k is not None and rung is not None and "paused" in t.user_attrs and k + (rung,) not in out:
                if t._trial_id not in self._paused:        # a finished trial never changes: decoded once
                    self._paused[t._trial_id] = paused_from_attrs(t.user_attrs)
                out[k + (rung,)] = self._paused[t._trial_id]
        return out

    def _trial_record(self, result: PilotResult) -> tuple[dict[str, Any], dict[int, float]]:
        """A finished pilot's trial attributes (long values chunked) and its learning curve as
        intermediate values (at most CURVE_POINTS, steps in units of ``race:curve_step_flops``)."""
        attrs: dict[str, Any] = {}
        for k, v in pilot_attrs(result).items():
            if isinstance(v, str):
                put_chunked(attrs.__setitem__, k, v)
            else:
                attrs[k] = v
        unit, last, steps = self.info.curve_step_flops, -1, {}
        for flops, reward in downsample(result.curve, CURVE_POINTS):
            step = int(round(flops / unit))
            if step > last and math.isfinite(reward):
                steps[step] = float(reward)
                last = step
        return attrs, steps

    def _add_complete(self, key: Key, value: float, attrs: Mapping[str, Any], steps: Mapping[int, float]) -> None:
        self.study.add_trial(optuna.trial.create_trial(
            params={"rho": key[0], "seed": key[1]}, distributions=self._distributions(), value=value,
            user_attrs=dict(attrs), intermediate_values=dict(steps)))

    def add_finished(self, result: PilotResult, primary_target: str, *, source: str) -> bool:
        """Record a pilot that finished elsewhere (``source``: where it comes from) as a COMPLETE trial,
        unless its grid point × seed is complete here already; True when it was added."""
        assert self.study is not None and self.info is not None
        key = (float(result.rho_target), int(result.seed))
        if key not in set(self.info.keys()) or any(key_of(t) == key for t in self.trials((TrialState.COMPLETE,))):
            return False
        attrs, steps = self._trial_record(result)
        self._add_complete(key, result.score(primary_target), {**attrs, "imported_from": source}, steps)
        return True

    def fail(self, claim: Claim, error: str, traceback_text: str = "") -> None:
        assert self.study is not None
        st = self.study._storage
        self._mine.discard(claim.trial_id)
        try:
            st.set_trial_user_attr(claim.trial_id, "error", error)
            if traceback_text:
                st.set_trial_user_attr(claim.trial_id, "traceback", traceback_text[-4000:])
            self.study.tell(claim.trial, state=TrialState.FAIL)
        except (ValueError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            pass   # already failed as stale (and enqueued again) by another process

    def failures_since(self, key: Key, number: int, rung: int | None = None) -> int:
        """Pilot failures (not abandoned trials) of ``key`` among trials numbered ≥ ``number`` (with
        ``rung``: of that budget-halving stage only)."""
        return sum(1 for t in self.trials((TrialState.FAIL,))
                   if t.number >= number and key_of(t) == key and is_pilot_failure(t)
                   and (rung is None or rung_of(t) == rung))

    def pilots(self) -> list[PilotResult]:
        """Every complete pilot (one per grid point × seed), sorted by (ρ, seed)."""
        best: dict[Key, FrozenTrial] = {}
        for t in self.trials((TrialState.COMPLETE,)):
            k = key_of(t)
            if k is not None and "result" in t.user_attrs and (k not in best or t.number < best[k].number):
                best[k] = t
        return [pilot_from_attrs(best[k].user_attrs) for k in sorted(best)]

    def failed_pilots(self, keys: Iterable[Key]) -> list[PilotResult]:
        """The latest failure of each of ``keys`` (for the results file)."""
        assert self.info is not None
        keys = set(keys)
        latest: dict[Key, FrozenTrial] = {}
        for t in self.trials((TrialState.FAIL,)):
            k = key_of(t)
            if k in keys and (k not in latest or t.number > latest[k].number):
                latest[k] = t
        from race.core.records import FlopBreakdown

        return [PilotResult(rho_target=k[0], seed=k[1], flops=FlopBreakdown(), evals={}, status="failed",
                            extra={"error": latest[k].user_attrs.get("error", "failed"), "trial": latest[k].number})
                for k in sorted(latest)]

    def save_diagnosis(self, diagnosis: Diagnosis, pilots: Sequence[PilotResult]) -> None:
        assert self.study is not None
        put_chunked(self.study.set_user_attr, "race:diagnosis", json_blob(diagnosis.to_dict()))
        self.study.set_user_attr("race:diagnosis_pilots", [[p.rho_target, p.seed] for p in pilots])

    def stored_diagnosis(self, pilots: Sequence[PilotResult]) -> Diagnosis | None:
        """The diagnosis stored with the study, if it was made from exactly ``pilots``."""
        assert self.study is not None
        attrs = self.study.user_attrs
        text = get_chunked(attrs, "race:diagnosis")
        if not text or attrs.get("race:diagnosis_pilots") != [[p.rho_target, p.seed] for p in pilots]:
            return None
        return Diagnosis.from_dict(unjson_blob(text))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials():
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out


def _named_system_failures(method: Callable) -> Callable:
    """``method`` of ``Store``, with a failure of the machine under the storage (a full disk, an I/O
    error, a read-only file: race.run.store.engine.system_failure) raised as a one-line ``StoreError``
    naming it and the storage, whatever wrapper optuna put around the driver's error."""

    @functools.wraps(method)
    def wrapper(self: "Store", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except StoreError:
            raise
        except Exception as e:  # noqa: BLE001 — re-raised unless the machine is named
            named = system_failure(e, self.url)
            if named is None:
                raise
            raise named from None

    return wrapper


for _name in ("exists", "load", "create", "update_heartbeat", "claim_coordination", "beat_coordination", "set_adaptive",
              "set_finished", "finished", "trials", "enqueue", "claim", "beat", "set_pid", "sweep", "complete",
              "add_finished", "pause", "readings", "fail", "failures_since", "pilots", "failed_pilots", "save_diagnosis", "stored_diagnosis",
              "counts"):
    setattr(Store, _name, _named_system_failures(getattr(Store, _name)))


def require_storage_file(url: str, why: str) -> None:
    """Refuse a file storage that is not there (sqlite:///FILE, journal:FILE, FILE.log) where a study must exist
    already (``race report --storage``, ``race worker``): opening it would create the file."""
    import os

    from race.core.urls import file_path

    path = file_path(url)
    if path and not os.path.exists(path):
        raise StoreError(f"storage file {path!r} does not exist: {why} (expected the storage a grid wrote; its URL is "
                         "in that grid's results.json)")


def load_results(url: str, study_name: str):
    """A ``race.stats.results.Results`` built from storage alone (for ``race report --storage``)."""
    from race.stats.results import Results, pilots_meta

    require_storage_file(url, "nothing to read")
    store = Store(url, study_name)
    info = store.load(wait=0)
    pilots = store.pilots()
    diagnosis = store.stored_diagnosis(pilots)
    return Results(pilots=tuple(pilots), diagnosis=diagnosis, config=info.run_config, plan=info.plan,
                   classify={**info.classify, "meta": pilots_meta(info.meta, pilots, adaptive=info.adaptive,
                                                                   full_grid=len(info.grid) * info.seeds)},
                   meta={"storage": store.recorded, "study": study_name})
