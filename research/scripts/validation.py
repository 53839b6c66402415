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
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the suite, the statistics and the tables live beside this file; every name stays reachable as validation.NAME
from validation_stats import (RHO_TOL, _MEMO, _fallen, _in_se, _memo, _within,  # noqa: E402,F401
                              adaptive_record, best_rho_ci, boot_means, candidate_range, collapses, diagnosis,
                              forecast_row, grid_class, interpolate, measured_rho, median_ci, pilots_of,
                              point_means, ranking_by_budget, regret_gain_ci, setting_row, verdict, wilson)
from validation_io import read_gz_json, write_gz_json  # noqa: E402,F401
from validation_suite import (EXTENDED, GRID_KEYS, KINDS, N_BOOT, ROUND1_KINDS, SUITE, _merge, _round,  # noqa: E402,F401
                              budget_of, compact_pilot, grid_config, grid_of, kinds_of, load_suite, planned, sealed,
                              seeds_of, setting)
from validation_tables import (BEGIN, CANDIDATE_SEEN, DETAIL, DETAIL_FROM, END, _cls, _doc_tables,  # noqa: E402,F401
                               _fmt, _yn, adaptive_lines, doc_command, edge_rule_lines, forecast_lines, long_lines,
                               long_row, per_setting_lines, section_tables, split_tables, suite_lines, target_lines,
                               wall_lines)

RUNS = ROOT / "research" / "validation" / "runs"          # research/scripts/validation.py --runs DIR changes it (tests)


# ---------------------------------------------------------------- the committed data


def wants_more(suite: dict, s: dict, kind: str) -> bool:
    """Whether a committed complete grid has fewer seeds than the suite now plans for it (``more_seeds``):
    the queue then resumes it from its committed pilots and runs only the added seeds."""
    rec = load_run(s["name"], kind)
    return rec is not None and int(rec.get("seeds", 0)) < seeds_of(suite, kind, s)


def finished(suite: dict, s: dict, kind: str) -> bool:
    """Whether grid ``kind`` of setting ``s`` is committed complete with every seed the suite plans:
    nothing left for the queue to run, or for a snapshot to take."""
    return data_path(s["name"], kind).is_file() and not wants_more(suite, s, kind)


# race.stats.drift's population drift and between-setting SD at round 2's freeze (f6862b9, round 1's 11
# settings): round 2's frozen rule and both rounds' rate runs are scored with them, whatever race.stats.drift
# carries now (research/scripts/validation_round2.py, stability.py)
FROZEN_POPULATION = (-0.055, 0.052)

RUNS_OF: dict[str, Path] = {}     # a setting's committed data where it is not under RUNS (several rounds read at once)


def data_path(name: str, kind: str, *, partial: bool = False) -> Path:
    return RUNS_OF.get(name, RUNS) / name / f"{kind}{'.partial' if partial else ''}.json.gz"


def provenance(results: dict, *, commit: str, command: str, wall_seconds: float) -> dict:
    """What every committed run record says of how it was made: the pin's commit, the command, its wall time,
    when, the config and the software the run reported (a results.json's ``results``)."""
    return {"commit": commit, "command": command, "wall_seconds": round(wall_seconds, 1),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": results.get("config"),
            "software": (results.get("diagnosis") or {}).get("meta", {}).get("software")}


def write_record(record: dict, *, partial: bool = False) -> Path:
    return write_gz_json(data_path(record["setting"], record["kind"], partial=partial), record)


def make_record(s: dict, kind: str, suite: dict, results: dict, *, commit: str, command: str,
                wall_seconds: float) -> dict:
    budget = budget_of(s, kind, suite)
    grid = sorted({p["rho_target"] for p in results["pilots"]})
    return {"setting": s["name"], "kind": kind, "half": s.get("half", "held-out"), "budget": budget, "grid": grid,
            "seeds": seeds_of(suite, kind, s), "on_policy": s.get("on_policy"),
            **provenance(results, commit=commit, command=command, wall_seconds=wall_seconds),
            "pilots": [compact_pilot(p) for p in results["pilots"]]}


def load_run(name: str, kind: str) -> dict | None:
    return read_gz_json(data_path(name, kind))


# ---------------------------------------------------------------- running a grid

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
    t.add_argument("--check", default=None, nargs="+", help="exit 1 if a block of these docs differs from the data's")
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


def apply_tables(text: str, blocks: dict, *, check: str | Sequence[str] | None, write: str | None, suite_arg: str,
                 script: str) -> int:
    """Print a suite's tables ``text``, or check / rewrite its blocks (``{(begin, end): text}``) in a
    document (``check``: one document or several, exit 1 when a block differs from what the committed data gives;
    ``write``: replace them)."""
    checks = [check] if isinstance(check, str) else list(check or [])
    for target in (*checks, write):
        if target and not any(b in Path(target).read_text() for b, _ in blocks):
            raise SystemExit(f"{target}: no table block of this suite ({', '.join(b for b, _ in blocks)})")
    for target in checks:
        doc = Path(target).read_text()
        for (begin, end), want in blocks.items():
            if begin in doc and _doc_tables(doc, begin, end) != want:
                sys.stderr.write(f"{target}: the tables differ from what {RUNS.relative_to(ROOT) if RUNS.is_relative_to(ROOT) else RUNS} gives; "
                                 f"run: python {script} --suite {suite_arg} tables --write {target}\n")
                return 1
    if checks:
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
