"""Issue 49 item 1: what held-out evaluation buys a pilot grid, replayed on rounds 1–2's pilot grids.

    python research/scripts/eval_share.py                                # the table
    python research/scripts/eval_share.py tables --check docs/pilot.md   # exit 1 if the doc's table differs
    python research/scripts/eval_share.py tables --write docs/pilot.md   # rewrite it

A pilot's held-out evaluation costs the same whatever its budget (race.flops.grid.eval_flops), so a
design within a share of the full run pays for it out of each pilot's slice: on round 3's tiny settings
one pilot's evaluation (the final pass on 500 prompts × 4 samples, 8 checkpoints on 100 prompts each)
costs more than its whole slice of 10 % of F, and the `fit` design runs no pilots. This replay asks what
a cheaper evaluation would cost the answer. Every pilot of rounds 1–2's committed flat grids (4 ρ × 3
seeds at B) is read with its final evaluation cut to its first k prompts (the held-out prompts are the
same for every pilot, so the cut keeps the grid paired), and with its checkpoint evaluations all kept,
thinned to three, or dropped (without them the pilots' own drift cannot be fitted and the range at F takes
the population drift alone; nor can the forecast of reward at F, race.stats.forecast, be made). Then,
as research/scripts/replay.py's designs: race.stats.regime.classify, race.stats.drift.range_for_pilots
with the population drift of the other settings (leave one setting out), scored on the frozen reading of
the full runs (500 prompts, all runs) of the 24 scored grids that learned something.

Evaluation cost is stated relative to the grids as run: the final pass and the checkpoints each cost in
proportion to the prompts they evaluate (same samples per prompt, same completion lengths), so the
share is (k + c · 100) / (500 + 8 · 100) with c checkpoint evaluations. Deterministic (classify's fixed bootstrap seed).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "research" / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import replay as R  # noqa: E402
import validation as V  # noqa: E402

BEGIN, END = "<!-- eval-share:tables:begin -->", "<!-- eval-share:tables:end -->"
AS_RUN_PROMPTS, CHECKPOINTS, CHECKPOINT_PROMPTS = 500, 8, 100
# (label, final prompts, checkpoints kept)
# the checkpoints a thinned read keeps: the base, two of the seven fractions below 1 (log-spaced 1/64 … 0.55),
# and the one at 1 (the final pass's first 100 prompts: no evaluation of its own)
THIN = (0.0, 0.1682, 0.552, 1.0)
# (label, final prompts, checkpoint evaluations kept: "all", "thin" or "none")
READS: list[tuple[str, int, str]] = [
    (f"final on {k} prompts, {what}", k, ck)
    for ck, what in (("all", "8 checkpoint evaluations"), ("thin", "3 checkpoint evaluations (base, 0.17, 0.55)"),
                     ("none", "no checkpoints"))
    for k in (500, 200, 100, 50) if ck != "thin" or k in (500, 200)]


def eval_cost(prompts: int, checkpoints: str) -> float:
    """A read's held-out evaluation as a share of the grids' as run (module docstring)."""
    runs = {"all": CHECKPOINTS, "thin": len(THIN) - 1, "none": 0}[checkpoints]
    return (prompts + runs * CHECKPOINT_PROMPTS) / (AS_RUN_PROMPTS + CHECKPOINTS * CHECKPOINT_PROMPTS)


def cut(pilot, prompts: int, checkpoints: str):
    """``pilot`` with its final evaluation on its first ``prompts`` prompts, its checkpoints all, thinned
    (``THIN``) or none."""
    evals = {t: tuple(v[:prompts]) for t, v in pilot.evals.items()}
    keep = {"all": pilot.checkpoints, "none": (),
            "thin": tuple(c for c in pilot.checkpoints if any(abs(c.fraction - f) < 1e-3 for f in THIN))}[checkpoints]
    return dataclasses.replace(pilot, evals=evals, checkpoints=keep)


def register() -> list[str]:
    """Add the reads to replay.py's designs (a ``pilots`` hook on the flat grid) and return their names."""
    names = []
    for label, k, ck in READS:
        R.DESIGN[label] = {"kind": "grid", "frac": 1.0, "seeds": 3, "drop_top": False,
                           "transform": (lambda p, k=k, ck=ck: cut(p, k, ck))}
        names.append(label)
    return names


def table_lines() -> list[str]:
    names = register()
    sel = R.scored_learned()
    out = [f"{len(sel)} scored grids that learned something, leave one setting out; the flat grid (4 ρ × 3 seeds at "
           "B) read with cheaper evaluation. Evaluation: the read's held-out evaluation FLOPs as a share of the grids' "
           "as run. Coverage, width, regret (median; mean, pooled full-run SEs) and same regime as replay.py's designs.",
           "", "| read | evaluation | coverage | width (median) | regret: median; mean | same regime |",
           "|---|---|---|---|---|---|"]
    for (label, k, ck), name in zip(READS, names):
        s = R.design_summary(name, sel)
        same = f"{s['same']}/{s['firm']}" if s["firm"] else "—"
        out.append(f"| {label} | {eval_cost(k, ck):.2f} | {s['covered']}/{s['n']} | {s['width']:.2f} | "
                   f"{R._f(s['regret'])}; {R._f(s['mean_regret'])} | {same} |")
    return out


SECTIONS = (("What held-out evaluation buys (final prompts, checkpoints)", table_lines),)


def tables() -> str:
    return V.section_tables(SECTIONS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tables"]:
        return V.doc_command(argv[1:], tables, BEGIN, END, "research/scripts/eval_share.py")
    if argv:
        sys.stderr.write(__doc__.split("\n\n")[0] + "\n")
        return 2
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print("\n".join(table_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
