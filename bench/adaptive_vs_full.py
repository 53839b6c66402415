"""Adaptive grid (--adaptive, successive halving over ρ) against the full grid: pilot FLOPs and verdicts.

Runs (or resumes) the adaptive grid, then the full grid on the same study — the full run reuses
every adaptive pilot, so the pair costs one full grid — and prints a Markdown row: pilots and
measured pilot FLOPs of each, the two verdicts (primary target), their ρ ranges and whether the
verdicts agree. The adaptive verdict is recomputed from the stored pilots by replaying the
halving rule (the same pilots the adaptive run used: pilots are deterministic per seed, and the
replay checks the selection against the rule).

    python bench/adaptive_vs_full.py --budget 2e11 --out runs/adaptive-easy
    python bench/adaptive_vs_full.py --budget 2e11 --task arithmetic-hard --out runs/adaptive-hard
"""
from __future__ import annotations

import argparse
import time

from race.api import build_config
from race.regime import classify
from race.runner import run_grid
from race.scheduler import successive_halving
from race.store import Store, default_url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default=None, help="FLOPs per pilot (default: the embedded default's 6e11)")
    ap.add_argument("--task", default=None, help="built-in task (default arithmetic-easy)")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--grid", default=None)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg = build_config(None, budget=a.budget, task=a.task, seeds=a.seeds, grid=a.grid)
    if a.task:
        from dataclasses import replace

        cfg = replace(cfg, name=f"{cfg.name}-{a.task}")
    t0 = time.time()
    run_grid(cfg, out_dir=a.out, adaptive=True, quiet=True)
    t1 = time.time()
    full = run_grid(cfg, out_dir=a.out, quiet=True)
    t2 = time.time()
    store = Store(default_url(a.out), cfg.name)
    info = store.load()
    pilots = store.pilots()
    primary = info.classify.get("primary_target", "reward")
    scores = {(p.rho_target, p.seed): p.score(primary) for p in pilots}
    keys, final = successive_halving(info.grid, info.seeds, scores)
    assert final
    subset = [p for p in pilots if (p.rho_target, p.seed) in set(keys)]
    adaptive = classify(subset, meta=info.meta, **info.classify)
    fa, ff = sum(p.flops.total for p in subset), sum(p.flops.total for p in pilots)
    d = full.diagnosis
    agree = "yes" if adaptive.regime == d.regime else "no"
    print("| task | budget/pilot | full: pilots, FLOPs | adaptive: pilots, FLOPs (share) | full verdict (ρ range, conf.) "
          "| adaptive verdict (ρ range, conf.) | same verdict | wall (adaptive, rest of full) |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {cfg.task} | {cfg.budget:.3g} | {len(pilots)}, {ff:.3g} | {len(subset)}, {fa:.3g} ({fa / ff:.0%}) | "
          f"{d.regime.value} ([{d.rho_range[0]:.2f}, {d.rho_range[1]:.2f}], {d.confidence:.2f}) | "
          f"{adaptive.regime.value} ([{adaptive.rho_range[0]:.2f}, {adaptive.rho_range[1]:.2f}], "
          f"{adaptive.confidence:.2f}) | {agree} | {t1 - t0:.0f} s, {t2 - t1:.0f} s |")
    for target in d.verdicts:
        if target != primary:
            print(f"  other target {target}: full {d.verdicts[target].regime.value}, "
                  f"adaptive {adaptive.verdicts[target].regime.value}")


if __name__ == "__main__":
    main()
