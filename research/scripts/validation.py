"""The validation study (issue 16): do pilot verdicts come true at the full budget?

    python research/scripts/validation.py status                         # which grids are committed, which missing
    python research/scripts/validation.py run SETTING KIND [--pin DIR]   # one grid: KIND = pilot | full10 | full30
    python research/scripts/validation.py queue [--pin DIR] [--kinds pilot,full10] [--half development]
    python research/scripts/validation.py snapshot                       # finished pilots of grids under way (commit them)
    python research/scripts/validation.py tables                         # every table of docs/validation.md
    python research/scripts/validation.py tables --check docs/validation.md    # exit 1 if the doc differs
    python research/scripts/validation.py tables --write docs/validation.md    # rewrite the doc's tables

The suite (settings, their development / held-out split, pilot budgets and grids) is
``research/validation/suite.yaml``. Every grid runs as ``race pilot`` from a pinned checkout (``--pin``: a
``git worktree`` at a commit; default: this checkout) with its storage outside the work tree
(``RACE_VALIDATION_RUNS``, default ``/work/validation-runs``), so it resumes after an
interruption and keeps its finished pilots. When it ends, its compact data (config, schedules,
FLOPs, per-prompt held-out scores of the reward and pass@1 targets, curves, checkpoints; not the
SQLite file) goes to ``research/validation/runs/SETTING/KIND.json.gz`` with the pinned commit and the
command: that file is the record the study resumes from (a grid whose data is there never runs
again). ``tables`` recomputes every table from those files alone, in well under a minute.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SUITE = ROOT / "research" / "validation" / "suite.yaml"
RUNS = ROOT / "research" / "validation" / "runs"          # research/scripts/validation.py --runs DIR changes it (tests)
KINDS = {"pilot": 1, "full10": 10, "full30": 30, "full100": 100}
ROUND1_KINDS = ("pilot", "full10", "full30")   # the grids the first round's tables show
EXTENDED = "pilot-x1"        # the pilot grid after race pilot --extend 1 (run_extension); budget factor 1
N_BOOT = 1000
# the settings whose full runs had been looked at when the candidate low-side rule was written down
# (candidate_range, 2026-12-02): only the others judge it
CANDIDATE_SEEN = frozenset({"default", "structured", "generate", "lr-x3", "default-cosine", "steps-sparse",
                            "dense", "hard", "lr-x0.3", "steps-prm", "steps-proxy-prm"})
BEGIN, END = "<!-- validation:tables:begin -->", "<!-- validation:tables:end -->"   # docs/validation.md: the summary tables
DETAIL = ("<!-- validation:detail:begin -->", "<!-- validation:detail:end -->")      # research/validation-log.md: the rest
DETAIL_FROM = "### The range open at a grid edge"   # the first table of the detail block


# ---------------------------------------------------------------- the suite

def load_suite(path: Path = SUITE) -> dict[str, Any]:
    import yaml

    suite = yaml.safe_load(path.read_text())
    names = [s["name"] for s in suite["settings"]]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: setting names repeat")
    return suite


def setting(suite: dict, name: str) -> dict[str, Any]:
    for s in suite["settings"]:
        if s["name"] == name:
            return s
    raise SystemExit(f"unknown setting {name!r}: expected one of {', '.join(s['name'] for s in suite['settings'])}")


GRID_KEYS = {"pilot": "pilot_grid", "full10": "full_grid", "full30": "long_grid", "full100": "longest_grid"}


def planned(s: dict, kind: str, suite: dict | None = None) -> bool:
    """Whether the suite plans grid ``kind`` for setting ``s``: every setting has a pilot and a 10 × B
    grid, only those with a ``long_grid`` a 30 × B one, and a ``longest_grid`` a 100 × B one. A suite
    with its own ``kinds`` (round 3) plans a kind for every setting, or for those holding its ``when`` key."""
    if (s.get("replaced_by") or s.get("dropped")) and kind != "pilot":   # round 2's replacement rule: pilots only
        return False
    if suite is not None and suite.get("kinds"):
        spec = suite["kinds"].get(kind)
        return spec is not None and (not spec.get("when") or bool(s.get(spec["when"])))
    return kind in ("pilot", "full10") or bool(s.get(GRID_KEYS[kind]))


def kinds_of(suite: dict) -> list[str]:
    """The grid kinds of a suite, in queue order: its own ``kinds`` (round 3: budgets stated by the full
    run F), else pilot and the 10 ×, 30 × and 100 × B grids."""
    if suite.get("kinds"):
        return list(suite.get("order") or suite["kinds"])
    return list(KINDS)


def budget_of(s: dict, kind: str, suite: dict | None = None) -> float:
    """FLOPs per run of grid ``kind`` of setting ``s``: B × the kind's factor (rounds 1–2), or, in a suite
    with its own ``kinds``, the setting's full run F × the kind's factor (round 3: C = F_r + P)."""
    if suite is not None and suite.get("kinds"):
        return float(s["full_run"]) * float(suite["kinds"][kind]["factor"])
    return float(s["pilot_budget"]) * KINDS.get(kind, 1)


def grid_of(s: dict, kind: str, suite: dict | None = None) -> list[float]:
    """The ρ targets of grid ``kind`` of setting ``s``: a grid key of the setting, or one point
    (round 3's baselines: ``on_policy``, or ``prior``, the suite's ``prior_rho``)."""
    if suite is not None and suite.get("kinds"):
        spec = suite["kinds"][kind]
        if "grid" in spec:
            return list(s.get(spec["grid"]) or [])
        return [float(suite["prior_rho"]) if spec["point"] == "prior" else float(s[spec["point"]])]
    return list(s.get(GRID_KEYS[kind]) or [])


def seeds_of(suite: dict, kind: str, s: dict | None = None) -> int:
    """Seeds per point of grid ``kind``: the setting's ``more_seeds`` for that kind where it has one
    (round 2: seeds added where the rule's seeds-needed advice on a full grid asked for them), else
    the suite's ``seeds``, one number or a mapping by kind."""
    more = (s or {}).get("more_seeds") or {}
    if kind in more:
        return int(more[kind])
    seeds = suite.get("seeds", 3)
    return int(seeds.get(kind, 3) if isinstance(seeds, dict) else seeds)


def wants_more(suite: dict, s: dict, kind: str) -> bool:
    """Whether a committed complete grid has fewer seeds than the suite now plans for it (``more_seeds``):
    the queue then resumes it from its committed pilots and runs only the added seeds."""
    path = data_path(s["name"], kind)
    if not path.is_file():
        return False
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return int(json.load(fh).get("seeds", 0)) < seeds_of(suite, kind, s)


def finished(suite: dict, s: dict, kind: str) -> bool:
    """Whether grid ``kind`` of setting ``s`` is committed complete with every seed the suite plans:
    nothing left for the queue to run, or for a snapshot to take."""
    return data_path(s["name"], kind).is_file() and not wants_more(suite, s, kind)


def sealed(suite: dict, kind: str) -> bool:
    """Whether grid ``kind`` of this suite is sealed: listed under ``sealed`` while ``freeze`` is unset.
    A sealed grid's results stay out of every table, summary and printout (research/scripts/validation_round2.py)."""
    return kind in (suite.get("sealed") or ()) and not suite.get("freeze")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def grid_config(s: dict, kind: str, seeds: int, *, root: Path | None = None, suite: dict | None = None) -> dict:
    """The config mapping of one grid of setting ``s`` (its budget per pilot: B × the kind's factor).
    Paths in the base config that start ``./`` or ``../`` (a downstream file) are made absolute
    against the base config's folder in ``root`` (the pinned checkout; default this one), since the
    written config lives in the grid's storage."""
    import yaml

    from race.config import presets

    root = Path(root or ROOT)
    base = dict(presets.DEFAULT) if s["base"] == "default" else yaml.safe_load((ROOT / s["base"]).read_text())
    if s["base"] != "default":
        here = (root / s["base"]).parent

        def near(v):
            return str((here / v).resolve()) if isinstance(v, str) and v.startswith(("./", "../")) else v
        for key in ("model", "task"):
            if key in base:
                base[key] = near(base[key])
        tasks = (base.get("eval") or {}).get("tasks")
        if tasks:
            base["eval"]["tasks"] = [near(t) if isinstance(t, str) else {**t, "path": near(t.get("path"))}
                                     for t in tasks]
    cfg = _merge(base, s.get("overrides") or {})
    fn = (cfg.get("reward") or {}).get("function")
    if isinstance(fn, str) and fn.startswith("RACE_ROOT/"):     # a suite's own reward file, in the pinned checkout
        cfg["reward"] = {**cfg["reward"], "function": str(root / fn[len("RACE_ROOT/"):])}
    budget = budget_of(s, kind, suite)
    grid = grid_of(s, kind, suite)
    if not grid:
        raise SystemExit(f"setting {s['name']!r} has no grid for {kind}")
    cfg.update(name=f"val-{s['name']}-{kind}", budget=budget, grid=list(grid), seeds=seeds)
    return cfg


# race.stats.drift's population drift and between-setting SD at round 2's freeze (f6862b9, round 1's 11
# settings): round 2's frozen rule and both rounds' rate runs are scored with them, whatever race.stats.drift
# carries now (research/scripts/validation_round2.py, stability.py)
FROZEN_POPULATION = (-0.055, 0.052)

RUNS_OF: dict[str, Path] = {}     # a setting's committed data where it is not under RUNS (several rounds read at once)


def data_path(name: str, kind: str, *, partial: bool = False) -> Path:
    return RUNS_OF.get(name, RUNS) / name / f"{kind}{'.partial' if partial else ''}.json.gz"


def write_record(record: dict, *, partial: bool = False) -> Path:
    path = data_path(record["setting"], record["kind"], partial=partial)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(record, fh, separators=(",", ":"))
    os.replace(tmp, path)
    return path


def make_record(s: dict, kind: str, suite: dict, results: dict, *, commit: str, command: str,
                wall_seconds: float) -> dict:
    budget = budget_of(s, kind, suite)
    grid = sorted({p["rho_target"] for p in results["pilots"]})
    return {"setting": s["name"], "kind": kind, "half": s.get("half", "held-out"), "budget": budget, "grid": grid,
            "seeds": seeds_of(suite, kind, s), "on_policy": s.get("on_policy"), "commit": commit,
            "command": command, "wall_seconds": round(wall_seconds, 1),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": results.get("config"),
            "software": (results.get("diagnosis") or {}).get("meta", {}).get("software"),
            "pilots": [compact_pilot(p) for p in results["pilots"]]}


def load_run(name: str, kind: str) -> dict | None:
    path = data_path(name, kind)
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


# ---------------------------------------------------------------- compact data

def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else x
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def compact_pilot(p: dict) -> dict:
    """A results.json pilot, floats at 6 significant digits, ``extra`` trimmed to what the study reads."""
    out = dict(p)
    extra = p.get("extra") or {}
    out["extra"] = {k: extra[k] for k in ("steps", "reward_errors", "reward_first_error", "software", "error")
                    if k in extra}
    return _round(out)


def _commit(path: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def _cli_module(pin: Path) -> str:
    """How ``python -m`` names the race command in the checkout ``pin``: ``race.cli`` in a checkout from
    before the packages by layer (round 3's pin among them), ``race`` (race/__main__.py) after."""
    return "race.cli" if (pin / "race" / "cli.py").is_file() else "race"


def _cli_source(pin: Path) -> str:
    """The source of the race command in the checkout ``pin`` (either layout)."""
    old = pin / "race" / "cli.py"
    return (old if old.is_file() else pin / "race" / "run" / "cli.py").read_text(encoding="utf-8")


def run(name: str, kind: str, *, pin: Path, suite: dict, storage_root: Path, quiet: bool = False) -> Path:
    """Run (or resume) one grid from the pinned checkout; write its compact data; return its path."""
    import yaml

    s = setting(suite, name)
    cfg = grid_config(s, kind, seeds_of(suite, kind, s), root=pin, suite=suite)
    out_dir = storage_root / f"{name}-{kind}"
    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    (out_dir / "pin.txt").write_text(str(pin) + "\n")     # which checkout this grid runs from (snapshot reads it)
    # a grid of fewer points than a verdict needs (round 3's baselines: one ρ × 5 seeds) runs through race pilot
    # without its grid-points check and verdict (research/scripts/point_runner.py); every other grid as is
    head = ([sys.executable, str(Path(__file__).with_name("point_runner.py")), _cli_module(pin)]
            if len(cfg["grid"]) < 3 else [sys.executable, "-m", _cli_module(pin)])
    cmd = [*head, "pilot", str(config_file), "--out", str(out_dir), "--quiet", "--format", "json"]
    if "--engine" in _cli_source(pin):
        # the study runs every grid with the solo engine its first grids ran with: a lockstep pilot
        # equals the solo one only to rounding, and over hundreds of steps the two drift apart as two
        # seeds would (docs/benchmarks.md, "Lockstep pilots"), so one engine keeps grids comparable
        cmd += ["--engine", "solo"]
    if os.environ.get("RACE_VALIDATION_WORKERS"):     # pilot processes at once (default: race pilot's own choice)
        cmd += ["--workers", os.environ["RACE_VALIDATION_WORKERS"]]
    partial = data_path(name, kind, partial=True)
    # the storage of an interrupted grid is gone (a new machine or session), or a complete grid gets
    # more seeds: its committed finished pilots go into the new study first, and only the missing ones run
    start = partial if partial.is_file() else (data_path(name, kind) if wants_more(suite, s, kind) else None)
    if start is not None and not (out_dir / "race.db").exists():
        with gzip.open(start, "rt", encoding="utf-8") as fh:
            rec = json.load(fh)
        cmd += ["--import-pilots", str(_results_file(rec, out_dir / "committed-pilots.json"))]
    env = {**os.environ, "PYTHONPATH": str(pin)}
    t0 = time.time()
    # cwd = the pin: `python -m` puts the working directory first on sys.path, before PYTHONPATH, so
    # from any other directory holding a race/ package (this checkout) the grid would run that code.
    # A sealed grid's messages (warnings name fallen pilots) go to a log in its storage, unread.
    hide = sealed(suite, kind)
    log = open(out_dir / "race-pilot.log", "a", encoding="utf-8") if hide else None
    try:
        proc = subprocess.run(cmd, cwd=str(pin), env=env, stdout=subprocess.DEVNULL,
                              stderr=log if hide else (None if not quiet else subprocess.PIPE), text=True)
    finally:
        if log is not None:
            log.close()
    if proc.returncode != 0:
        raise SystemExit(f"{name} {kind}: race pilot ended with exit {proc.returncode}; its storage in {out_dir} "
                         "keeps every finished pilot (run the same command again)"
                         + ("; its messages are sealed in race-pilot.log there" if hide else ""))
    results = json.loads((out_dir / "results.json").read_text())
    path = write_record(make_record(s, kind, suite, results, commit=_commit(pin),
                                    command=" ".join(["race", *cmd[3:]]), wall_seconds=time.time() - t0))
    if partial.is_file():
        partial.unlink()
    return path


def _results_file(rec: dict, path: Path) -> Path:
    """A results file holding a compact record's complete pilots (what --import-pilots reads)."""
    path.write_text(json.dumps({"schema_version": 1, "kind": "results", "config": rec["config"], "plan": {},
                                "classify": {}, "diagnosis": None,
                                "pilots": [p for p in rec["pilots"] if p.get("status") == "complete"]}))
    return path


def run_extension(name: str, *, pin: Path, suite: dict, storage_root: Path) -> Path | None:
    """``race pilot --extend 1`` on the committed pilot grid of setting ``name``: its pilots are
    imported (none re-run), and when the best point lies at a grid edge the next point past it runs
    (race.run.extend); written as ``EXTENDED``. None when the grid needs no extension (nothing runs)."""
    import yaml

    from race.run.extend import boundary_side
    from race.stats.regime import edge_point

    s = setting(suite, name)
    rec = load_run(name, "pilot")
    if rec is None:
        raise SystemExit(f"{name}: no committed pilot grid to extend")
    if edge_point(boundary_side(verdict(rec)), rec["grid"]) is None:
        return None
    cfg = grid_config(s, "pilot", seeds_of(suite, "pilot"), root=pin)
    out_dir = storage_root / f"{name}-{EXTENDED}"
    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    (out_dir / "pin.txt").write_text(str(pin) + "\n")
    seed_file = _results_file(rec, out_dir / "committed-pilots.json")
    # the study's engine (solo, see run), one pilot at a time: it runs beside the queue
    cmd = [sys.executable, "-m", _cli_module(pin), "pilot", str(config_file), "--out", str(out_dir), "--quiet", "--format",
           "json", "--engine", "solo", "--workers", "1", "--import-pilots", str(seed_file), "--extend", "1"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=str(pin), env={**os.environ, "PYTHONPATH": str(pin), "OMP_NUM_THREADS": "1"},
                          stdout=subprocess.DEVNULL, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} {EXTENDED}: race pilot ended with exit {proc.returncode}; its storage in {out_dir} "
                         "keeps every finished pilot (run the same command again)")
    results = json.loads((out_dir / "results.json").read_text())
    return write_record(make_record(s, EXTENDED, suite, results, commit=_commit(pin),
                                    command=" ".join(["race", *cmd[3:]]), wall_seconds=time.time() - t0))


def snapshot(suite: dict, storage_root: Path, pin: Path) -> list[Path]:
    """The finished pilots of every grid still running (or interrupted) under ``storage_root``,
    as ``KIND.partial.json.gz``: commit them, and a lost storage costs only the unfinished pilots.
    Each record names the commit of the pin its grid runs from (``pin.txt`` in its storage, written
    by ``run``; ``pin`` for grids started before that file existed)."""
    out = []
    for s in suite["settings"]:
        for kind in kinds_of(suite):
            results_file = storage_root / f"{s['name']}-{kind}" / "results.json"
            if finished(suite, s, kind) or not results_file.is_file():
                continue
            results = json.loads(results_file.read_text())
            done = [p for p in results["pilots"] if p.get("status") == "complete"]
            pin_file = results_file.parent / "pin.txt"
            grid_pin = Path(pin_file.read_text().strip()) if pin_file.is_file() else pin
            if done:
                rec = make_record(s, kind, suite, {**results, "pilots": done}, commit=_commit(grid_pin),
                                  command="(partial)", wall_seconds=0.0)
                out.append(write_record(rec, partial=True))
    return out


# ---------------------------------------------------------------- statistics

_MEMO: dict[int, tuple[dict, dict]] = {}


def _memo(record: dict, key: str, make: Any) -> Any:
    """``make()`` once per record (a loaded dict) and key: the tables read each grid several times."""
    held = _MEMO.setdefault(id(record), (record, {}))
    if held[0] is not record:                 # an id reused after its record was freed
        held = _MEMO[id(record)] = (record, {})
    if key not in held[1]:
        held[1][key] = make()
    return held[1][key]


def pilots_of(record: dict) -> list:
    from race.core.records import PilotResult

    return _memo(record, "pilots", lambda: [PilotResult.from_dict(p) for p in record["pilots"]
                                            if p.get("status") == "complete"])


def diagnosis(record: dict):
    """The rule's diagnosis of a grid (race.stats.regime.classify, the primary target: held-out reward)."""
    from race.stats.regime import classify

    return _memo(record, "diagnosis",
                 lambda: classify(pilots_of(record), primary_target="reward", n_boot=N_BOOT, seed=0))


def verdict(record: dict):
    """The rule's verdict on a grid (the diagnosis' primary target)."""
    return diagnosis(record).primary


def grid_class(diag: Any) -> str:
    """What a grid is scored as: "unstable" when at least half its runs fell back on their held-out
    checkpoints (race.stats.instability.unstable_grid: the report names it), else its regime. Decided on the
    development half (lr-x3) before any held-out full run: a grid of collapsed runs has no regime
    to agree with, and a pilot grid that names the instability has given the right advice."""
    from race.stats.instability import unstable_grid

    return "unstable" if unstable_grid(diag.stability) else diag.primary.regime.value


def point_means(record: dict, target: str = "reward") -> dict[float, list[float]]:
    """ρ target → per-seed mean held-out score."""
    out: dict[float, list[float]] = {}
    for p in pilots_of(record):
        scores = p.evals[target]
        out.setdefault(p.rho_target, []).append(sum(scores) / len(scores))
    return dict(sorted(out.items()))


def measured_rho(record: dict) -> dict[float, float]:
    """ρ target → the measured ρ (C_learning / C_total as spent), mean over the point's runs: the
    axis the pilot verdict's range and recommended ρ live on."""
    out: dict[float, list[float]] = {}
    for p in pilots_of(record):
        out.setdefault(p.rho_target, []).append(p.flops.rho)
    return {t: sum(v) / len(v) for t, v in sorted(out.items())}


# a full-run point is in a range when its measured ρ is, give or take this: the same schedule's
# measured ρ differs between a pilot and a full run only by token-length noise (≤ 6e-4 in this suite's
# scored settings; research/validation-log.md, "A scoring fix")
RHO_TOL = 0.002


def boot_means(record: dict, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[list[float], Any]:
    """The full runs' ρ targets and an (n_boot × ρ) array of bootstrap means of the held-out reward:
    each replicate resamples each point's seeds, then each chosen seed's prompts (memoized per record;
    best_rho_ci and regret_gain_ci read the same replicates)."""
    import numpy as np

    def make():
        by_rho: dict[float, list] = {}
        for p in pilots_of(record):
            by_rho.setdefault(p.rho_target, []).append(np.asarray(p.evals["reward"], dtype=float))
        rhos = sorted(by_rho)
        rng = np.random.default_rng(seed)
        out = np.empty((n_boot, len(rhos)))
        for b in range(n_boot):
            for j, r in enumerate(rhos):
                seeds = by_rho[r]
                chosen = [seeds[i] for i in rng.integers(0, len(seeds), len(seeds))]
                out[b, j] = np.mean([s[rng.integers(0, len(s), len(s))].mean() for s in chosen])
        return rhos, out

    return _memo(record, f"boot/{n_boot}/{seed}", make)


def best_rho_ci(record: dict, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """The full runs' best ρ (highest mean over seeds) and a bootstrap CI over seeds and prompts."""
    import numpy as np

    means = point_means(record)
    rhos = sorted(means)
    best = rhos[int(np.argmax([np.mean(means[r]) for r in rhos]))]
    b_rhos, reps = boot_means(record, n_boot=n_boot, seed=seed)
    picks = [b_rhos[i] for i in np.argmax(reps, axis=1)]
    lo, hi = np.quantile(picks, [0.025, 0.975])
    return best, (float(lo), float(hi))


def regret_gain_ci(record: dict, rec_rho: float, on_policy: float | None) -> tuple[tuple[float, float],
                                                                                  tuple[float, float]]:
    """95 % bootstrap CIs (the replicates of boot_means) of the regret at ``rec_rho`` (a measured ρ:
    the best point's mean minus the response read at it) and of the gain there over the on-policy
    point (nan without one). A replicate's best is its own maximum, so the regret CI leans high (the
    maximum of noisy means is biased up); it says how far seed and prompt noise alone move the figure."""
    import numpy as np

    rhos, reps = boot_means(record)
    meas = measured_rho(record)
    axis = [meas[r] for r in rhos]
    at = np.array([np.interp(rec_rho, axis, row) for row in reps])      # interpolate(), per replicate
    regret = reps.max(axis=1) - at
    nan = (float("nan"), float("nan"))
    gain = at - reps[:, rhos.index(on_policy)] if on_policy in rhos else None
    q = lambda v: tuple(float(x) for x in np.quantile(v, [0.025, 0.975]))  # noqa: E731
    return q(regret), (q(gain) if gain is not None else nan)


def interpolate(means: dict[float, list[float]], rho: float) -> float:
    """The full-run response (mean over seeds) at ``rho``, linear between grid points and flat past
    the ends (numpy.interp, which regret_gain_ci applies to each bootstrap replicate)."""
    import numpy as np

    xs = sorted(means)
    return float(np.interp(rho, xs, [sum(means[x]) / len(means[x]) for x in xs]))


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free CI of a median from order statistics: the narrowest (k-th smallest,
    k-th largest) pair covering it with probability ≥ ``level`` (binomial, p = 1/2); under 6 values
    none reaches 0.95, and the (smallest, largest) pair is given with its own coverage.
    Returns (low, high, coverage); nans without values."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (float("nan"), float("nan"), float("nan"))
    cover = lambda k: 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n  # noqa: E731  k-th from each end
    k = 1
    while k + 1 <= (n + 1) // 2 and cover(k + 1) >= level:
        k += 1
    return (xs[k - 1], xs[n - k], cover(k))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def collapses(record: dict) -> dict[float, int]:
    """Unstable pilots per ρ (race.stats.instability' rule on the held-out reward)."""
    from race.stats.instability import stability

    st = stability(pilots_of(record), "reward")
    return {pt.rho_target: pt.unstable for pt in st.points} if st else {}


def _fallen(diag: Any) -> tuple[int, int]:
    """(runs that fell back, runs) of a grid; (0, 0) without checkpoints."""
    st = diag.stability
    return (st.fell, st.pilots) if st else (0, 0)


def candidate_range(pv: Any, pilot_grid: dict[float, float]) -> tuple[float, float, float]:
    """The candidate low-side rule (written down on 2026-12-02, after the held-out half's first five
    settings and before the reasoner's, lr-x3-cosine's and the 30 × B full runs were looked at; not
    adopted): the recommended range's lower bound moves down to the pilot grid's next measured point
    below it, since the full-run best ρ lay below the pilot grid's best in 7 of the first 10 scored
    settings. A range already open below, or whose lower bound is at the grid's lowest point, is
    unchanged. Returns (low, high, the ρ where it is read: the new range's centre; an open range keeps
    its edge point)."""
    b_lo, b_hi = pv.bounds
    if pv.open_side == "below":
        return b_lo, b_hi, pv.recommended_rho
    lower = [m for m in pilot_grid.values() if m < b_lo - RHO_TOL]
    lo = max(lower) if lower else b_lo
    return lo, b_hi, pv.recommended_rho if pv.open_side == "above" else (lo + b_hi) / 2


def _within(rho: float, lo: float, hi: float) -> bool:
    """A measured ρ in [lo, hi], within RHO_TOL (a pilot and a full run of one schedule differ by less)."""
    return lo - RHO_TOL <= rho <= hi + RHO_TOL


def _in_se(value: float, se: float) -> float:
    """``value`` in units of ``se``; nan where the SE is nan or not positive (one seed, a flat grid)."""
    return value / se if se == se and se > 0 else float("nan")


def setting_row(s: dict, pilot: dict, full: dict) -> dict[str, Any]:
    """Every per-setting metric of docs/validation.md for one setting with both grids done."""
    import statistics

    pd, fd = diagnosis(pilot), diagnosis(full)
    pv, fv = pd.primary, fd.primary
    means = point_means(full)
    best, best_ci = best_rho_ci(full)
    # the rule as adopted (a range open at a grid edge: race.stats.regime.open_side) and as it was before
    # 2026-12-02 (always the closed range, read at its centre): both are scored
    lo, hi = pv.rho_range
    centre = (lo + hi) / 2
    best_mean = sum(means[best]) / len(means[best])
    se = statistics.stdev(means[best]) / math.sqrt(len(means[best])) if len(means[best]) > 1 else float("nan")
    # the pooled SE: the seed variance pooled over every full-run point (10 df at 5 × 3 runs, against the
    # best point's own 2), over the best point's seed count; the two are shown side by side
    dfs = [len(v) - 1 for v in means.values() if len(v) > 1]
    pooled_sd = math.sqrt(sum((len(v) - 1) * statistics.variance(v) for v in means.values() if len(v) > 1)
                          / sum(dfs)) if dfs and sum(dfs) else float("nan")
    pse = pooled_sd / math.sqrt(len(means[best]))
    # the pilot's range and recommended ρ are measured ρ: read them on the full runs' measured axis
    meas = measured_rho(full)
    on_axis = {meas[t]: v for t, v in means.items()}
    at_rec = interpolate(on_axis, pv.recommended_rho)
    closed_regret = best_mean - interpolate(on_axis, centre)
    on_policy = s.get("on_policy")
    gain = at_rec - sum(means[on_policy]) / len(means[on_policy]) if on_policy in means else float("nan")
    regret_ci, gain_ci = regret_gain_ci(full, pv.recommended_rho, on_policy)
    b_lo, b_hi = pv.bounds
    c_lo, c_hi, c_read = candidate_range(pv, measured_rho(pilot))
    pilot_flops = sum(p.flops.total for p in pilots_of(pilot))
    full_pilots = pilots_of(full)
    one_full = max(p.flops.total for p in full_pilots)
    return {"setting": s["name"], "half": s.get("half"), "pilot": grid_class(pd), "pilot_regime": pv.regime.value,
            "full_regime": fv.regime.value, "pilot_best_rho": pv.best_rho, "pilot_range": (lo, hi),
            # best ρ, range and regret mean nothing on a grid of collapsed runs: such settings are not scored on them
            "scored": grid_class(fd) != "unstable",
            "pilot_unstable": _fallen(pd), "full_unstable": _fallen(fd),
            # the bootstrap share of the full runs' replicates that show the pilot's regime
            "support": float(fv.fits.get("support", {}).get(pv.regime.value, float("nan"))),
            "open_side": pv.open_side, "pilot_range_text": pv.range_text(),
            "closed_in_range": _within(meas[best], lo, hi), "closed_regret": closed_regret,
            "closed_regret_pse": _in_se(closed_regret, pse), "regret_pse": _in_se(best_mean - at_rec, pse),
            "best_mean": best_mean, "pse": pse,
            "pilot_confidence": pv.confidence, "full": grid_class(fd), "full_confidence": fv.confidence,
            "pilot_trend": pv.fits.get("trend_regime"), "full_trend": fv.fits.get("trend_regime"),
            "best": best, "best_ci": best_ci, "best_measured": meas[best],
            "in_range": _within(meas[best], b_lo, b_hi), "bounds": (b_lo, b_hi),
            # the candidate low-side rule, written down before the data it is judged on (candidate_range)
            "cand_range": (c_lo, c_hi), "cand_in_range": _within(meas[best], c_lo, c_hi),
            "cand_regret_pse": _in_se(best_mean - interpolate(on_axis, c_read), pse),
            "regret": best_mean - at_rec, "regret_se": _in_se(best_mean - at_rec, se), "regret_ci": regret_ci, "gain": gain, "gain_ci": gain_ci, "cost_one": pilot_flops / one_full,
            "cost_grid": pilot_flops / sum(p.flops.total for p in full_pilots),
            "collapses": collapses(full)}


def forecast_row(pilot: dict, full: dict, row: dict) -> dict[str, Any]:
    """The pilot grid's forecast at the full-run budget (race.stats.forecast) against the full runs;
    ``row``: the setting's ``setting_row`` (both grids' regimes, the pilot's best ρ, the full runs'
    best-ρ CI, best mean and pooled SE)."""
    from race.stats.forecast import forecast
    from race.core.records import Regime

    fc = forecast([(pilots_of(pilot), float(pilot["budget"]))], target="reward",
                  full_run_budget=float(full["budget"]), pilot_regime=Regime(row["pilot_regime"]),
                  pilot_best_rho=row["pilot_best_rho"])
    if fc.status == "refused":
        return {"status": "refused", "regime": None, "best": None, "same": None, "in_ci": None,
                "regret": float("nan"), "regret_pse": float("nan")}
    if not row["scored"]:               # collapsed full runs: no best ρ to find, no regret (scoring section)
        return {"status": fc.status, "regime": fc.regime.value, "best": fc.best_rho,
                "same": fc.regime.value == row["full"], "in_ci": None, "regret": float("nan"),
                "regret_pse": float("nan")}
    regret = row["best_mean"] - interpolate(point_means(full), fc.best_rho)
    return {"status": fc.status, "regime": fc.regime.value, "best": fc.best_rho,
            "same": fc.regime.value == row["full_regime"],
            "in_ci": row["best_ci"][0] <= fc.best_rho <= row["best_ci"][1],
            "regret": regret, "regret_pse": _in_se(regret, row["pse"])}


def adaptive_record(pilot: dict, share: float, policy: str = "informative") -> dict:
    """The pilot grid an adaptive study of ``share`` would have run, replayed on the pilot grid's own
    pilots (race.run.adaptive.adaptive_subset): the record with only those pilots, scored like any grid."""
    from race.run.adaptive import adaptive_subset
    pilots = pilots_of(pilot)
    by_key = {(p.rho_target, p.seed): p for p in pilots}
    grid = sorted({p.rho_target for p in pilots})
    seeds = max(p.seed for p in pilots) + 1

    def score(key):
        p = by_key[key]
        return sum(p.evals["reward"]) / len(p.evals["reward"])

    keys = set(adaptive_subset(policy, grid, seeds, score, share=share))
    return {**pilot, "pilots": [p for p in pilot["pilots"] if p.get("status") == "complete"
                                and (float(p["rho_target"]), int(p["seed"])) in keys]}


def ranking_by_budget(record: dict) -> list[tuple[float, float, float | None]]:
    """How the full runs rank ρ as their budget grows, from their held-out checkpoints: per
    checkpoint fraction f > 0 (the budget multiple f × the run's budget), the best ρ on the
    checkpoint prompts (mean over seeds) and the Spearman correlation of the ρ ranking with the
    end's (None when either is constant)."""
    from scipy.stats import spearmanr

    pilots = pilots_of(record)
    by_frac: dict[float, dict[float, list[float]]] = {}
    for p in pilots:
        for c in p.checkpoints:
            if c.fraction > 0:
                scores = c.evals["reward"]
                by_frac.setdefault(round(c.fraction, 4), {}).setdefault(p.rho_target, []).append(sum(scores) / len(scores))
    if not by_frac:
        return []
    end = {r: sum(v) / len(v) for r, v in by_frac[max(by_frac)].items()}
    out = []
    for f in sorted(by_frac):
        means = {r: sum(v) / len(v) for r, v in by_frac[f].items()}
        rhos = sorted(set(means) & set(end))
        xs, ys = [means[r] for r in rhos], [end[r] for r in rhos]
        corr = float(spearmanr(xs, ys).statistic) if len(set(xs)) > 1 and len(set(ys)) > 1 else None
        out.append((f, max(means, key=means.get), corr))
    return out


# ---------------------------------------------------------------- tables

def _fmt(x: float, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and x != x) else f"{x:.{digits}f}"


def _cls(r: dict, side: str) -> str:
    """A grid's class for the table: "unstable (k/n fell back; regime underneath)" or the regime."""
    k, n = r[f"{side}_unstable"]
    if r[side] == "unstable":
        return f"unstable ({k}/{n} fell back; {r[f'{side}_regime']} underneath)"
    if r[side] == "reward-heavy":       # agrees by construction through the FLOP share: show the trend scored
        return f"reward-heavy (trend underneath: {r[f'{side}_trend']})"
    return r[side]


def _yn(x: bool) -> str:
    return "yes" if x else "no"


def _scored(s: dict) -> dict | None:
    """Everything the tables compute for one setting with its pilot grid and full runs in (a process
    of the pool in ``tables``): its row with the forecast, the adaptive replays, the extended grid's row."""
    pilot, full = load_run(s["name"], "pilot"), load_run(s["name"], "full10")
    if not (pilot and full):
        return None
    row = setting_row(s, pilot, full)
    row["forecast"] = forecast_row(pilot, full, row)
    ext = load_run(s["name"], EXTENDED)
    long = load_run(s["name"], "full30")
    return {"row": row, "adaptive": {sh: setting_row(s, adaptive_record(pilot, sh), full) for sh in (0.5, 0.67)},
            "ext": setting_row(s, ext, full) if ext else None,
            "long": long_row(s, pilot, full, long) if long else None}


def long_row(s: dict, pilot: dict, full: dict, long: dict) -> dict[str, Any]:
    """The pilot verdict scored against the 30 × B full runs (``setting_row`` on them), with the
    10 × B best ρ among the same ρ beside it: does the best ρ keep moving as the budget grows?"""
    row = setting_row(s, pilot, long)
    long_rhos = sorted(point_means(long))
    same = {r: v for r, v in point_means(full).items() if any(abs(r - x) < 1e-9 for x in long_rhos)}
    row["best10_same_points"] = max(same, key=lambda r: sum(same[r]) / len(same[r])) if same else None
    row["long_rhos"] = long_rhos
    return row


def _score_all(settings: list[dict]) -> list[dict | None]:
    """``_scored`` per setting, on up to 2 processes (the forecasts' fits dominate: about 4 s a
    setting); the same numbers as one process, in the suite's order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if len(settings) < 2 or (os.cpu_count() or 1) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [_scored(s) for s in settings]
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_scored, settings))


def tables(suite: dict) -> str:
    """The Markdown tables of docs/validation.md, from research/validation/runs/ alone: one section
    function per heading, in the document's order."""
    progress, rows, adaptive, ext_rows, long_rows, loaded = _progress_and_scores(suite)
    lines = progress
    lines += ["", "### Per setting: the pilot verdict against the full runs (10×B)", ""] + per_setting_lines(rows)
    lines += ["", "### Over the suite", ""] + suite_lines(rows)
    lines += ["", "### The range open at a grid edge: before and after (adopted 2026-12-02)", ""] + edge_rule_lines(rows)
    lines += ["", "### Extending the pilot grid past its edge (`race pilot --extend 1`)", ""]
    lines += extension_lines(suite, rows, ext_rows)
    lines += ["", "### The forecast at the full-run budget (from the pilot grid's checkpoints)", ""] + forecast_lines(rows)
    lines += ["", "### The pilot verdict against the 30 × B full runs", ""]
    lines += long_lines(suite, long_rows)
    lines += ["", "### How the full runs rank ρ as their budget grows (held-out checkpoints)", ""] + ranking_lines(suite)
    lines += ["", "### Does a decaying learning rate remove the collapses, and move the best ρ?", ""] + decay_lines(suite)
    lines += ["", "### Adaptive grids (replayed on the pilot grids' own pilots)", ""] + adaptive_lines(adaptive)
    lines += ["", "### Wall time", ""] + wall_lines(suite, loaded)
    return "\n".join(lines) + "\n"


def _progress_and_scores(suite: dict) -> tuple[list[str], list[dict], list, dict[str, dict], list[dict], dict]:
    """The progress table's lines, and every setting scored once: (lines, per-setting rows, adaptive
    replays, extension rows, 30×B rows, the loaded records by setting and kind)."""
    lines = ["### Progress", "", "| setting | half | pilot grid (B) | full runs 10×B | full runs 30×B |", "|---|---|---|---|---|"]
    rows, adaptive, ext_rows, long_rows = [], [], {}, []
    loaded: dict[str, dict[str, dict | None]] = {}     # setting → kind → its record, read once
    for s, got in zip(suite["settings"], _score_all(suite["settings"])):
        recs = {k: load_run(s["name"], k) for k in (*KINDS, EXTENDED)}
        loaded[s["name"]] = recs
        cells = []
        for k in ROUND1_KINDS:
            if not planned(s, k):
                cells.append("—")
            elif recs[k] is None:
                part = data_path(s["name"], k, partial=True)
                if part.is_file():
                    with gzip.open(part, "rt", encoding="utf-8") as fh:
                        rec = json.load(fh)
                    cells.append(f"under way: {len(rec['pilots'])} pilots done ({rec['commit'][:7]})")
                else:
                    cells.append("not run")
            else:
                done = sum(1 for p in recs[k]["pilots"] if p.get("status") == "complete")
                cells.append(f"{done} pilots, {recs[k]['budget']:.3g} each ({recs[k]['commit'][:7]})")
        lines.append(f"| {s['name']} | {s['half']} | " + " | ".join(cells) + " |")
        if got:
            rows.append(got["row"])
            adaptive.append((s, got["adaptive"], got["row"]))
            if got["ext"]:
                ext_rows[s["name"]] = got["ext"]
            if got["long"]:
                long_rows.append(got["long"])
    return lines, rows, adaptive, ext_rows, long_rows, loaded


def per_setting_lines(rows: list[dict]) -> list[str]:
    """The pilot verdict against the 10×B full runs, one row per scored setting."""
    lines: list[str] = []
    if not rows:
        lines.append("No setting has both its pilot grid and its full runs yet.")
    else:
        lines += ["| setting | half | pilot verdict (range, confidence) | full-run verdict (confidence) | same regime "
                  "| full-run best ρ (95 % CI) | in range | regret (reward; pooled full-run SEs; the best point's SEs) | gain over on-policy "
                  "| pilot cost: of one full run; of the full grid | collapses per ρ | full-run support for the "
                  "pilot's regime |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            coll = ", ".join(f"{k:g}: {v}" for k, v in r["collapses"].items() if v) or "none"
            if r["scored"]:
                scores = (f"{r['best']:.2f} ({r['best_ci'][0]:.2f} … {r['best_ci'][1]:.2f}) | {_yn(r['in_range'])} | "
                          f"{r['regret']:.4f} ({r['regret_ci'][0]:.4f} … {r['regret_ci'][1]:.4f}); {_fmt(r['regret_pse'], 2)}; "
                          f"{_fmt(r['regret_se'], 2)} | {r['gain']:+.4f} ({r['gain_ci'][0]:+.4f} … {r['gain_ci'][1]:+.4f})")
            else:                       # collapsed full runs: no best ρ to find (scoring section)
                scores = "— (collapsed) | not scored | — | —"
            lines.append(
                f"| {r['setting']} | {r['half']} | {_cls(r, 'pilot')} {r['pilot_range_text']}, "
                f"{r['pilot_confidence']:.2f} | {_cls(r, 'full')} ({r['full_confidence']:.2f}) | "
                f"{'yes' if r['pilot'] == r['full'] else 'no'} | {scores} | {r['cost_one']:.1%}; {r['cost_grid']:.1%} | "
                f"{coll} | {_fmt(r['support'], 2) if r['scored'] else '—'} |")
    return lines


def suite_lines(rows: list[dict]) -> list[str]:
    """The scores over each half of the suite, the held-out half against its targets, the confusion table."""
    import statistics

    lines: list[str] = []
    summary: dict[str, dict[str, Any]] = {}
    for half in ("development", "held-out"):
        sel = [r for r in rows if r["half"] == half]
        n = len(sel)
        same = sum(r["pilot"] == r["full"] for r in sel)
        scored = [r for r in sel if r["scored"]]
        inr = sum(r["in_range"] for r in scored)
        lo, hi = wilson(same, n)
        regrets = sorted(r["regret_pse"] for r in scored if r["regret_pse"] == r["regret_pse"])
        med = statistics.median(regrets) if regrets else float("nan")
        m_lo, m_hi, m_cover = median_ci(regrets)
        in_lo, in_hi = wilson(inr, len(scored))
        beat = sum(r["gain"] > 0 for r in scored)
        b_lo, b_hi = wilson(beat, len(scored))
        closed = [r["closed_regret_pse"] for r in scored if r["closed_regret_pse"] == r["closed_regret_pse"]]
        med_closed = statistics.median(closed) if closed else float("nan")
        own = [r["regret_se"] for r in scored if r["regret_se"] == r["regret_se"]]
        med_own = statistics.median(own) if own else float("nan")
        inc = sum(r["pilot"] == "inconclusive" for r in sel)
        inc_right = sum(r["pilot"] == "inconclusive" and r["full"] == "inconclusive" for r in sel)
        firm = [r for r in sel if r["full"] != "inconclusive"]
        same_firm = sum(r["pilot"] == r["full"] for r in firm)
        f_lo, f_hi = wilson(same_firm, len(firm))
        heavy = [r for r in sel if "reward-heavy" in (r["pilot_regime"], r["full_regime"])]
        summary[half] = {"n": n, "same": same, "same_ci": (lo, hi), "scored": len(scored), "in_range": inr,
                         "in_ci": (in_lo, in_hi), "median": med, "median_ci": (m_lo, m_hi, m_cover), "beat": beat,
                         "beat_ci": (b_lo, b_hi), "beat_clear": sum(r["gain_ci"][0] > 0 for r in scored)}
        trend = (f"; reward-heavy settings: same trend underneath {sum(r['pilot_trend'] == r['full_trend'] for r in heavy)}"
                 f"/{len(heavy)}" if heavy else "")
        lines.append(f"- **{half}** ({n} settings complete): same regime {same}/{n} "
                     f"(95 % CI {lo:.2f} … {hi:.2f}){trend}; where the full runs are conclusive {same_firm}/{len(firm)} "
                     f"(95 % CI {f_lo:.2f} … {f_hi:.2f}); full-run best ρ in the recommended range {inr}/{len(scored)}"
                     f" (95 % CI {in_lo:.2f} … {in_hi:.2f}; "
                     f"{'' if len(scored) == n else f'of the {len(scored)} whose full runs did not collapse; '}"
                     f"before the edge rule: {sum(r['closed_in_range'] for r in scored)}/{len(scored)}); "
                     f"median regret {_fmt(med, 2)} pooled full-run SEs ({m_cover:.0%} CI {_fmt(m_lo, 2)} … {_fmt(m_hi, 2)}, "
                     f"order statistics; {_fmt(med_own, 2)} of the best point's own; "
                     f"before the edge rule: {_fmt(med_closed, 2)} pooled); "
                     f"following RACE beat the on-policy run in {beat}/{len(scored)} (95 % CI {b_lo:.2f} … {b_hi:.2f}; "
                     f"by more than one pooled SE in {sum(r['gain'] > r['pse'] for r in scored)}; its gain's "
                     f"95 % CI above zero in {sum(r['gain_ci'][0] > 0 for r in scored)}); "
                     f"pilot verdict inconclusive {inc}/{n} "
                     f"(full runs inconclusive too: {inc_right}); the full-run best ρ below the pilot grid's best "
                     f"in {sum(r['best'] < r['pilot_best_rho'] for r in scored)}/{len(scored)} (the same point in "
                     f"{sum(r['best'] == r['pilot_best_rho'] for r in scored)}, above in "
                     f"{sum(r['best'] > r['pilot_best_rho'] for r in scored)}).")
    lines += [""] + target_lines(summary.get("held-out"))
    regimes = ["search-heavy", "balanced", "update-heavy", "reward-heavy", "inconclusive", "unstable"]
    lines += ["", "Confusion (all complete settings; rows: pilot verdict, columns: full-run verdict):", "",
              "| pilot \\ full | " + " | ".join(regimes) + " |", "|---|" + "---|" * len(regimes)]
    for a in regimes:
        lines.append(f"| {a} | " + " | ".join(str(sum(r['pilot'] == a and r['full'] == b for r in rows))
                                              for b in regimes) + " |")
    return lines


def edge_rule_lines(rows: list[dict]) -> list[str]:
    """The range open at a grid edge, before and after, and the candidate low-side rule."""
    import statistics

    lines: list[str] = []
    if not rows:
        lines.append("No setting complete yet.")
    else:
        lines += ["A search-heavy verdict whose pilot-best point is the grid's lowest ρ recommends ρ ≤ its range's "
                  "top (update-heavy at the highest: ρ ≥ its bottom), and regret is read at that edge point "
                  "(race.stats.regime.open_side); before, every verdict named its closed range, read at the centre. "
                  "The last columns score the candidate low-side rule (not adopted; `candidate_range` in "
                  "research/scripts/validation.py): the range's lower bound moved down to the pilot grid's next point, "
                  "read at the new centre. It was written down after eleven settings' full runs (ten scored) had been "
                  "looked at, so only the settings marked *unseen* judge it.", "",
                  "| setting | half | range before → after | full-run best ρ in range (before; after) "
                  "| regret, pooled full-run SEs (before; after) | candidate range | in it | regret at its centre, "
                  "pooled SEs |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lo, hi = r["pilot_range"]
            rng = f"[{lo:.2f}, {hi:.2f}]" + (f" → {r['pilot_range_text']}" if r["open_side"] else " (unchanged)")
            c_lo, c_hi = r["cand_range"]
            cand = (f"ρ ≤ {c_hi:.2f}" if r["open_side"] == "below" else f"[{c_lo:.2f}, {c_hi:.2f}]"
                    + (" (unchanged)" if abs(c_lo - r["bounds"][0]) < 1e-12 else ""))
            seen = "" if r["setting"] in CANDIDATE_SEEN else " (unseen)"
            lines.append(f"| {r['setting']}{seen} | {r['half']} | {rng} | " + (
                f"{_yn(r['closed_in_range'])}; {_yn(r['in_range'])} | {_fmt(r['closed_regret_pse'], 2)}; "
                f"{_fmt(r['regret_pse'], 2)} | {cand} | {_yn(r['cand_in_range'])} | {_fmt(r['cand_regret_pse'], 2)} |"
                if r["scored"] else f"not scored | — | {cand} | not scored | — |"))
        lines.append("")
        for label, sel in (("seen when it was written", [r for r in rows if r["setting"] in CANDIDATE_SEEN]),
                           ("unseen", [r for r in rows if r["setting"] not in CANDIDATE_SEEN])):
            sc = [r for r in sel if r["scored"]]
            if not sc:
                lines.append(f"- Candidate, {label}: no scored setting yet.")
                continue
            med = statistics.median(r["regret_pse"] for r in sc)
            c_med = statistics.median(r["cand_regret_pse"] for r in sc)
            lines.append(f"- Candidate, {label} ({len(sc)} scored): full-run best ρ in range "
                         f"{sum(r['in_range'] for r in sc)}/{len(sc)} as adopted, {sum(r['cand_in_range'] for r in sc)}"
                         f"/{len(sc)} under the candidate; median regret {_fmt(med, 2)} → {_fmt(c_med, 2)} pooled SEs.")
    return lines


def forecast_lines(rows: list[dict]) -> list[str]:
    """The forecast from the pilot grid's checkpoints against the 10×B full runs."""
    lines: list[str] = []
    if not rows:
        lines.append("No setting complete yet.")
    else:
        lines += ["| setting | half | forecast | regime at 10×B | best ρ | same regime as the full runs "
                  "| best ρ in the full runs' CI | regret at its best ρ (reward; pooled full-run SEs) |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            f = r["forecast"]
            yn = {True: "yes", False: "no", None: "—"}
            lines.append(f"| {r['setting']} | {r['half']} | {f['status']} | {f['regime'] or '—'} | "
                         f"{'—' if f['best'] is None else format(f['best'], '.2f')} | {yn[f['same']]} | {yn[f['in_ci']]} | "
                         f"{_fmt(f['regret'], 4)}; {_fmt(f['regret_pse'], 2)} |")
        made = [r for r in rows if r["forecast"]["status"] != "refused"]
        lines.append("")
        lines.append(f"Forecasts made {len(made)}/{len(rows)}; same regime as the full runs "
                     f"{sum(bool(r['forecast']['same']) for r in made)}/{len(made)}; best ρ inside the full runs' "
                     f"CI {sum(bool(r['forecast']['in_ci']) for r in made)}/"
                     f"{sum(r['forecast']['in_ci'] is not None for r in made)} (settings whose full runs did not "
                     "collapse).")
    return lines


def ranking_lines(suite: dict) -> list[str]:
    """How the full runs rank ρ at each checkpoint, against the run's end."""
    lines: list[str] = []
    ranked = [(s["name"], k, load_run(s["name"], k)) for s in suite["settings"] for k in ("full10", "full30")
              if data_path(s["name"], k).is_file()]
    ranked = [(n, k, ranking_by_budget(rec)) for n, k, rec in ranked]
    ranked = [x for x in ranked if x[2]]
    if not ranked:
        lines.append("No full runs yet.")
    else:
        lines += ["Each cell: the best ρ on the checkpoint prompts (mean over seeds) at that share of the run, and "
                  "the Spearman correlation of the whole ρ ranking with the run's end. Budgets in units of the "
                  "setting's pilot budget B.", "",
                  "| setting | runs | " + " | ".join(f"checkpoint {i + 1}" for i in range(max(len(r) for _, _, r in ranked)))
                  + " |", "|---|---|" + "---|" * max(len(r) for _, _, r in ranked)]
        for name, kind, rk in ranked:
            mult = KINDS[kind]
            cells = [f"{f * mult:.2g}×B: {best:.2f} ({'—' if c is None else format(c, '+.2f')})" for f, best, c in rk]
            lines.append(f"| {name} | {kind} | " + " | ".join(cells) + " |")
    return lines


def decay_lines(suite: dict) -> list[str]:
    """Constant against decaying learning rate: collapses, best ρ and verdict per full-run budget."""
    lines: list[str] = []
    decay = [(s, setting(suite, s["decay_of"])) for s in suite["settings"] if s.get("decay_of")]
    if not decay:
        lines.append("No decay pair in the suite.")
    else:
        lines += ["| constant η | decaying η | full runs | collapses (constant; decay) | best ρ (constant; decay) "
                  "| full-run verdict (constant; decay) |", "|---|---|---|---|---|---|"]
        for d, c in decay:
            for kind in ("full10", "full30"):
                rc, rd = load_run(c["name"], kind), load_run(d["name"], kind)
                if rc is None and rd is None:
                    continue

                def cells(rec: dict | None, s: dict) -> tuple[str, str, str]:
                    """(collapses, best ρ, verdict) of one side; a grid the suite does not plan is not missing."""
                    if rec is None:
                        return ("not run" if planned(s, kind) else "not in the suite",) * 3
                    cls = grid_class(diagnosis(rec))   # a grid of collapsed runs has no best ρ (scoring section)
                    best = "— (collapsed)" if cls == "unstable" else f"{best_rho_ci(rec)[0]:.2f}"
                    return str(sum(collapses(rec).values())), best, cls
                sides = list(zip(cells(rc, c), cells(rd, d)))
                lines.append(f"| {c['name']} | {d['name']} | {kind} | " + " | ".join(f"{x}; {y}" for x, y in sides) + " |")
    return lines


def adaptive_lines(adaptive: list) -> list[str]:
    """Adaptive grids replayed on the pilot grids' own pilots, per setting and per half."""
    import statistics

    lines: list[str] = []
    if not adaptive:
        lines.append("No setting complete yet.")
    else:
        lines += ["Each cell: verdict (range); full-run best ρ in that range; regret at its recommended ρ in pooled "
                  "full-run SEs; the grid's cost as a share of one full run.", "",
                  "| setting | full pilot grid | adaptive 0.5 | adaptive 0.67 | full runs |", "|---|---|---|---|---|"]

        def cell(r: dict) -> str:
            scores = f"{_yn(r['in_range'])}; {_fmt(r['regret_pse'], 2)}" if r["scored"] else "not scored"
            return f"{r['pilot']} ({r['pilot_range_text']}); {scores}; {r['cost_one']:.0%}"

        for s, regs, r in adaptive:
            lines.append(f"| {s['name']} | {cell(r)} | {cell(regs[0.5])} | {cell(regs[0.67])} | {r['full']} |")
        lines.append("")
        for half in ("development", "held-out"):
            sel = [(regs, r) for s, regs, r in adaptive if s["half"] == half]
            if not sel:
                continue
            grids = [("full pilot grid", [r for _, r in sel])] + [(f"share {sh}", [regs[sh] for regs, _ in sel])
                                                                  for sh in (0.5, 0.67)]
            parts = []
            for label, rs in grids:
                scored = [g for g in rs if g["scored"]]
                regrets = [g["regret_pse"] for g in scored if g["regret_pse"] == g["regret_pse"]]
                parts.append(f"{label}: same regime {sum(g['pilot'] == g['full'] for g in rs)}/{len(rs)}, "
                             f"in range {sum(g['in_range'] for g in scored)}/{len(scored)}, median regret "
                             f"{_fmt(statistics.median(regrets), 2) if regrets else '—'} pooled SEs, cost "
                             f"{statistics.median(g['cost_one'] for g in rs):.0%} of a full run (median)")
            lines.append(f"- **{half}**: " + "; ".join(parts) + "; same verdict as the full pilot grid — " + ", ".join(
                f"share {sh}: {sum(regs[sh]['pilot'] == r['pilot'] for regs, r in sel)}/{len(sel)}"
                for sh in (0.5, 0.67)) + ".")
    return lines


def target_lines(h: dict[str, Any] | None) -> list[str]:
    """The issue's targets against the held-out half's measurement (``h``: its summary from ``tables``)."""
    if not h or not h["n"]:
        return ["The issue's targets, on the held-out half: no held-out setting complete yet."]

    def met(ok: bool) -> str:
        return "met" if ok else "missed"
    m_lo, m_hi, cover = h["median_ci"]
    rate_in = h["in_range"] / h["scored"] if h["scored"] else float("nan")
    return ["The issue's targets, on the held-out half:", "",
            "| target | goal | measured (CI) | |", "|---|---|---|---|",
            f"| same regime | ≥ 0.9 | {h['same']}/{h['n']} = {h['same'] / h['n']:.2f} (95 % {h['same_ci'][0]:.2f} … "
            f"{h['same_ci'][1]:.2f}) | {met(h['same'] / h['n'] >= 0.9)} |",
            f"| full-run best ρ in the recommended range | ≥ 80 % | {h['in_range']}/{h['scored']} = {rate_in:.0%} (95 % "
            f"{h['in_ci'][0]:.2f} … {h['in_ci'][1]:.2f}) | {met(rate_in >= 0.8)} |",
            f"| median regret | ≤ 1 full-run SE | {_fmt(h['median'], 2)} pooled SEs ({cover:.0%} {_fmt(m_lo, 2)} … "
            f"{_fmt(m_hi, 2)}) | {met(h['median'] <= 1)} |",
            f"| following RACE beats on-policy | reported | {h['beat']}/{h['scored']} (95 % {h['beat_ci'][0]:.2f} … "
            f"{h['beat_ci'][1]:.2f}; its gain's CI above zero in {h['beat_clear']}) | — |"]


def wall_lines(suite: dict, loaded: dict[str, dict[str, dict | None]]) -> list[str]:
    """Wall time per committed grid: each run's own time (its ``wall_seconds`` phases summed: setup,
    rollout, reward, update, sync, evaluation, checkpoints), median and total, and the wall of the
    command that finished the grid (a resumed grid counts only its last invocation). An extended
    grid counts only the runs it added (its imported pilots are the pilot grid's). ``loaded``: each
    setting's records by kind, as ``tables`` read them."""
    import statistics

    out = ["| setting | grid | runs | one run, median (min) | all runs (core-hours) | wall of the finishing command (min) |",
           "|---|---|---|---|---|---|"]
    total = 0.0
    for s in suite["settings"]:
        for kind in (*KINDS, EXTENDED):
            rec = loaded[s["name"]][kind]
            if rec is None:
                continue
            base = set(loaded[s["name"]]["pilot"]["grid"]) if kind == EXTENDED else set()
            runs = [sum(p["wall_seconds"].values()) for p in rec["pilots"]       # an extension: its own runs only
                    if p.get("wall_seconds") and p["rho_target"] not in base]
            if not runs:
                continue
            total += sum(runs)
            out.append(f"| {s['name']} | {kind} | {len(runs)} | {statistics.median(runs) / 60:.1f} | "
                       f"{sum(runs) / 3600:.2f} | {rec['wall_seconds'] / 60:.0f} |")
    out += ["", f"All committed runs: {total / 3600:.1f} core-hours (one run is one process on one core; "
                "two ran at a time, often beside other work, so a run's time depends on the load it met)."]
    return out


def long_lines(suite: dict, long_rows: list[dict]) -> list[str]:
    """The 30 × B table: per setting with a ``long_grid``, its full runs' verdict and best ρ against
    the pilot's range (as adopted, and the candidate low-side rule's) and the 10 × B best ρ."""
    wanted = [s["name"] for s in suite["settings"] if s.get("long_grid")]
    if not wanted:
        return ["No setting has a 30 × B grid."]
    out = ["| setting | half | ρ at 30×B | full-run verdict at 30×B (confidence) | best ρ at 30×B (95 % CI) "
           "| best ρ at 10×B, same points | in the pilot's range (adopted; candidate) | regret at the pilot's "
           "recommended ρ, pooled 30×B SEs (adopted; candidate) | collapses per ρ |",
           "|---|---|---|---|---|---|---|---|---|"]
    by_name = {r["setting"]: r for r in long_rows}
    for s in suite["settings"]:
        if s["name"] not in wanted:
            continue
        r = by_name.get(s["name"])
        if r is None:
            out.append(f"| {s['name']} | {s['half']} | " + ", ".join(f"{x:g}" for x in s["long_grid"])
                       + " | not run | — | — | — | — | — |")
            continue
        coll = ", ".join(f"{k:g}: {v}" for k, v in r["collapses"].items() if v) or "none"
        b10 = "—" if r["best10_same_points"] is None else f"{r['best10_same_points']:.2f}"
        out.append(f"| {r['setting']} | {r['half']} | {', '.join(f'{x:g}' for x in r['long_rhos'])} | "
                   f"{_cls(r, 'full')} ({r['full_confidence']:.2f}) | "
                   + (f"{r['best']:.2f} ({r['best_ci'][0]:.2f} … {r['best_ci'][1]:.2f}) | {b10} | "
                      f"{_yn(r['in_range'])}; {_yn(r['cand_in_range'])} | {_fmt(r['regret_pse'], 2)}; "
                      f"{_fmt(r['cand_regret_pse'], 2)} | " if r["scored"] else f"— (collapsed) | {b10} | not scored | — | ")
                   + f"{coll} |")
    return out


def extension_lines(suite: dict, rows: list[dict], ext_rows: dict[str, dict]) -> list[str]:
    """The extended pilot grids (``EXTENDED``) scored like the pilot grids, beside them
    (``ext_rows``: their rows against the full runs, by setting)."""
    import statistics

    done = {r["setting"]: r for r in rows}
    ext = [(s, load_run(s["name"], EXTENDED)) for s in suite["settings"]]
    ext = [(s, rec) for s, rec in ext if rec is not None]
    if not ext:
        return ["No pilot grid has been extended yet (`python research/scripts/validation.py extend SETTINGS`)."]
    out = ["Pilot grids whose best point is an edge, run again with `--extend 1`: their pilots imported, the "
           "next point past the edge run (3 seeds); scored against the same full runs. Cells: pilot grid; "
           "extended grid.", "",
           "| setting | half | added ρ | extended verdict (range, confidence) | same regime | full-run best ρ in range "
           "| regret, pooled full-run SEs | extra cost (of the pilot grid) |", "|---|---|---|---|---|---|---|---|"]
    scored = []
    for s, rec in ext:
        pilot = load_run(s["name"], "pilot")
        added = sorted(set(rec["grid"]) - set(pilot["grid"]))
        extra = (sum(p.flops.total for p in pilots_of(rec)) / sum(p.flops.total for p in pilots_of(pilot)) - 1)
        v = verdict(rec)
        head = (f"| {s['name']} | {s['half']} | {', '.join(f'{a:g}' for a in added) or '—'} | "
                f"{grid_class(diagnosis(rec))} {v.range_text()}, {v.confidence:.2f} | ")
        if s["name"] not in done or s["name"] not in ext_rows:
            out.append(head + "full runs not in yet | — | — | " + f"{extra:+.0%} |")
            continue
        r, e = done[s["name"]], ext_rows[s["name"]]
        if e["scored"]:                 # collapsed full runs have no best ρ (scoring section)
            scored.append((r, e))
        out.append(head + f"{_yn(r['pilot'] == r['full'])}; {_yn(e['pilot'] == e['full'])} | " + (
            f"{_yn(r['in_range'])}; {_yn(e['in_range'])} | {_fmt(r['regret_pse'], 2)}; {_fmt(e['regret_pse'], 2)} | "
            if e["scored"] else "not scored | — | ") + f"{extra:+.0%} |")
    out.append("")
    for half in ("development", "held-out"):
        sel = [(r, e) for r, e in scored if r["half"] == half]
        if not sel:
            continue
        med = {k: statistics.median([x["regret_pse"] for x in (r if k == 0 else e for r, e in sel)])
               for k in (0, 1)}
        out.append(f"- **{half}** ({len(sel)} extended): same regime {sum(r['pilot'] == r['full'] for r, _ in sel)}"
                   f" → {sum(e['pilot'] == e['full'] for _, e in sel)}; full-run best ρ in range "
                   f"{sum(r['in_range'] for r, _ in sel)} → {sum(e['in_range'] for _, e in sel)}; median regret "
                   f"{_fmt(med[0], 2)} → {_fmt(med[1], 2)} pooled full-run SEs (pilot grid → extended grid).")
    return out


def split_tables(text: str) -> dict[tuple[str, str], str]:
    """Round 1's tables as two blocks: the summary (progress, per setting, over the suite) for
    docs/validation.md and the rest for research/validation-log.md: ``text`` cut before the
    detail block's first heading, each block byte-identical to its part."""
    cut = text.index("\n" + DETAIL_FROM) + 1
    return {(BEGIN, END): text[:cut].rstrip("\n") + "\n", DETAIL: text[cut:]}


def _doc_tables(text: str, begin: str = BEGIN, end: str = END) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"the doc has no {begin} … {end} block")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def section_tables(sections) -> str:
    """The doc block of ``sections`` ((heading, lines function) pairs): each as ``#### heading``, its
    lines and a blank line, with the fits' warnings silenced."""
    import warnings

    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for head, fn in sections:
            lines += [f"#### {head}", "", *fn(), ""]
    return "\n".join(lines)


def doc_command(argv: Sequence[str] | None, text_fn, begin: str, end: str, script: str) -> int:
    """``tables [--check DOC | --write DOC]`` of a research script whose doc block lies between
    ``begin`` and ``end``: print ``text_fn()``, exit 1 when DOC's block differs from it, or rewrite it."""
    ap = argparse.ArgumentParser(prog=f"{script} tables")
    ap.add_argument("--check", default=None, help="exit 1 if this doc's block differs from the committed data's")
    ap.add_argument("--write", default=None, help="rewrite this doc's block")
    args = ap.parse_args(argv)
    text = text_fn()
    if args.check:
        doc = Path(args.check).read_text(encoding="utf-8")
        if begin not in doc or _doc_tables(doc, begin, end) != text:
            sys.stderr.write(f"{args.check}: the tables differ from what the committed data gives; run: "
                             f"python {script} tables --write {args.check}\n")
            return 1
    elif args.write:
        doc = Path(args.write).read_text(encoding="utf-8")
        head, rest = doc.split(begin, 1)
        Path(args.write).write_text(head + begin + "\n" + text + end + rest.split(end, 1)[1], encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status")
    sn = sub.add_parser("snapshot", help="commit-ready partial data of grids under way")
    sn.add_argument("--pin", default=str(ROOT))
    sn.add_argument("--storage", default=os.environ.get("RACE_VALIDATION_RUNS", "/work/validation-runs"))
    r = sub.add_parser("run")
    r.add_argument("setting")
    r.add_argument("kind")
    q = sub.add_parser("queue")
    q.add_argument("--kinds", default=None, help="comma-separated kinds (default: pilot,full10,full30; a suite "
                   "with its own kinds: all of them, in its order)")
    q.add_argument("--half", default=None)
    q.add_argument("--only", default=None, help="comma-separated settings")
    for p in (r, q):
        p.add_argument("--pin", default=str(ROOT), help="the pinned checkout the grids run from")
        p.add_argument("--storage", default=os.environ.get("RACE_VALIDATION_RUNS", "/work/validation-runs"))
    x = sub.add_parser("extend", help="race pilot --extend 1 on committed pilot grids whose best is at an edge")
    x.add_argument("settings", help="comma-separated settings")
    x.add_argument("--pin", default=str(ROOT), help="the pinned checkout the extension runs from")
    x.add_argument("--storage", default=os.environ.get("RACE_VALIDATION_RUNS", "/work/validation-runs"))
    a = sub.add_parser("adopt", help="compact a grid already run (its results.json) into research/validation/runs/")
    a.add_argument("setting")
    a.add_argument("kind", choices=list(KINDS))
    a.add_argument("results")
    a.add_argument("--commit", required=True)
    a.add_argument("--command", required=True)
    a.add_argument("--wall-seconds", type=float, default=0.0)
    fz = sub.add_parser("freeze", help="round 2: record the commits of the rule, drift model and probe scored")
    for k in ("rule", "drift", "probe"):
        fz.add_argument(f"--{k}", required=True)
    t = sub.add_parser("tables")
    t.add_argument("--check", default=None)
    t.add_argument("--write", default=None)
    ap.add_argument("--suite", default=str(SUITE))
    ap.add_argument("--runs", default=None, help="the committed data (default: the suite's `runs`, else "
                    "research/validation/runs)")
    return ap


def _queue(args: argparse.Namespace, suite: dict) -> None:
    """queue: every planned grid of ``--kinds`` not yet finished, one at a time, from ``--pin``."""
    kinds = args.kinds.split(",") if args.kinds else (kinds_of(suite) if suite.get("kinds")
                                                       else ["pilot", "full10", "full30"])
    only = set(args.only.split(",")) if args.only else None
    for kind in kinds:
        for s in suite["settings"]:
            if (only and s["name"] not in only) or (args.half and s.get("half") != args.half):
                continue
            if not planned(s, kind, suite):
                continue
            if finished(suite, s, kind):
                continue
            if s["base"] != "default" and not (Path(args.pin) / s["base"]).is_file():
                print(f"{time.strftime('%H:%M:%S')} {s['name']} {kind} skipped: the pin {args.pin} predates its "
                      f"base config {s['base']} (run it from a newer pin with --only {s['name']})", flush=True)
                continue
            print(f"{time.strftime('%H:%M:%S')} {s['name']} {kind} …", flush=True)
            try:
                path = run(s["name"], kind, pin=Path(args.pin), suite=suite, storage_root=Path(args.storage))
                print(f"{time.strftime('%H:%M:%S')} {s['name']} {kind} → {path}", flush=True)
            except SystemExit as e:
                print(f"{time.strftime('%H:%M:%S')} {s['name']} {kind} failed: {e}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    global RUNS
    args = _parser().parse_args(argv)
    suite = load_suite(Path(args.suite))
    RUNS = Path(args.runs) if args.runs else (ROOT / suite["runs"] if suite.get("runs") else RUNS)
    if getattr(args, "storage", None) and suite.get("storage_subdir") and "--storage" not in (argv or sys.argv):
        args.storage = str(Path(args.storage) / suite["storage_subdir"])     # a round's own storage folder
    if args.cmd == "status":
        for s in suite["settings"]:
            have = [k for k in kinds_of(suite) if data_path(s["name"], k).is_file()]
            part = [k for k in kinds_of(suite) if data_path(s["name"], k, partial=True).is_file()]
            print(f"{s['name']:<16} {s.get('half', ''):<12} done: {', '.join(have) or '—'}"
                  + (f"; partial: {', '.join(part)}" if part else ""))
        return 0
    if args.cmd == "run":
        if args.kind not in kinds_of(suite):
            raise SystemExit(f"kind {args.kind!r} is unknown: expected one of {', '.join(kinds_of(suite))}")
        print(run(args.setting, args.kind, pin=Path(args.pin), suite=suite, storage_root=Path(args.storage)))
        return 0
    if args.cmd == "extend":
        for name in args.settings.split(","):
            if data_path(name, EXTENDED).is_file():
                print(f"{name}: {data_path(name, EXTENDED)} is committed already")
                continue
            path = run_extension(name, pin=Path(args.pin), suite=suite, storage_root=Path(args.storage))
            print(f"{time.strftime('%H:%M:%S')} {name}: " + (str(path) if path else "best point inside the grid: "
                                                              "nothing to extend"), flush=True)
        return 0
    if args.cmd == "snapshot":
        for path in snapshot(suite, Path(args.storage), Path(args.pin)):
            print(path)
        return 0
    if args.cmd == "adopt":
        results = json.loads(Path(args.results).read_text())
        print(write_record(make_record(setting(suite, args.setting), args.kind, suite, results, commit=args.commit,
                                       command=args.command, wall_seconds=args.wall_seconds)))
        return 0
    if args.cmd == "queue":
        _queue(args, suite)
        return 0
    if suite.get("round", 1) >= 3:
        if args.cmd == "freeze" or suite.get("freeze"):
            raise SystemExit(f"round {suite['round']}: its freeze and scores are research/scripts/validation_round3.py's "
                             f"(python research/scripts/validation_round3.py --suite {args.suite} {args.cmd})")
        raise SystemExit(f"round {suite['round']} is sealed: no table reads its grids before its freeze "
                         "(`status` says which grids are committed)")
    if suite.get("round") == 2 and args.cmd in ("tables", "freeze"):
        raise SystemExit(f"round 2's {args.cmd} is research/scripts/validation_round2.py's: "
                         f"python research/scripts/validation_round2.py --suite {args.suite} {args.cmd} …")
    if args.cmd == "freeze":
        raise SystemExit("freeze: only a sealed suite is frozen (round 2: research/scripts/validation_round2.py)")
    text = tables(suite)
    return apply_tables(text, split_tables(text), check=args.check, write=args.write, suite_arg=args.suite,
                        script="research/scripts/validation.py")


def apply_tables(text: str, blocks: dict, *, check: str | None, write: str | None, suite_arg: str, script: str) -> int:
    """Print a suite's tables ``text``, or check / rewrite its blocks (``{(begin, end): text}``) in a
    document (``check``: exit 1 when they differ from what the committed data gives; ``write``: replace them)."""
    for target in (check, write):
        if target and not any(b in Path(target).read_text() for b, _ in blocks):
            raise SystemExit(f"{target}: no table block of this suite ({', '.join(b for b, _ in blocks)})")
    if check:
        doc = Path(check).read_text()
        for (begin, end), want in blocks.items():
            if begin in doc and _doc_tables(doc, begin, end) != want:
                sys.stderr.write(f"{check}: the tables differ from what {RUNS.relative_to(ROOT) if RUNS.is_relative_to(ROOT) else RUNS} gives; "
                                 f"run: python {script} --suite {suite_arg} tables --write {check}\n")
                return 1
        return 0
    if write:
        path = Path(write)
        doc = path.read_text()
        for (begin, end), want in blocks.items():
            if begin in doc:
                head, rest = doc.split(begin, 1)
                doc = head + begin + "\n" + want + end + rest.split(end, 1)[1]
        path.write_text(doc)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
