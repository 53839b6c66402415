"""Did a refactor change a number? Run from the repository root against two checkouts.

    python research/probes/refactor_identity.py records CHECKOUT [DATA]   # hash of every record round-trip
    python research/probes/refactor_identity.py pilot CHECKOUT       # hash of a solo pilot and a 2-seed lockstep group
    python research/probes/refactor_identity.py results A.json B.json   # two runs' results files, pilot by pilot

Run each on the checkout before and after (``git worktree add --detach /tmp/before HEAD~1``) and
compare the hashes. ``records``: every pilot and diagnosis inside the committed results and
validation files, read with that checkout's ``from_dict`` and written back with its ``to_dict``.
``pilot``: a 4e10-FLOP pilot of the default config at ρ 0.73 (one thread), solo and as a lockstep
group of seeds 0 and 1: its FLOPs, per-prompt evaluations and curve. Used for issue 34's record
serialization and the one ``grpo.update`` (both hashes unchanged; the commit message names them).
``results``: two ``race pilot --out`` results files (.json or .json.gz) of the same grid, e.g. the
default ``race pilot`` from the checkouts before and after: pilots matched by (ρ, seed), each
identical or not in its FLOPs, curve and held-out evaluations, then both verdicts (issue 34's "the
same 12 pilots bit for bit" came from this comparison).
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import sys


def records(root: str, data: str | None = None) -> str:
    try:                                # the packages by layer (issue 52), or the flat layout before them
        from race.core.records import Diagnosis, PilotResult
    except ImportError:
        from race.records import Diagnosis, PilotResult

    root = data or root                 # the files of another checkout, read with this one's code
    files = sorted(glob.glob(f"{root}/docs/runs/*.json*") + glob.glob(f"{root}/pilots/**/*.json*", recursive=True)
                   + glob.glob(f"{root}/research/validation/**/*.json.gz", recursive=True)
                   + glob.glob(f"{root}/validation/**/*.json.gz", recursive=True))

    def walk(x):
        if isinstance(x, dict):
            if {"rho_target", "evals", "flops", "seed"} <= x.keys():
                return json.dumps(PilotResult.from_dict(x).to_dict())
            if {"primary_target", "verdicts"} <= x.keys():
                return json.dumps(Diagnosis.from_dict(x).to_dict())
            return [walk(v) for v in x.values()]
        if isinstance(x, list):
            return [walk(v) for v in x]
        return None

    out = {}
    for f in files:
        raw = json.loads((gzip.open(f) if f.endswith(".gz") else open(f)).read())
        key = f.split("/validation/")[-1] if "/validation/" in f else os.path.basename(f)
        out[key] = walk(raw)
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def pilot(root: str) -> str:
    import torch

    torch.set_num_threads(1)
    try:                                # the packages by layer (issue 52), or the flat layout before them
        from race.engine.pilot import run_pilots as run_lockstep       # one loop since issue 53
        from race.engine.pilot import run_pilot
        from race.flops.grid import plan_grid
        from race.run.api import build_config
    except ImportError:
        from race.api import build_config
        from race.grid import plan_grid
        from race.lockstep import run_lockstep
        from race.pilot import run_pilot

    cfg = build_config(None, budget=4e10, grid="0.6,0.73,0.84")
    sched = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[1]

    def numbers(r):
        return [r.flops.to_dict(), {k: list(v) for k, v in r.evals.items()}, [list(c) for c in r.curve]]

    out = {"solo": numbers(run_pilot(cfg, sched, seed=0)),
           "lockstep": [numbers(r) for r in run_lockstep(cfg, sched, [0, 1])]}
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()


def results(a_path: str, b_path: str) -> str:
    def load(path):
        return json.loads((gzip.open(path) if path.endswith(".gz") else open(path)).read())

    a, b = load(a_path), load(b_path)
    pa = {(p["rho_target"], p["seed"]): p for p in a["pilots"]}
    pb = {(p["rho_target"], p["seed"]): p for p in b["pilots"]}
    lines, same = [], 0
    for key in sorted(pa.keys() | pb.keys()):
        x, y = pa.get(key), pb.get(key)
        if x is None or y is None:
            lines.append(f"ρ {key[0]:g} seed {key[1]}: only in {'B' if x is None else 'A'}")
            continue
        if all(x[f] == y[f] for f in ("flops", "curve", "evals")):
            same += 1
        else:
            differ = [f for f in ("flops", "curve", "evals") if x[f] != y[f]]
            lines.append(f"ρ {key[0]:g} seed {key[1]}: differs in {', '.join(differ)}; held-out reward "
                         f"{x['evals'].get('reward')} vs {y['evals'].get('reward')}")
    lines.append(f"identical pilots: {same} of {len(pa.keys() | pb.keys())}")
    for name, d in (("A", a), ("B", b)):
        g = d.get("diagnosis") or {}
        lines.append(f"{name}: {g.get('regime')} {g.get('rho_range')} confidence {g.get('confidence')}")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "results":
        print(results(sys.argv[2], sys.argv[3]))
        raise SystemExit(0)
    what, root = sys.argv[1], os.path.abspath(sys.argv[2])
    sys.path.insert(0, root)
    os.chdir("/")                       # nothing imported from the current directory
    if what == "records" and len(sys.argv) > 3:     # records CHECKOUT DATA: DATA's files, CHECKOUT's code
        print(records(root, os.path.abspath(sys.argv[3])))
        raise SystemExit(0)
    print({"records": records, "pilot": pilot}[what](root))
