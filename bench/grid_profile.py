"""Where the default grid's wall time goes, and its counted FLOPs against the physical limit.

    python bench/grid_profile.py [--workers N] [--engine auto|solo|lockstep] [--budget F] [--json PATH]
                                 [--race-pilot]

Runs the pilots of ``race pilot``'s default grid (the embedded config: calibrate, plan, every
(ρ, seed) through race.run.processes.PilotPool, grouped by race.engine.lean_engine.group_size_for as
``race pilot`` groups them) without the study's storage, and prints the wall split of
race.run.processes.wall_split: counted pilot work (rollout, reward, update, sync), held-out
evaluation (final, checkpoints, downstream), loading the policy, process start and the rest of a
pilot process's life, idle process slots, and calibration. The physical limit is the counted FLOPs
(the complete pilots' metered FLOPs, C_total) at a torch fp32 matmul peak measured in the same run:
the best of a 1024³ matmul on one thread, times the cores the pilots use (``--workers``, one thread
each, as ``race pilot`` runs them on a CPU). ``--race-pilot`` also times the real ``race pilot``
(storage, classify and report included) on the same grid, in a subprocess, after the pool run.

Timings are only comparable on a quiet machine: state the load beside any figure you record.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def matmul_peak(threads: int, size: int = 1024, reps: int = 20) -> float:
    """Best FLOP/s of a size³ fp32 matmul on ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * size ** 3 / best


def run_pool(workers: int, engine: str, budget: float | None) -> dict:
    """Calibrate, plan and run the default grid's pilots; the wall split (race.run.processes.wall_split)."""
    from dataclasses import replace

    from race.core.records import PilotResult
    from race.engine.calibration import calibrate
    from race.engine.lean_engine import group_size_for
    from race.flops.grid import plan_grid
    from race.run.api import build_config
    from race.run.processes import Finished, Job, PilotPool, Tick, wall_split

    t0 = time.monotonic()
    cfg = build_config(None, budget=budget)
    cal = calibrate(cfg, device="cpu")
    calibration = time.monotonic() - t0
    run_cfg = replace(cfg, grpo=replace(cfg.grpo, **cal.healthy)) if cal.healthy is not None else cfg
    plan = plan_grid(run_cfg, prompt_len=cal.prompt_len, completion_len=cal.completion_len)
    jobs = [Job(s, seed) for s in plan.schedules for seed in run_cfg.seed_ids]
    size = group_size_for(run_cfg, engine, "cpu", workers=workers)
    pilots: list[PilotResult] = []
    with PilotPool(run_cfg, workers=workers, device="cpu", poll=0.2, group_size=size) as pool:
        pool.submit(jobs)
        for event in pool:
            if isinstance(event, Finished):
                pilots.append(event.result)
                print(f"  ρ={event.job.schedule.rho_target:g} seed {event.job.seed}: {event.result.status} "
                      f"({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True)
            elif isinstance(event, Tick) and not (event.running or event.waiting):
                break
        profile = pool.profile()
    split = wall_split(pilots, profile, calibration_seconds=calibration, total_seconds=time.monotonic() - t0)
    failed = [p for p in pilots if p.status != "complete"]
    return {**split, "group_size": size, "pilots": len(pilots), "failed": len(failed),
            "budget": run_cfg.budget, "grid": list(run_cfg.grid), "seeds": run_cfg.seeds}


def time_race_pilot(workers: int, engine: str, budget: float | None) -> float:
    """Wall seconds of ``race pilot`` (the default grid) in a subprocess, its results in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "race", "pilot", "--out", os.path.join(tmp, "run"), "--quiet",
               "--workers", str(workers), "--engine", engine] + (["--budget", f"{budget:g}"] if budget else [])
        t = time.monotonic()
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        return time.monotonic() - t


def main(argv: list[str] | None = None) -> int:
    from race.run.processes import default_workers, render_wall_split

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=default_workers("cpu"))
    ap.add_argument("--engine", default="auto", choices=("auto", "solo", "lockstep"))
    ap.add_argument("--budget", type=float, default=None, help="per-pilot budget (default: the config's)")
    ap.add_argument("--json", default=None, help="write the split and the peak here")
    ap.add_argument("--race-pilot", action="store_true", help="also time the real race pilot on the same grid")
    args = ap.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    one = matmul_peak(1)
    peak = one * args.workers
    together = matmul_peak(os.cpu_count() or 1)          # one process on every core (docs/benchmarks.md's figure)
    split = run_pool(args.workers, args.engine, args.budget)
    out = {**split, "peak_one_thread_flop_s": one, "peak_flop_s": peak, "peak_all_threads_flop_s": together,
           "load_before": load,
           "load_after": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
           "cores": os.cpu_count(), "workers": args.workers, "engine": args.engine}
    out["fraction_of_limit"] = split["counted_flops"] / peak / split["total_seconds"]
    print(f"default grid: {split['pilots']} pilots ({split['failed']} failed), {len(split['grid'])} ρ × "
          f"{split['seeds']} seeds at {split['budget']:.3g} FLOPs, {args.workers} workers, groups of "
          f"{split['group_size']}; 1-minute load {load:.2f} before, {out['load_after']:.2f} after")
    print(f"matmul peak: {one / 1e9:.1f} GFLOP/s on one thread × {args.workers} = {peak / 1e9:.1f} GFLOP/s "
          f"({together / 1e9:.1f} GFLOP/s on {os.cpu_count()} threads in one process)")
    print("\n".join(render_wall_split(split, peak_flop_s=peak)))
    if args.race_pilot:
        out["race_pilot_seconds"] = time_race_pilot(args.workers, args.engine, args.budget)
        print(f"race pilot (the same grid, storage, classify and report included): {out['race_pilot_seconds']:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
