"""The second validation round (issue 31): its tables, its seal and its freeze.

    python scripts/validation.py --suite validation/round2.yaml status
    python scripts/validation.py --suite validation/round2.yaml queue --pin DIR --kinds pilot
    python scripts/validation.py --suite validation/round2.yaml tables --check docs/validation.md
    python scripts/validation.py --suite validation/round2.yaml freeze --rule C --drift C --probe C

The batch (``validation/round2.yaml``) runs through the same machinery as the first round
(scripts/validation.py: pinned checkout, storage outside the tree, compact records, partial
snapshots); this module holds what differs:

- **The seal.** Every grid of a kind listed under the suite's ``sealed`` (the full runs) stays out
  of every table and printout while the suite's ``freeze`` is unset: ``load_visible`` returns None
  for it, and the progress table shows only how many of its runs are done. Pilot grids are open:
  they are what RACE sees before a full run.
- **The replacement rule** (``learned``, race.checkpoints.learned): a pilot grid learned something
  when some point's mean gain over the base policy (held-out reward on the checkpoint prompts, final
  against step 0, paired by seed) exceeds both 2 of its seed SEs and 0.01.
- **The freeze** (``freeze``): records, once, the commits of the rule, the budget-drift model and
  the stability probe to be scored; only then are the sealed grids read.

Invariant: nothing here reads a sealed grid's pilots while the suite is unfrozen (``load_visible``
is the only loader the tables use, and the progress counts read the pilot statuses only through
``count_runs``, which returns numbers).
"""
from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- validation:round2:begin -->", "<!-- validation:round2:end -->"


def _v():
    import validation as v          # scripts/ is on sys.path when run as scripts/validation.py

    return v


def load_visible(suite: dict, name: str, kind: str, *, partial: bool = False) -> dict | None:
    """A committed grid's record, or None when it is absent or sealed."""
    v = _v()
    if v.sealed(suite, kind):
        return None
    path = v.data_path(name, kind, partial=partial)
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def count_runs(path: Path) -> int:
    """How many runs a compact record holds, read as numbers only (the seal: no values)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rec = json.load(fh)
    return sum(1 for p in rec.get("pilots", []) if p.get("status") == "complete")


def planned_runs(suite: dict, s: dict, kind: str) -> int:
    v = _v()
    return len(s[v.GRID_KEYS[kind]]) * v.seeds_of(suite, kind)


def learned(record: dict) -> tuple[bool, float, float]:
    """(learned?, the best point's mean gain, its seed SE): race.checkpoints.learned, the rule the
    report's "nothing learned" advice uses (the replacement rule of validation/round2.yaml)."""
    from race.checkpoints import learned as grid_learned

    return grid_learned(_v().pilots_of(record), "reward") or (False, float("nan"), float("nan"))


def progress_lines(suite: dict) -> list[str]:
    v = _v()
    kinds = [k for k in v.KINDS if any(v.planned(s, k) for s in suite["settings"])]
    head = {"pilot": "pilot grid (B)", "full10": "full runs 10×B", "full30": "full runs 30×B",
            "full100": "full runs 100×B"}
    out = ["| setting | B | " + " | ".join(head[k] for k in kinds) + " |", "|---|---|" + "---|" * len(kinds)]
    for s in suite["settings"]:
        cells = []
        for k in kinds:
            if not v.planned(s, k):
                gone = (f"replaced by {s['replaced_by']}" if s.get("replaced_by") else
                        f"dropped: {s['dropped']}" if s.get("dropped") else "—")
                cells.append(gone if k == "full10" else "—")
                continue
            want = planned_runs(suite, s, k)
            done_path, part_path = v.data_path(s["name"], k), v.data_path(s["name"], k, partial=True)
            if done_path.is_file():
                n = count_runs(done_path)
                with gzip.open(done_path, "rt", encoding="utf-8") as fh:
                    commit = json.load(fh).get("commit", "")[:7]
                cells.append(f"{n}/{want} runs ({commit})" + (", sealed" if v.sealed(suite, k) else ""))
            elif part_path.is_file():
                cells.append(f"under way: {count_runs(part_path)}/{want}" + (", sealed" if v.sealed(suite, k) else ""))
            else:
                cells.append(f"0/{want}")
        out.append(f"| {s['name']} | {float(s['pilot_budget']):.3g} | " + " | ".join(cells) + " |")
    return out


def pilot_lines(suite: dict) -> list[str]:
    """The pilot verdicts (open: what RACE sees before a full run) and the replacement rule."""
    v = _v()
    out = ["| setting | pilot verdict (range, confidence) | pilot-best ρ | best gain over the base (seed SE) | "
           "learned (replacement rule) | pilots fell back |", "|---|---|---|---|---|---|"]
    for s in suite["settings"]:
        rec = load_visible(suite, s["name"], "pilot")
        if rec is None:
            out.append(f"| {s['name']} | not run | | | | |")
            continue
        diag = v.diagnosis(rec)
        ok, gain, se = learned(rec)
        means = {r: statistics.fmean(x) for r, x in v.point_means(rec).items()}
        best = max(means, key=means.get)
        fell, n = v._fallen(diag)
        out.append(f"| {s['name']} | {v.grid_class(diag)} {diag.primary.range_text()}, {diag.primary.confidence:.2f} | "
                   f"{best:g} | "
                   f"{gain:+.4f} ({se:.4f}) | {'yes' if ok else '**no**: replace'} | {fell}/{n} |")
    return out


def tables(suite: dict) -> str:
    lines = ["### Round 2: progress", "", *progress_lines(suite), "",
             "### Round 2: the pilot grids (open)", "", *pilot_lines(suite), ""]
    if suite.get("freeze"):
        f = suite["freeze"]
        lines += ["### Round 2: frozen", "", f"Frozen on {f['date']} at rule {f['rule'][:7]}, drift model "
                  f"{f['drift'][:7]}, stability probe {f['probe'][:7]}.", ""]
    else:
        lines += ["The full-run grids are **sealed**: their results enter no table until the rule, the "
                  "budget-drift model and the stability probe to be scored are frozen "
                  "(`scripts/validation.py --suite validation/round2.yaml freeze`).", ""]
    return "\n".join(lines)


def freeze(suite_path: Path, *, rule: str, drift: str, probe: str, date: str | None = None) -> dict:
    """Write the suite's ``freeze`` mapping once (the commits scored); refuse a second freeze."""
    text = suite_path.read_text(encoding="utf-8")
    if not re.search(r"^freeze: null\b", text, flags=re.M):
        raise SystemExit(f"{suite_path}: already frozen (its `freeze:` line is not null); a change after "
                         "the freeze is reported as 'after unsealing', beside the frozen scores")
    for label, c in (("rule", rule), ("drift", drift), ("probe", probe)):
        if not re.fullmatch(r"[0-9a-f]{7,40}", c):
            raise SystemExit(f"--{label} {c!r} is not a commit: expected 7–40 hex digits")
    f = {"rule": rule, "drift": drift, "probe": probe,
         "date": date or _dt.datetime.now(_dt.timezone.utc).date().isoformat()}
    line = "freeze: {" + ", ".join(f"{k}: '{x}'" for k, x in f.items()) + "}"
    suite_path.write_text(re.sub(r"^freeze: null\b.*$", line, text, count=1, flags=re.M), encoding="utf-8")
    return f
