"""The tables of the validation study (issue 16) from its scored rows (validation_stats.py), and the
doc blocks the research scripts print, check and rewrite (``section_tables``, ``doc_command``). Moved
out of validation.py unchanged (issue 52); validation.py re-exports every name and keeps the tables
that read the committed data."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from validation_stats import median_ci, point_means, setting_row, wilson  # noqa: E402
from validation_suite import EXTENDED, KINDS  # noqa: E402
# the settings whose full runs had been looked at when the candidate low-side rule was written down
# (candidate_range, 2026-12-02): only the others judge it
CANDIDATE_SEEN = frozenset({"default", "structured", "generate", "lr-x3", "default-cosine", "steps-sparse",
                            "dense", "hard", "lr-x0.3", "steps-prm", "steps-proxy-prm"})
BEGIN, END = "<!-- validation:tables:begin -->", "<!-- validation:tables:end -->"   # docs/validation.md: the summary tables
DETAIL = ("<!-- validation:detail:begin -->", "<!-- validation:detail:end -->")      # research/validation-log.md: the rest
DETAIL_FROM = "### The range open at a grid edge"   # the first table of the detail block


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


def long_row(s: dict, pilot: dict, full: dict, long: dict) -> dict[str, Any]:
    """The pilot verdict scored against the 30 × B full runs (``setting_row`` on them), with the
    10 × B best ρ among the same ρ beside it: does the best ρ keep moving as the budget grows?"""
    row = setting_row(s, pilot, long)
    long_rhos = sorted(point_means(long))
    same = {r: v for r, v in point_means(full).items() if any(abs(r - x) < 1e-9 for x in long_rhos)}
    row["best10_same_points"] = max(same, key=lambda r: sum(same[r]) / len(same[r])) if same else None
    row["long_rhos"] = long_rhos
    return row


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
