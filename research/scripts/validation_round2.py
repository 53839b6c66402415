"""The second validation round (issue 31): its tables, its seal and its freeze.

    python research/scripts/validation.py --suite research/validation/round2.yaml status
    python research/scripts/validation.py --suite research/validation/round2.yaml queue --pin DIR --kinds pilot
    python research/scripts/validation_round2.py tables --check docs/validation.md
    python research/scripts/validation_round2.py freeze --rule C --drift C --probe C

The batch (``research/validation/round2.yaml``) runs through the same machinery as the first round
(research/scripts/validation.py: pinned checkout, storage outside the tree, compact records, partial
snapshots); this module holds what differs:

- **The seal.** Every grid of a kind listed under the suite's ``sealed`` (the full runs) stays out
  of every table and printout while the suite's ``freeze`` is unset: ``load_visible`` returns None
  for it, and the progress table shows only how many of its runs are done. Pilot grids are open:
  they are what RACE sees before a full run.
- **The replacement rule** (``learned``, race.stats.instability.learned): a pilot grid learned something
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
import re
import statistics
from pathlib import Path
from typing import Any

BEGIN, END = "<!-- validation:round2:begin -->", "<!-- validation:round2:end -->"


def _v():
    import validation as v          # scripts/ is on sys.path when run as research/scripts/validation.py

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
    return len(s[v.GRID_KEYS[kind]]) * v.seeds_of(suite, kind, s)


def learned(record: dict) -> tuple[bool, float, float]:
    """(learned?, the best point's mean gain, its seed SE): race.stats.instability.learned, the rule the
    report's "nothing learned" advice uses (the replacement rule of research/validation/round2.yaml)."""
    from race.stats.instability import learned as grid_learned

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
            if part_path.is_file():          # under way (a grid getting more seeds too: its partial has them all)
                cells.append(f"under way: {count_runs(part_path)}/{want}" + (", sealed" if v.sealed(suite, k) else ""))
            elif done_path.is_file():
                n = count_runs(done_path)
                with gzip.open(done_path, "rt", encoding="utf-8") as fh:
                    commit = json.load(fh).get("commit", "")[:7]
                cells.append(f"{n}/{want} runs ({commit})" + (", sealed" if v.sealed(suite, k) else ""))
            else:
                cells.append(f"0/{want}")
        out.append(f"| {s['name']} | {float(s['pilot_budget']):.3g} | " + " | ".join(cells) + " |")
    return out


def pilot_lines(suite: dict) -> list[str]:
    """The pilot verdicts (open: what RACE sees before a full run), the replacement rule, and what
    RACE spends before a full run: the pilot grid, and the length probe at each planned full-run
    budget, each as a share of one full run there."""
    v = _v()
    out = ["| setting | pilot verdict (range, confidence) | pilot-best ρ | best gain over the base (seed SE) | "
           "learned (replacement rule) | pilots fell back | grid's cost / one full run at 10×, 30×, 100× B | "
           "length probe's cost / one full run at F |", "|---|---|---|---|---|---|---|---|"]
    factors = [v.KINDS[kind] for kind in FULL_KINDS]                   # 10, 30, 100
    grid_costs: dict[int, list[float]] = {k: [] for k in factors}
    probe_costs: dict[str, list[float]] = {k: [] for k in FULL_KINDS}
    for s in suite["settings"]:
        rec = load_visible(suite, s["name"], "pilot")
        if rec is None:
            out.append(f"| {s['name']} | not run | | | | | | |")
            continue
        diag = v.diagnosis(rec)
        ok, gain, se = learned(rec)
        means = {r: statistics.fmean(x) for r, x in v.point_means(rec).items()}
        best = max(means, key=means.get)
        fell, n = v._fallen(diag)
        grid = sum(p.flops.total for p in v.pilots_of(rec)) / float(s["pilot_budget"])     # in units of B
        probes = []
        if ok and not s.get("dropped") and not s.get("replaced_by"):
            for k in factors:
                grid_costs[k].append(grid / k)
            for kind in FULL_KINDS:
                c = probe_cost(suite, s, kind) if v.planned(s, kind) else None
                if c is not None:
                    probe_costs[kind].append(c)
                    probes.append(f"{kind[4:]}×: {c:.3f}")
        out.append(f"| {s['name']} | {v.grid_class(diag)} {diag.primary.range_text()}, {diag.primary.confidence:.2f} | "
                   f"{best:g} | "
                   f"{gain:+.4f} ({se:.4f}) | {'yes' if ok else '**no**: replace'} | {fell}/{n} | "
                   f"{' · '.join(f'{grid / k:.3f}' for k in factors)} | {'; '.join(probes) or '—'} |")
    if grid_costs[factors[0]]:
        probe_text = ", ".join(f"{statistics.median(c):.3f} at {kind[4:]} × B ({len(c)} setting{'s' if len(c) != 1 else ''})"
                               for kind, c in probe_costs.items() if c)
        out += ["", f"Over the {len(grid_costs[factors[0]])} settings that run full grids, the pilot grid costs a median "
                + ", ".join(f"{statistics.median(c):.3f}" for c in grid_costs.values())
                + " of one full run at 10, 30 and 100 × B; the length probe at F adds a median "
                + (probe_text or "nothing yet") + "."]
    return out


def tables(suite: dict) -> str:
    lines = ["### Round 2: progress", "", *progress_lines(suite), "",
             "### Round 2: the pilot grids (open)", "", *pilot_lines(suite), ""]
    if suite.get("freeze"):
        f = suite["freeze"]
        lines += ["### Round 2: frozen", "", f"Frozen on {f['date']} at rule {f['rule'][:7]}, drift model "
                  f"{f['drift'][:7]}, stability probe {f['probe'][:7]}.", "",
                  "### Round 2: the scores", "", *score_lines(suite)]
    else:
        lines += ["The full-run grids are **sealed**: their results enter no table until the rule, the "
                  "budget-drift model and the stability probe to be scored are frozen "
                  "(`research/scripts/validation_round2.py freeze`).", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- the scores (written before the freeze)

FULL_KINDS = ("full10", "full30", "full100")


def _probe_file(suite: dict, name: str, kind: str) -> dict | None:
    """The committed length-probe file of a setting's full-run budget, as written (None if none)."""
    folder = Path(_v().ROOT) / (suite.get("probes") or "research/validation/probes")
    path = folder / f"{name}-{kind}.json.gz"
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def probe_record(suite: dict, name: str, kind: str) -> dict | None:
    """The length probe of a setting's full-run budget, as race.fullrun.probe's record (round 2:
    research/validation/round2/probes/, run by race.fullrun.probe; round 1: research/validation/probes/, read the same way)."""
    import stability as S            # research/scripts/stability.py

    rec = _probe_file(suite, name, kind)
    return None if rec is None else S.probe_as_record(rec)


def probe_cost(suite: dict, s: dict, kind: str) -> float | None:
    """The length probe's FLOPs (its runs' training compute) as a share of one full run at the kind's budget."""
    rec = _probe_file(suite, s["name"], kind)
    if rec is None:
        return None
    return sum(p["flops"]["total"] for p in rec["pilots"]) / (float(s["pilot_budget"]) * _v().KINDS[kind])


def score_row(suite: dict, s: dict, kind: str, pilot: dict, full: dict) -> dict[str, Any]:
    """One setting's scores at one full-run budget F = B × the kind's factor: the rule as it is
    today (the pilot verdict at B: range, recommended ρ), the frozen rule (the range at F from
    race.stats.drift, and the stability line at F from race.stats.instability.stability_at with the probe), and
    on-policy. Regrets are in pooled full-run SEs (research/scripts/validation.py setting_row)."""
    from race.stats.instability import stability, stability_at
    from race.stats.drift import range_record

    v = _v()
    row = v.setting_row(s, pilot, full)                 # today's rule, the full runs' regime, costs
    pilots, diag = v.pilots_of(pilot), v.diagnosis(pilot)
    B = float(s["pilot_budget"])
    F = B * v.KINDS[kind]
    lr = (pilot.get("config") or {}).get("learning_rate") or {}
    rr = range_record(pilots, diag, pilot_budget=B, full_run_budget=F,
                      constant_rate=(lr.get("schedule") or "constant") == "constant", population=_v().FROZEN_POPULATION)
    means = v.point_means(full)
    meas = v.measured_rho(full)
    on_axis = {meas[t]: x for t, x in means.items()}
    if "refused" in rr:                                  # no range at F: the frozen rule falls back to B's
        lo_f, hi_f = diag.primary.bounds
        rec_f = diag.primary.recommended_rho
    else:
        (lo_f, hi_f), rec_f = rr["rho_range"], rr["recommended_rho"]
    regret_f = row["best_mean"] - v.interpolate(on_axis, rec_f)
    on_policy = s.get("on_policy")
    on_mean = statistics.fmean(means[on_policy]) if on_policy in means else float("nan")
    _, gain_ci_f = v.regret_gain_ci(full, rec_f, on_policy)
    probe = probe_record(suite, s["name"], kind)
    st = stability(pilots, "reward")
    at_f = stability_at(st, full_run_budget=F, pilot_budget=B, probe=probe, partial_probe=False)
    full_pilots = v.pilots_of(full)
    runs = len(full_pilots)
    fell = sum(row["collapses"].values())
    per_rho = {t: (row["collapses"].get(t, 0), sum(p.rho_target == t for p in full_pilots))
               for t in sorted({p.rho_target for p in full_pilots})}
    return {**row, "kind": kind, "F": F, "range_f": (lo_f, hi_f), "rec_f": rec_f, "range_f_refused": "refused" in rr,
            "in_range_f": v._within(row["best_measured"], lo_f, hi_f), "regret_f": regret_f,
            "regret_f_pse": v._in_se(regret_f, row["pse"]),
            "gain_f": v.interpolate(on_axis, rec_f) - on_mean, "gain_f_ci": gain_ci_f,
            "flag": at_f["status"], "probe": probe["status"] if probe else None,
            "runs": runs, "collapsed": fell, "collapsed_per_rho": per_rho, "pilots_fell": len(st.unstable) if st is not None else 0,
            "pilot_cost_f": sum(p.flops.total for p in pilots) / F}


def score_rows(suite: dict) -> list[dict[str, Any]]:
    """Every (setting, full-run budget) with both grids committed and visible."""
    out = []
    for s in suite["settings"]:
        pilot = load_visible(suite, s["name"], "pilot")
        if pilot is None:
            continue
        for kind in FULL_KINDS:
            full = load_visible(suite, s["name"], kind)
            if full is not None and _v().planned(s, kind):
                out.append(score_row(suite, s, kind, pilot, full))
    return out


def _rate(k: int, n: int) -> str:
    lo, hi = _v().wilson(k, n)
    return f"{k}/{n} ({lo:.2f} … {hi:.2f})" if n else "—"


def _median(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "—"
    lo, hi, cover = _v().median_ci(xs)
    return f"{statistics.median(xs):.2f} ({lo:.2f} … {hi:.2f}, {cover:.0%})"


def score_lines(suite: dict) -> list[str]:
    """The scores, per setting and over the batch, at each full-run budget (the targets of issue 31)."""
    rows = score_rows(suite)
    v = _v()
    want = sum(v.planned(s, k) for s in suite["settings"] for k in FULL_KINDS)
    f = lambda x, d=2: "—" if x is None or x != x else f"{x:.{d}f}"  # noqa: E731
    out = ["| setting | F | pilot → full regime | full-run best ρ | today: range at B, in? | regret (pooled SEs) | "
           "frozen: range at F, in? | regret (pooled SEs) | gain over on-policy (95 % CI) | collapsed runs | "
           "flag at F (probe) | pilots' cost / one full run |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # a grid whose full runs are unstable (at least half fell back) has no best ρ to score: its cells
    # are shown, but it counts in none of the rates below
    yes = lambda ok, r: ("yes" if ok else "no") + ("" if r["scored"] else " (not scored: unstable)")  # noqa: E731
    for r in rows:
        lo, hi = r["bounds"]
        lf, hf = r["range_f"]
        out.append(f"| {r['setting']} | {r['kind'][4:]}×B | {r['pilot']} → {r['full']} | {r['best_measured']:.2f} | "
                   f"[{f(lo)}, {f(hi)}] {yes(r['in_range'], r)} | {f(r['regret_pse'])} | "
                   f"[{f(lf)}, {f(hf)}]{' (B)' if r['range_f_refused'] else ''} {yes(r['in_range_f'], r)} | "
                   f"{f(r['regret_f_pse'])} | {f(r['gain_f'], 3)} ({f(r['gain_f_ci'][0], 3)} … {f(r['gain_f_ci'][1], 3)}) | "
                   f"{r['collapsed']}/{r['runs']} | {r['flag']} ({r['probe'] or 'no probe'}) | {r['pilot_cost_f']:.3f} |")
    done = (f"All {want} planned full-run grids are in: these are the frozen code's scores of the batch."
            if len(rows) == want else f"{len(rows)} of {want} planned full-run grids are in; the scores below cover "
            "those, and change as the rest land.")
    out += ["", f"{done} A grid's stability flag counts once its length probe has run.", ""]
    for kind in FULL_KINDS:
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        scored = [r for r in sel if r["scored"]]
        firm = [r for r in sel if r["full"] != "inconclusive"]
        sep = [r for r in scored if r["gain_f_ci"][0] > 0 or r["gain_f_ci"][1] < 0]
        # a grid's flag counts once its probe ran (or its pilots already fell back: at risk without one)
        tested = [r for r in sel if r["probe"] or r["flag"] == "at risk"]
        risky = [r for r in tested if r["collapsed"] and 3 * r["collapsed"] >= r["runs"]]
        clean = [r for r in tested if not r["collapsed"]]
        at_risk = lambda r: r["flag"] == "at risk"  # noqa: E731
        out += [f"**{kind[4:]} × B** ({len(sel)} setting{'s' if len(sel) != 1 else ''}; targets of issue 31 in brackets):", "",
                f"- full-run best ρ in the range: today's rule (at B) {_rate(sum(r['in_range'] for r in scored), len(scored))}; "
                f"frozen (at F) {_rate(sum(r['in_range_f'] for r in scored), len(scored))} [≥ 80 %]",
                f"- median regret in pooled SEs: today {_median([r['regret_pse'] for r in scored])}; "
                f"frozen {_median([r['regret_f_pse'] for r in scored])} [≤ 0.5]",
                f"- same regime where the full runs are conclusive: {_rate(sum(r['pilot_regime'] == r['full_regime'] for r in firm), len(firm))} [≥ 0.9]",
                f"- following the frozen rule beats on-policy where the full runs separate them: "
                f"{_rate(sum(r['gain_f'] > 0 for r in sep), len(sep))} [≥ 80 %]",
                f"- settings with ≥ 1/3 collapsed runs flagged at risk: {_rate(sum(map(at_risk, risky)), len(risky))} [all]; "
                f"settings without collapses flagged: {_rate(sum(map(at_risk, clean)), len(clean))} [≤ 20 %]",
                f"- the pilot grid's cost as a share of one full run: median {statistics.median(r['pilot_cost_f'] for r in sel):.3f}",
                ""]
    out += ["Collapsed full runs per ρ (target ρ: collapsed / runs; a run collapses when it falls back on its own "
            "held-out checkpoints), beside the stability flag RACE gave before the full runs:", "",
            "| setting | F | collapsed per ρ | flag at F (probe) |", "|---|---|---|---|"]
    for r in rows:
        per = " · ".join(f"{'**' if c else ''}{t:g}: {c}/{n}{'**' if c else ''}" for t, (c, n) in r["collapsed_per_rho"].items())
        out.append(f"| {r['setting']} | {r['kind'][4:]}×B | {per} | {r['flag']} ({r['probe'] or 'no probe'}) |")
    out.append("")
    fb = fallen_back(rows)
    out += ["Settings whose pilots fell back at B (race.stats.instability.stability_at quotes these counts): "
            + ("; ".join(f"{name}: {c} of {n} full runs collapsed" for name, c, n in fb) if fb else "none") + ".", ""]
    return out


def fallen_back(rows: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """(setting, collapsed full runs, full runs), over all its full-run budgets, for each setting
    some of whose pilots fell back at B: the evidence the at-risk line quotes for round 2."""
    out: dict[str, list[int]] = {}
    for r in rows:
        if r["pilots_fell"]:
            c = out.setdefault(r["setting"], [0, 0])
            c[0] += r["collapsed"]
            c[1] += r["runs"]
    return [(name, c, n) for name, (c, n) in out.items()]


def freeze(suite_path: Path, *, rule: str, drift: str, probe: str, date: str | None = None, **more: str) -> dict:
    """Write the suite's ``freeze`` mapping once (the commits scored: ``more`` adds a later round's, e.g. round 3's
    rate and design, after the probe); refuse a second freeze."""
    text = suite_path.read_text(encoding="utf-8")
    if not re.search(r"^freeze: null\b", text, flags=re.M):
        raise SystemExit(f"{suite_path}: already frozen (its `freeze:` line is not null); a change after "
                         "the freeze is reported as 'after unsealing', beside the frozen scores")
    commits = {"rule": rule, "drift": drift, "probe": probe, **more}
    for label, c in commits.items():
        if not re.fullmatch(r"[0-9a-f]{7,40}", c or ""):
            raise SystemExit(f"--{label} {c!r} is not a commit: expected 7–40 hex digits")
    f = {**commits, "date": date or _dt.datetime.now(_dt.timezone.utc).date().isoformat()}
    line = "freeze: {" + ", ".join(f"{k}: '{x}'" for k, x in f.items()) + "}"
    suite_path.write_text(re.sub(r"^freeze: null\b.*$", line, text, count=1, flags=re.M), encoding="utf-8")
    return f


def main(argv: list[str] | None = None) -> int:
    """``tables [--check DOC | --write DOC]`` and ``freeze --rule C --drift C --probe C`` of a round-2 suite."""
    import argparse

    v = _v()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=str(v.ROOT / "research" / "validation" / "round2.yaml"))
    ap.add_argument("--runs", default=None, help="the committed data (default: the suite's `runs`)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tables")
    t.add_argument("--check", default=None)
    t.add_argument("--write", default=None)
    fz = sub.add_parser("freeze", help="record the commits of the rule, drift model and probe scored")
    for k in ("rule", "drift", "probe"):
        fz.add_argument(f"--{k}", required=True)
    args = ap.parse_args(argv)
    suite = v.load_suite(Path(args.suite))
    v.RUNS = Path(args.runs) if args.runs else v.ROOT / suite["runs"]
    if args.cmd == "freeze":
        print(freeze(Path(args.suite), rule=args.rule, drift=args.drift, probe=args.probe))
        return 0
    text = tables(suite)
    return v.apply_tables(text, {(BEGIN, END): text}, check=args.check, write=args.write, suite_arg=args.suite,
                          script="research/scripts/validation_round2.py")


if __name__ == "__main__":
    raise SystemExit(main())
