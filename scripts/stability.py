"""Stability candidates read from a pilot grid, scored on the first round's full runs (issue 33).

    python scripts/stability.py                    # the table of docs/stability.md, with run-level rates
    python scripts/stability.py probe SETTING KIND # run the length probe for a setting's full-run grid
    python scripts/stability.py probes             # every probe of the first round not yet committed

**The length probe** (a candidate, written down before any probe ran): one run at the full run's
budget F's optimizer-step count, at the pilot verdict's recommended ρ, with 1 prompt per step
instead of the grid's B_p and the same η and rollouts per prompt, so it costs F / B_p. Capped at
PROBE_SHARE of the pilot grid's compute (then it covers that share of the full run's steps). It
flags the setting when it falls back on its held-out checkpoints (race.checkpoints' rule).
Data: validation/probes/SETTING-KIND.json.gz (compact, as the study's grids).

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

PROBE_SHARE = 0.25          # the probe's cost, at most, as a share of the pilot grid's compute
PROBES = ROOT / "validation" / "probes"


def fell(p) -> bool:
    from race.checkpoints import find_instability

    return find_instability(p.checkpoints, "reward") is not None


def dipped(p, by: float = 0.03) -> bool:
    m = [statistics.fmean(c.evals["reward"]) for c in p.checkpoints if c.evals.get("reward")]
    return len(m) > 1 and max(m[1:]) - m[-1] >= by


CANDIDATES = {"some pilot fell back (the rule of race/checkpoints.py)": fell,
              "some pilot's last checkpoint ≥ 0.03 below its best": dipped}


def probe_config(s: dict, kind: str) -> dict:
    """The length probe's config for setting ``s`` and its full-run grid ``kind`` (see the docstring)."""
    pilot = V.load_run(s["name"], "pilot")
    pv = V.verdict(pilot)
    cfg = V.grid_config(s, kind, 1)
    F = float(s["pilot_budget"]) * V.KINDS[kind]
    bp = int((cfg.get("schedule") or {}).get("prompts_per_step", 8))
    grid_cost = sum(p.flops.total for p in V.pilots_of(pilot))
    budget = min(F / bp, PROBE_SHARE * grid_cost)
    cfg.update(name=f"probe-{s['name']}-{kind}", budget=budget, grid=[round(pv.recommended_rho, 3)], seeds=1)
    cfg["schedule"] = {**(cfg.get("schedule") or {}), "prompts_per_step": 1}
    return cfg


def run_probe(s: dict, kind: str, storage: Path) -> Path:
    """One length probe, run in this process (one thread): planned by race.grid at the probe's
    budget, run by race.pilot.run_pilot (a single pilot: no grid, no verdict)."""
    import gzip
    import json
    import time

    import torch

    from race.config import config_from_dict
    from race.grid import plan_grid
    from race.pilot import run_pilot

    torch.set_num_threads(1)
    raw = probe_config(s, kind)
    rho = raw["grid"][0]
    raw["grid"] = [rho, round(rho + 0.05, 3), round(rho + 0.1, 3)]     # the config's 3-point minimum; only ρ runs
    cfg = config_from_dict(raw)
    sched = next(x for x in plan_grid(cfg).schedules if x.rho_target == rho)
    t0 = time.time()
    result = run_pilot(cfg, sched, 0)
    rec = {"setting": s["name"], "kind": kind, "probe": {"share_cap": PROBE_SHARE, "budget": raw["budget"], "rho": rho,
                                                         "prompts_per_step": sched.prompts_per_step,
                                                         "steps": sched.steps, "mu": sched.mu},
           "commit": V._commit(ROOT), "wall_seconds": round(time.time() - t0, 1), "config": raw,
           "pilots": [V.compact_pilot(result.to_dict())]}
    PROBES.mkdir(parents=True, exist_ok=True)
    path = PROBES / f"{s['name']}-{kind}.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(rec, fh, separators=(",", ":"))
    return path


def load_probe(name: str, kind: str) -> dict | None:
    import gzip
    import json

    path = PROBES / f"{name}-{kind}.json.gz"
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", nargs="?", default="table", choices=["table", "probe", "probes"])
    ap.add_argument("setting", nargs="?")
    ap.add_argument("kind", nargs="?", default="full10")
    ap.add_argument("--storage", default="/work/validation-runs/probes")
    ap.add_argument("--only", default=None, help="probes: SETTING:KIND,… in this order (default: all, suite order)")
    args = ap.parse_args()
    suite = V.load_suite()
    if args.cmd == "probe":
        print(run_probe(V.setting(suite, args.setting), args.kind, Path(args.storage)))
        return 0
    if args.cmd == "probes":
        todo = ([tuple(x.split(":")) for x in args.only.split(",")] if args.only else
                [(s["name"], k) for s in suite["settings"] for k in ("full10", "full30")])
        for name, kind in todo:
            s = V.setting(suite, name)
            if True:
                if V.load_run(s["name"], kind) is not None and load_probe(s["name"], kind) is None:
                    try:
                        print(run_probe(s, kind, Path(args.storage)), flush=True)
                    except SystemExit as e:
                        print(e, flush=True)
        return 0
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
