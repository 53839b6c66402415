"""Median wall time of one solo pilot step on the default grid, for the RACE checkout on PYTHONPATH.

    PYTHONPATH=. python bench/engine_step.py [--point 1] [--steps 205] [--warmup 5]

Builds ``race.engine.seed_axis.SeedAxisEngine`` (one seed) for the embedded default config at one grid point (index into
its schedules; 1 = ρ 0.62), 1 torch thread, seed 0, and times ``--steps`` steps on the task's
training prompts in order, dropping the first ``--warmup``. Prints the median step time, the
mean seconds per phase (rollout, reward, update, sync) and the mean metered FLOPs per step, so
two checkouts can be compared as a same-load pair: run one copy per checkout at the same time,

    git worktree add /tmp/before <commit>
    (PYTHONPATH=/tmp/before python bench/engine_step.py > before.txt &) ; PYTHONPATH=. python bench/engine_step.py

(the figures in docs/benchmarks.md, "One engine on the lean path", came from this pairing).
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--point", type=int, default=1, help="grid point index (default 1: ρ 0.62)")
    ap.add_argument("--steps", type=int, default=205)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    import race
    from race.config import presets
    from race.run.api import build_config
    from race.flops.grid import plan_grid
    from race.engine.seed_axis import SeedAxisEngine
    from race.tasks import load_task

    cfg = build_config(presets.DEFAULT)
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[args.point]
    engine = SeedAxisEngine(cfg, schedule, [0])
    train = load_task(cfg.task, split="train", seed=0)
    per = schedule.prompts_per_step
    times, flops = [], []
    for k in range(args.steps):
        start = (k * per) % (len(train) - per)
        t = time.perf_counter()
        record = engine.step([0], [train[start:start + per]])[0]
        times.append(time.perf_counter() - t)
        flops.append(record.flops.total)
    kept = times[args.warmup:]
    phases = {k: round(1000 * engine.walls[0][k] / args.steps, 1) for k in ("rollout", "reward", "update", "sync")}
    print(f"{race.__file__}: ρ {schedule.rho_target:g}, {len(kept)} steps, median {1000 * statistics.median(kept):.1f} ms "
          f"per step; ms per step by phase {phases}; {statistics.mean(flops):.4g} FLOPs per step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
