"""The results file ``DIR/results.json``: what a pilot grid leaves behind.

Layout (``schema_version`` 1; fields documented in docs/interfaces.md)::

    {"schema_version": 1, "kind": "results", "race_version": "...", "created": "...",
     "config": {...GridConfig...}, "plan": {...Plan.to_dict()...},
     "pilots": [PilotResult.to_dict(), ...], "diagnosis": {...} | null,
     "classify": {"primary_target": ..., "n_boot": ..., "seed": ..., ...}}

Writes are atomic (temp file + rename, race.core.safeio.write_inside) so a crash never leaves a torn file;
a read-modify-write holds ``results_lock`` (race.core.safeio.locked) so two writers lose nothing.
"""
from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from race.core.errors import RaceError
from race.core.records import Diagnosis, PilotResult
from race.core.validation import coerced_number, number_kind, validation_line
from race.core.safeio import quote
from race.stats.classify_input import MAX_SCORE, MAX_SEED

SCHEMA_VERSION = 1


class ResultsError(RaceError):
    """A results file that cannot be read; one-line message naming the file and the problem (a RaceError, and
    so a ValueError as before)."""


@dataclass(frozen=True)
class Results:
    pilots: tuple[PilotResult, ...]
    diagnosis: Diagnosis | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    plan: Mapping[str, Any] = field(default_factory=dict)
    classify: Mapping[str, Any] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from race.core.version import __version__

        return {"schema_version": SCHEMA_VERSION, "kind": "results", "race_version": __version__,
                "created": self.meta.get("created") or _dt.datetime.now(_dt.timezone.utc).isoformat(),
                **{k: v for k, v in self.meta.items() if k != "created"},
                "config": dict(self.config), "plan": dict(self.plan),
                "pilots": [p.to_dict() for p in self.pilots],
                "diagnosis": self.diagnosis.to_dict() if self.diagnosis else None,
                "classify": dict(self.classify)}


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` to ``path`` through race.core.safeio.write_inside (a temporary file and a rename, no
    symbolic link followed): a crash or a full disk leaves the previous file whole. A write the
    machine refuses (no space, read-only, no permission) is a one-line ``ResultsError`` naming the
    file; nothing in the storage is touched by it."""
    from race.core.safeio import write_inside

    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    try:
        write_inside(os.path.dirname(os.path.abspath(path)), os.path.basename(path), text, what="results file")
    except OSError as e:
        import errno

        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise ResultsError(f"cannot write {path!r}: {e.strerror or type(e).__name__}"
                           + (": the disk that holds it is full; free space there" if full else
                              ": make it writable or choose another --out")
                           + ", then run the same command again (finished pilots stay in the storage, and the "
                             "previous file is unchanged)") from None


def results_file(path: str) -> str:
    """The results file ``path`` names: itself, or ``path/results.json`` for a folder."""
    return os.path.join(path, "results.json") if os.path.isdir(path) or not path.endswith(".json") else path


def results_lock(path: str) -> Any:
    """The lock (race.core.safeio.locked) around a read-modify-write of the results file ``path`` names:
    load, change and save inside it, and a second writer (another ``race probe`` on the same folder)
    waits, then re-reads the file with the first one's change in it."""
    from race.core.safeio import locked

    return locked(results_file(path), what="results file")


def stored_probes(path: str) -> list:
    """The length-probe records (race probe) stored in the results file at ``path`` (a file or a folder),
    so that a resumed grid that rewrites the file keeps them; [] when there is no readable file or none."""
    path = results_file(path)
    try:
        with open(path, encoding="utf-8") as fh:
            probes = json.load(fh).get("probes")
    except (OSError, ValueError, AttributeError):
        return []
    return list(probes) if isinstance(probes, list) else []


def save_results(path: str, results: Results) -> str:
    """Write ``results`` to ``path`` (a file, or a folder → ``folder/results.json``)."""
    path = results_file(path)
    write_json_atomic(path, results.to_dict())
    return path


def load_results(path: str) -> Results:
    """Read a results file (or a folder holding ``results.json``); a gzip-compressed one (as
    docs/runs/ keeps them, ``*.json.gz``) is read as well, recognised by its first bytes."""
    import race.stats.report  # noqa: F401  (registers the renderer: print(results.diagnosis) is the text report)

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ResultsError(f"results path {quote(path, 80)} must be a file or folder path (a string)")
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise ResultsError(f"results file {path!r} {what}: expected DIR/results.json from race pilot")
    from race.core.safeio import MAX_RESULTS_BYTES, UnsafeInput, loads_json, read_capped

    try:
        raw = loads_json(read_capped(path, limit=MAX_RESULTS_BYTES, what="results file"),
                         what=f"results file {path!r}")
    except UnsafeInput as e:
        raise ResultsError(str(e)) from None
    except json.JSONDecodeError as e:
        raise ResultsError(f"results file {path!r} is not valid JSON (line {e.lineno}): {e.msg}") from None
    except (UnicodeDecodeError, OSError, EOFError, zlib.error) as e:
        raise ResultsError(f"results file {path!r} is not a JSON text file (nor gzip-compressed JSON): "
                           f"{type(e).__name__}: {e}") from None
    if not isinstance(raw, dict) or "schema_version" not in raw:
        raise ResultsError(f"results file {path!r} has no schema_version: expected a RACE results file")
    if isinstance(raw["schema_version"], bool) or raw["schema_version"] != SCHEMA_VERSION:
        v = raw["schema_version"]
        raise ResultsError(f"results file {path!r} has schema_version {quote(v, 40)}"
                           + (" (a string)" if isinstance(v, str) else "") + f": this RACE reads the number {SCHEMA_VERSION}")
    from pydantic import ValidationError

    try:
        doc = results_schema().model_validate(raw)
    except ValidationError as e:
        raise ResultsError(f"results file {path!r}: {validation_line(e)}") from None
    probes = raw.get("probes")
    if probes is not None:
        from race.stats.instability import probe_problem

        if not isinstance(probes, list):
            raise ResultsError(f"results file {path!r}: 'probes' is not a list: expected race probe's records")
        for i, rec in enumerate(probes):
            bad = probe_problem(rec)
            if bad:
                raise ResultsError(f"results file {path!r}: probes[{i}] {bad} (edited, or written by another "
                                   "tool: remove that record or run race probe again)")
    meta = {k: v for k, v in raw.items()
            if k not in ("pilots", "diagnosis", "config", "plan", "classify", "schema_version", "kind")}
    return Results(pilots=tuple(doc.pilots), diagnosis=doc.diagnosis, config=doc.config, plan=doc.plan,
                   classify=doc.classify, meta=meta)


def not_a_number(raw: Mapping[str, Any], doc: Any) -> tuple[str, Any] | None:
    """(dotted path, value) of the first number the schema read from something that is not a JSON
    number in ``raw`` (a string "0.3", a boolean), or None. pydantic's lax mode (the records keep
    it: ``Record.from_dict`` reads Python values) coerces those; a results file is JSON that RACE
    wrote with numbers as numbers (ints stand for floats), so here each is refused: the validated
    document ``doc`` is walked beside ``raw`` (pydantic decides where a number belongs), and the
    run config by its dataclass types (race.config.schema.first_non_number)."""
    read = doc.model_dump(include={"pilots", "diagnosis"})
    found = coerced_number({k: raw.get(k) for k in read}, read)
    if found:
        return found
    from race.config.configfile import GridConfig
    from race.config.schema import first_non_number

    found = first_non_number(raw.get("config"), GridConfig)
    if found:
        return f"config.{found[0]}", found[1]
    plan = raw.get("plan")
    for key in ("prompt_len", "completion_len", "grid_flops"):
        v = plan.get(key) if isinstance(plan, Mapping) else None
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"plan.{key}", v
    return None


@functools.lru_cache(maxsize=1)
def results_schema() -> Any:
    """The typed schema of a results file (pydantic, the config's schema library; built on first
    use so that ``import race`` stays light): the records are validated by their own dataclass
    types (race.core.records: numbers typed, FLOPs finite), every number a JSON number (``not_a_number``:
    "0.3" or true is refused where pydantic's lax mode would read 0.3 or 1; an int stands for a
    float), ``schema_version`` and ``kind`` must be known, and ``check_numbers`` holds the
    cross-field rules (ρ in (0, 1), C_total the sum of its parts, each pilot's FLOPs within its
    own schedule and budget, ranges ordered). Fields a newer RACE adds at the top level are kept
    (``extra="allow"``) and shown as metadata."""
    from typing import Literal, Optional

    from pydantic import BaseModel, ConfigDict, Field, model_validator

    class ResultsFile(BaseModel):
        model_config = ConfigDict(extra="allow")

        schema_version: Literal[1]
        kind: Literal["results"] = "results"
        config: dict[str, Any] = Field(default_factory=dict)
        plan: dict[str, Any] = Field(default_factory=dict)
        pilots: list[PilotResult] = Field(default_factory=list)
        diagnosis: Optional[Diagnosis] = None
        classify: dict[str, Any] = Field(default_factory=dict)
        failed: list[str] = Field(default_factory=list)     # one line per pilot given up on (failure_message)

        @model_validator(mode="wrap")
        @classmethod
        def _json_numbers(cls, data: Any, handler: Any) -> "ResultsFile":
            doc = handler(data)
            bad = not_a_number(data, doc) if isinstance(data, Mapping) else None
            if bad:
                where, value = bad
                raise ValueError(f"{where} {quote(value, 60)} is {number_kind(value)}: expected a JSON number (a results file "
                                 "holds numbers as numbers)")
            return doc

        @model_validator(mode="after")
        def _numbers(self) -> "ResultsFile":
            check_numbers(self.pilots, self.diagnosis, budget=self.config.get("budget"))
            from race.stats.classify_input import CLASSIFY_KEYS

            unknown = sorted(set(self.classify) - set(CLASSIFY_KEYS))
            if unknown:
                raise ValueError(f"classify has the unknown setting {unknown[0][:60]!r}: expected some of "
                                 f"{', '.join(CLASSIFY_KEYS)} (race.classify's arguments)")
            where = non_finite(self.plan, "plan")
            if where:
                raise ValueError(f"{where} is not a finite number: expected the plan RACE wrote (its FLOPs, lengths "
                                 "and steps are finite)")
            return self

    return ResultsFile


SPENT_TOLERANCE = 0.25      # a pilot's spent FLOPs may differ from the budget by this share (or 2 steps)
RHO_TOLERANCE = 0.15        # measured ρ against the schedule's planned ρ (committed runs: ≤ 0.031)


def non_finite(value: Any, where: str) -> str | None:
    """The path of the first NaN or infinity in ``value`` (JSON's NaN / Infinity tokens), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = non_finite(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}")
        if found:
            return found
    return None


def pilot_budget(p: PilotResult, budget: float) -> float:
    """What pilot ``p`` was meant to spend: ``budget``, or for a pilot budget halving stopped at a rung
    (``extra["budget_halving"]["mark"]``, race.run.rungs) that rung's mark, when it lies in (0, budget)."""
    halving = p.extra.get("budget_halving") if isinstance(p.extra, Mapping) else None
    mark = halving.get("mark") if isinstance(halving, Mapping) else None
    if isinstance(mark, (int, float)) and not isinstance(mark, bool) and math.isfinite(mark) and 0 < mark < budget:
        return float(mark)
    return budget


def _check_pilot_ids(pilots: Sequence[PilotResult]) -> None:
    """Each pilot's seed a whole number a generator can take, one complete record per grid point and seed, and
    finite per-prompt scores (ValueError, one line)."""
    seen: set[tuple[float, int]] = set()
    for p in pilots:
        if isinstance(p.seed, bool) or not isinstance(p.seed, int) or not 0 <= p.seed <= MAX_SEED:
            raise ValueError(f"pilot ρ={p.rho_target!r} has seed {quote(p.seed, 40)}: expected a whole number in "
                             f"[0, {MAX_SEED}]")
        if p.status == "complete":
            if (p.rho_target, p.seed) in seen:
                raise ValueError(f"pilot ρ={p.rho_target!r} seed {p.seed} is recorded twice: expected one complete "
                                 "record per grid point and seed")
            seen.add((p.rho_target, p.seed))
        where = non_finite({k: list(v) for k, v in p.evals.items()}, "evals")
        if where:
            raise ValueError(f"pilot ρ={p.rho_target!r} seed {p.seed}: {where} is not a finite number: expected "
                             "per-prompt scores")
        big = next((f"evals.{k}[{i}]" for k, v in p.evals.items() for i, x in enumerate(v) if abs(x) > MAX_SCORE), None)
        if big:
            raise ValueError(f"pilot ρ={p.rho_target!r} seed {p.seed}: {big} is past ±{MAX_SCORE:g}: expected "
                             "per-prompt scores (the fits square them)")


def check_numbers(pilots: Sequence[PilotResult], diag: Diagnosis | None, *, budget: Any = None) -> None:
    """A results file is untrusted: finite, non-negative FLOPs whose ρ lies in [0, 1] and matches
    C_learning / C_total, each pilot within a step of its budget (``pilot_budget``: a rung's mark for a
    point budget halving dropped); a stored range and recommended ρ finite, in (0, 1) and ordered. Raises
    ValueError (one line; the schema's model validator, ``results_schema``)."""
    _check_pilot_ids(pilots)
    for p in pilots:
        f = p.flops
        parts = (f.search, f.learning, f.reward, f.total)
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in parts):
            raise ValueError(f"pilot ρ={p.rho_target!r} seed {p.seed!r} has FLOPs {[x for x in parts]!r}: expected finite "
                      "numbers ≥ 0")
        if f.total > 0 and abs(f.search + f.learning + f.reward - f.total) > 1e-3 * f.total:
            raise ValueError(f"pilot ρ={p.rho_target!r} seed {p.seed!r}: C_search + C_learning + C_reward ≠ C_total")
        if not (isinstance(p.rho_target, (int, float)) and 0 < p.rho_target < 1):
            raise ValueError(f"pilot ρ target {p.rho_target!r} is outside (0, 1)")
    try:
        b = float(budget if budget is not None else (diag.meta.get("budget_per_pilot") if diag else 0) or 0)
    except (TypeError, ValueError):
        b = 0.0
    far = [p.flops.total for p in pilots
           if b > 0 and p.status == "complete" and not pilot_budget(p, b) / 10 <= p.flops.total <= 10 * pilot_budget(p, b)]
    if far:
        raise ValueError(f"a pilot spent {far[0]:.3g} FLOPs against the grid's {b:.3g} per pilot: expected each pilot "
                  "within its budget")
    for p in pilots:                  # consistent with its own schedule: a pilot stops within a step of the budget
        sched = p.schedule
        per = sched.flops_per_step if sched is not None else None
        if per is not None and not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0
                                       for x in (per.search, per.learning, per.reward, per.total)):
            raise ValueError(f"pilot ρ={p.rho_target!r} seed {p.seed!r}: its schedule's FLOPs per step "
                             f"{[per.search, per.learning, per.reward, per.total]!r}: expected finite numbers ≥ 0")
        if p.status != "complete" or sched is None or b <= 0 or p.flops.total <= 0:
            continue
        step, bp = sched.flops_per_step.total, pilot_budget(p, b)
        if abs(p.flops.total - bp) > max(2 * step, SPENT_TOLERANCE * bp):
            raise ValueError(f"pilot ρ={p.rho_target:g} seed {p.seed} spent {p.flops.total:.3g} FLOPs: its schedule "
                      f"({sched.steps} steps of {step:.3g}) stops within a step of the budget {bp:.3g}")
        if abs(p.flops.rho - sched.flops_per_step.rho) > RHO_TOLERANCE:
            raise ValueError(f"pilot ρ={p.rho_target:g} seed {p.seed} measured ρ {p.flops.rho:.3f}, its schedule plans "
                      f"{sched.flops_per_step.rho:.3f}: expected them within {RHO_TOLERANCE:g} (token lengths move "
                      "it by a few hundredths)")
    if diag is None:
        return
    for name, v in diag.verdicts.items():
        for pt in v.points:
            if isinstance(pt.n_seeds, bool) or not isinstance(pt.n_seeds, int) or pt.n_seeds < 1:
                raise ValueError(f"target {name!r} has a point at ρ={pt.rho_target!r} with n_seeds "
                                 f"{quote(pt.n_seeds, 40)}: expected a whole number ≥ 1")
        lo, hi = v.rho_range
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and 0 < x < 1 for x in (lo, hi)) or lo > hi:
            raise ValueError(f"target {name!r} has rho_range {[lo, hi]!r}: expected two numbers in (0, 1), low ≤ high")
        if not (isinstance(v.confidence, (int, float)) and 0 <= v.confidence <= 1):
            raise ValueError(f"target {name!r} has confidence {v.confidence!r}: expected a share in [0, 1]")
        if not (isinstance(v.best_rho, (int, float)) and 0 < v.best_rho < 1):
            raise ValueError(f"target {name!r} has best_rho {v.best_rho!r}: expected a grid point's ρ in (0, 1)")
    where = non_finite(diag.to_dict(), "diagnosis")
    if where:
        raise ValueError(f"{where} is not a finite number: expected the diagnosis RACE wrote (its numbers are finite)")


def software_line(pilots: Sequence[PilotResult]) -> str:
    """``torch 2.13.0+cpu, transformers 5.19.0, peft 0.21.2`` for the report, from the finished
    pilots' ``extra.software``; distinct sets (workers with other versions) joined by ``; ``."""
    seen: list[str] = []
    for p in pilots:
        sw = p.extra.get("software") if p.status == "complete" else None
        if sw:
            line = ", ".join(f"{k} {sw[k]}" for k in ("torch", "transformers", "peft", "vllm") if k in sw)
            if line not in seen:
                seen.append(line)
    return "; ".join(seen)


def pilots_meta(meta: Mapping[str, Any], pilots: Sequence[PilotResult], *,
                adaptive: Mapping[str, Any] | None = None, full_grid: int = 0) -> dict[str, Any]:
    """The diagnosis meta: the study's, with the backend(s), the engine (when any pilot ran in
    lockstep: race.engine.lean_engine) and software versions that the finished pilots actually ran (each
    pilot records its own), and for an adaptive grid
    (``adaptive``: the study's ``race:adaptive``) its policy and how many of the full grid's
    ``full_grid`` pilots it ran."""
    done = [p for p in pilots if p.status == "complete"]
    used = sorted({str(p.extra.get("backend")) for p in done if p.extra.get("backend")})
    engines = sorted({str(p.extra.get("engine", "solo")) for p in done})
    software = software_line(done)
    return {**dict(meta), **({"backend": ", ".join(used)} if used else {}),
            **({"engine": ", ".join(engines)} if engines and engines != ["solo"] else {}),
            **({"adaptive": f"{adaptive.get('policy')}, {len(done)} of {full_grid} pilots"} if adaptive else {}),
            **({"software": software} if software else {})}


def failure_message(results: Results) -> str | None:
    """One line for pilots that failed after their retries (``meta["failed"]``), else None."""
    failed = results.meta.get("failed")
    if not failed:
        return None
    from race.core.safeio import one_line, shortened

    return (f"{len(failed)} pilot(s) failed — {shortened(one_line(failed[0]), 300)}"
            + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else "")
            + f"; {len(results.pilots) - len(failed)} finished pilots are kept in {results.meta.get('storage')}: "
              "re-run the same command to retry only the failed ones")


def diagnose_results(results: Results, *, refit: bool = False, **classify_kw: Any) -> Diagnosis:
    """The stored diagnosis, or a fresh one from the pilots (``refit`` or none stored)."""
    if results.diagnosis is not None and not refit and not classify_kw:
        return results.diagnosis
    from race.stats.regime import classify

    kw = {**results.classify, **classify_kw}
    meta = kw.pop("meta", None) or (results.diagnosis.meta if results.diagnosis else {})
    complete: Sequence[PilotResult] = [p for p in results.pilots if p.status == "complete"]
    return classify(complete, meta=meta, **kw)


def probe_for(results_or_meta: Any, full_run_budget: float) -> Mapping[str, Any] | None:
    """The stored probe at ``full_run_budget`` (the latest one; None if none ran at that budget)."""
    meta = getattr(results_or_meta, "meta", results_or_meta) or {}
    probes = meta.get("probes") or []
    hits = [p for p in probes if isinstance(p, Mapping)
            and abs(float(p.get("full_run_budget") or 0.0) - full_run_budget) <= 1e-9 * full_run_budget]
    return hits[-1] if hits else None


def with_probe(results: Any, record: Mapping[str, Any]) -> Any:
    """``results`` with ``record`` stored under ``probes`` (replacing one at the same F and η)."""
    meta = dict(results.meta or {})
    keep = [p for p in meta.get("probes") or [] if not (
        isinstance(p, Mapping) and p.get("full_run_budget") == record["full_run_budget"]
        and p.get("learning_rate") == record["learning_rate"])]
    meta["probes"] = keep + [dict(record)]
    return replace(results, meta=meta)
