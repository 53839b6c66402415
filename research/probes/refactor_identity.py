"""Did a refactor change a number? Run from the repository root against two checkouts.

    python research/probes/refactor_identity.py records CHECKOUT     # hash of every record round-trip
    python research/probes/refactor_identity.py pilot CHECKOUT       # hash of a solo pilot and a 2-seed lockstep group

Run each on the checkout before and after (``git worktree add --detach /tmp/before HEAD~1``) and
compare the hashes. ``records``: every pilot and diagnosis inside the committed results and
validation files, read with that checkout's ``from_dict`` and written back with its ``to_dict``.
``pilot``: a 4e10-FLOP pilot of the default config at ρ 0.73 (one thread), solo and as a lockstep
group of seeds 0 and 1: its FLOPs, per-prompt evaluations and curve. Used for issue 34's record
serialization and the one ``grpo.update`` (both hashes unchanged; the commit message names them).
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import sys


def records(root: str) -> str:
    from race.records import Diagnosis, PilotResult

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


if __name__ == "__main__":
    what, root = sys.argv[1], os.path.abspath(sys.argv[2])
    sys.path.insert(0, root)
    os.chdir("/")                       # nothing imported from the current directory
    print({"records": records, "pilot": pilot}[what](root))
