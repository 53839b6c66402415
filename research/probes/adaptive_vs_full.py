"""Adaptive grid (--adaptive) against the full grid on real pilots: pilot FLOPs and verdicts.

Runs (or resumes) the adaptive grid with ``--policy`` (default: informative, what --adaptive
runs), then the full grid on the same study — the full run reuses every adaptive pilot, so the
pair costs one full grid — and prints one Markdown row per adaptive policy: pilots and measured
pilot FLOPs, the full and adaptive verdicts (primary target), their ρ ranges and whether the
verdicts agree. Each policy's verdict is recomputed from the stored pilots by replaying its rule
rung by rung (pilots are deterministic per seed, so a replayed subset is exactly what that policy
would have run; the replay of ``--policy`` is checked against the pilots the adaptive run made).

    python research/probes/adaptive_vs_full.py --out runs/adaptive-default                # the embedded default
    python research/probes/adaptive_vs_full.py --thorough --out runs/adaptive-thorough    # the thorough preset
    python research/probes/adaptive_vs_full.py --budget 2e11 --task arithmetic-hard --out runs/adaptive-hard
"""
from __future__ import annotations

import argparse
import time

from race.config import presets
from race.run.api import build_config
from race.stats.regime import classify
from race.run.study import run_grid
from race.run.adaptive import ADAPTIVE_POLICIES, adaptive_subset
from race.run.store import Store, default_url


def replay(policy: str, info, pilots, primary: str) -> list:
    """The stored pilots ``policy`` would have run."""
    by_key = {(p.rho_target, p.seed): p for p in pilots}
    return [by_key[k] for k in adaptive_subset(policy, info.grid, info.seeds, lambda k: by_key[k].score(primary))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thorough", action="store_true", help="start from the thorough preset")
    ap.add_argument("--budget", default=None, help="FLOPs per pilot (default: the preset's)")
    ap.add_argument("--task", default=None, help="built-in task (default arithmetic-easy)")
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--grid", default=None)
    ap.add_argument("--policy", choices=ADAPTIVE_POLICIES, default=ADAPTIVE_POLICIES[0],
                    help="the policy the adaptive run uses (every policy is replayed)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cfg = build_config(presets.THOROUGH if a.thorough else None, budget=a.budget, task=a.task, seeds=a.seeds,
                       grid=a.grid)
    if a.task:
        from dataclasses import replace

        cfg = replace(cfg, name=f"{cfg.name}-{a.task}")
    t0 = time.time()
    run_grid(cfg, out_dir=a.out, adaptive=a.policy, quiet=True)
    t1 = time.time()
    first = Store(default_url(a.out), cfg.name)
    first.load()
    ran = {(p.rho_target, p.seed) for p in first.pilots()}
    full = run_grid(cfg, out_dir=a.out, quiet=True)
    t2 = time.time()
    store = Store(default_url(a.out), cfg.name)
    info = store.load()
    pilots = store.pilots()
    primary = info.classify.get("primary_target", "reward")
    d = full.diagnosis
    ff = sum(p.flops.total for p in pilots)
    print(f"wall: adaptive ({a.policy}) {t1 - t0:.0f} s, rest of the full grid {t2 - t1:.0f} s")
    print("| task | budget/pilot | policy | full: pilots, FLOPs | adaptive: pilots, FLOPs (share) "
          "| full verdict (ρ range, conf.) | adaptive verdict (ρ range, conf.) | same verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for policy in ADAPTIVE_POLICIES:
        subset = replay(policy, info, pilots, primary)
        if policy == a.policy:
            assert {(p.rho_target, p.seed) for p in subset} == ran, "the replay differs from the adaptive run"
        ad = classify(subset, meta=info.meta, **info.classify)
        fa = sum(p.flops.total for p in subset)
        print(f"| {cfg.task} | {cfg.budget:.3g} | {policy} | {len(pilots)}, {ff:.3g} | {len(subset)}, {fa:.3g} "
              f"({fa / ff:.0%}) | {d.regime.value} ({d.primary.range_text()}, "
              f"{d.confidence:.2f}) | {ad.regime.value} ({ad.primary.range_text()}, "
              f"{ad.confidence:.2f}) | {'yes' if ad.regime == d.regime else 'no'} |")
        for target in d.verdicts:
            if target != primary:
                print(f"  other target {target}: full {d.verdicts[target].regime.value}, "
                      f"adaptive {ad.verdicts[target].regime.value}")


if __name__ == "__main__":
    main()
