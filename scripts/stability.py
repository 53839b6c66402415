"""Stability candidates read from a pilot grid, scored on the first round's full runs (issue 33).

    python scripts/stability.py        # the table of docs/stability.md, with run-level rates

A candidate flags a setting from its pilot grid alone. Setting level: flagged among the settings
with ≥ 1/3 of their full runs collapsed (detection) and among those with none (false alarm).
Run level: flagged among the collapsed full runs, and among the stable ones. A full run collapsed
when it fell back on its own held-out checkpoints (race.checkpoints.find_instability); its setting's
10 × and 30 × B grids both count.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import validation as V  # noqa: E402


def fell(p) -> bool:
    from race.checkpoints import find_instability

    return find_instability(p.checkpoints, "reward") is not None


def dipped(p, by: float = 0.03) -> bool:
    m = [statistics.fmean(c.evals["reward"]) for c in p.checkpoints if c.evals.get("reward")]
    return len(m) > 1 and max(m[1:]) - m[-1] >= by


CANDIDATES = {"some pilot fell back (the rule of race/checkpoints.py)": fell,
              "some pilot's last checkpoint ≥ 0.03 below its best": dipped}


def main() -> int:
    suite = V.load_suite()
    rows = []
    for s in suite["settings"]:
        pilots = V.pilots_of(V.load_run(s["name"], "pilot"))
        full = [p for k in ("full10", "full30") if V.load_run(s["name"], k) for p in V.pilots_of(V.load_run(s["name"], k))]
        rows.append((s["name"], pilots, sum(fell(p) for p in full), len(full)))
    print("| candidate | settings ≥ 1/3 collapsed, flagged (95 % CI) | settings with no collapse, flagged | "
          "collapsed full runs in flagged settings | stable full runs in flagged settings |")
    print("|---|---|---|---|---|")
    for name, rule in CANDIDATES.items():
        flags = {n: any(rule(p) for p in ps) for n, ps, _, _ in rows}
        risky = [n for n, _, c, t in rows if c * 3 >= t and c]
        clean = [n for n, _, c, _ in rows if c == 0]
        det, fa = sum(flags[n] for n in risky), sum(flags[n] for n in clean)
        cr = sum(c for n, _, c, _ in rows if flags[n]), sum(c for _, _, c, _ in rows)
        sr = sum(t - c for n, _, c, t in rows if flags[n]), sum(t - c for _, _, c, t in rows)
        ci = lambda k, n: "{:.2f} … {:.2f}".format(*V.wilson(k, n))  # noqa: E731
        print(f"| {name} | {det}/{len(risky)} ({ci(det, len(risky))}) | {fa}/{len(clean)} ({ci(fa, len(clean))}) | "
              f"{cr[0]}/{cr[1]} ({ci(*cr)}) | {sr[0]}/{sr[1]} ({ci(*sr)}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
