"""Lockstep against solo pilots: step time per seed, FLOP/s against the matmul peak, grid wall time.

    python bench/lockstep.py                         # per-step: the default grid's points + the TRL bench's config
    python bench/lockstep.py --trl                   # … and TRL's GRPOTrainer at the TRL bench's config
    python bench/lockstep.py --reasoner              # … and the tiny reasoner at its full grid's ρ 0.55 point
    python bench/lockstep.py --only steps --config pilots/tiny-steps-sparse.yaml@0.55   # any config's grid point
    python bench/lockstep.py --grid                  # … and the whole default grid: race pilot --engine solo vs auto
    python bench/lockstep.py --only none --grid --grid-out DIR    # the grid runs alone, kept in DIR
    python bench/lockstep.py --json out.json

Per configuration, ``--seeds`` solo ``SeedAxisEngine``s (one seed each) and one ``SeedAxisEngine``
carrying the same seeds take turns in this one process: after a warm-up, ``--rounds`` rounds of
``--steps`` steps each (the order alternating between rounds), every engine on the same prompts,
so load from other jobs hits both alike. A solo "step" is the sum of the seeds' steps; the
lockstep step carries all seeds. Reported: median step time per seed for both, their ratio, and the
lockstep engine's metered FLOP/s as a fraction of a torch fp32 matmul peak measured in the same
run at the same thread count (bench/step_vs_trl.py's ``matmul_peak``). ``--grid`` runs
``race pilot`` (the default grid) twice, ``--engine solo`` then ``--engine auto`` (lockstep, in
groups ``race.engine.lean_engine.balanced_group_size`` picks), and reports both wall times. Nothing in race/ is modified.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_vs_trl import best_per_shape, loadavg, matmul_peak  # noqa: E402


def default_configs(reasoner: bool, extra: list[str] | None = None) -> list[tuple[str, object, object]]:
    """(label, config, schedule) to time: the default grid's points, the TRL bench's config,
    with ``reasoner`` the tiny reasoner's ρ 0.55 point, and each ``extra`` "CONFIG.yaml@ρ" (that
    grid point of any pilot config, e.g. pilots/tiny-steps-sparse.yaml@0.55)."""
    from race.run.api import build_config
    from race.flops.grid import plan_grid

    out = []
    cfg = build_config(None)
    for sch in plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules:
        out.append((f"default ρ {sch.rho_target:g} ({sch.prompts_per_step}×{sch.n_gen}→{sch.n_train}, μ {sch.mu})",
                    cfg, sch))
    cfg_trl, sch_trl = _trl_config()
    out.append(("TRL bench config (4×8, μ 1)", cfg_trl, sch_trl))
    if reasoner:
        rc = build_config(str(Path(__file__).resolve().parents[1] / "pilots" / "tiny-reasoner.yaml"))
        sch = next(s for s in plan_grid(rc).schedules if abs(s.rho_target - 0.55) < 1e-9)
        out.append((f"tiny reasoner ρ 0.55 ({sch.prompts_per_step}×{sch.n_gen}→{sch.n_train}, μ {sch.mu})", rc, sch))
    for spec in extra or []:
        path, _, rho = spec.rpartition("@")
        xc = build_config(path)
        sch = min(plan_grid(xc).schedules, key=lambda s: abs(s.rho_target - float(rho)))
        out.append((f"{Path(path).stem} ρ {sch.rho_target:g} ({sch.prompts_per_step}×{sch.n_gen}→{sch.n_train}, "
                    f"μ {sch.mu}, completions ≤ {xc.grpo.max_completion_len})", xc, sch))
    return out


def _trl_config():
    """The config and schedule of bench/step_vs_trl.py's ``RaceRunner`` (4 prompts × 8 rollouts)."""
    from race.run.api import build_config
    from race.flops.grid import CostModel, reward_spec
    from race.flops.catalog import load_arch
    from race.config.presets import DEFAULT
    from race.core.records import Schedule
    from step_vs_trl import ALPHA, LR, MAX_COMPLETION, MODEL, N_GEN, PROMPTS, RANK, TASK, TEMPERATURE

    cfg = dict(DEFAULT)
    cfg.update({"model": MODEL, "task": TASK, "reward": {"kind": "sparse"},
                "lora": {"rank": RANK, "alpha": ALPHA, "targets": "all"},
                "schedule": {**DEFAULT["schedule"], "prompts_per_step": PROMPTS, "n_train": N_GEN, "n_gen": N_GEN,
                             "mu": 1},
                "grpo": {**DEFAULT["grpo"], "temperature": TEMPERATURE, "max_completion_len": MAX_COMPLETION,
                         "beta": 0.0},
                "learning_rate": {"ref": LR, "ref_batch": PROMPTS * N_GEN, "fixed": True}})
    config = build_config(cfg)
    cm = CostModel(config, load_arch(config.model), reward_spec(config), config.prompt_len, config.completion_len)
    per_step = cm.cost(N_GEN, 1).per_prompt.scaled(PROMPTS)
    return config, Schedule(rho_target=per_step.rho, prompts_per_step=PROMPTS, n_gen=N_GEN, n_train=N_GEN, mu=1,
                            steps=1_000_000, learning_rate=LR, lora_rank=RANK, flops_per_step=per_step,
                            flops=per_step.scaled(1_000_000))


def time_config(label: str, cfg, sch, *, seeds: list[int], steps: int, rounds: int, warmup: int,
                threads: int) -> dict:
    import torch

    from race.engine.seed_axis import SeedAxisEngine
    from race.tasks.taskdata import task_problems

    torch.set_num_threads(threads)
    solo = [SeedAxisEngine(cfg, sch, [s]) for s in seeds]
    group = SeedAxisEngine(cfg, sch, seeds)
    train = task_problems(cfg, solo[0].backend.tok, split="train", seed=0)
    k = sch.prompts_per_step
    cursor = [0]

    def problems():
        if cursor[0] + k > len(train):
            cursor[0] = 0
        cursor[0] += k
        return train[cursor[0] - k:cursor[0]]

    def solo_step():
        ps = problems()
        t = time.perf_counter()
        flops = sum(e.step([0], [ps])[0].flops.total for e in solo)
        return time.perf_counter() - t, flops

    def group_step():
        ps = problems()
        t = time.perf_counter()
        flops = sum(r.flops.total for r in group.step(list(range(len(seeds))), [ps] * len(seeds)))
        return time.perf_counter() - t, flops

    for _ in range(warmup):
        solo_step()
        group_step()
    rows = {"solo": [], "lockstep": []}
    peaks = [matmul_peak(threads)]
    for r in range(rounds):
        order = [("solo", solo_step), ("lockstep", group_step)]
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            rows[name] += [fn() for _ in range(steps)]
        peaks.append(matmul_peak(threads))
    peak = best_per_shape(peaks)
    S = len(seeds)
    med = {n: statistics.median(t for t, _ in v) / S for n, v in rows.items()}
    fps = {n: sum(f for _, f in v) / sum(t for t, _ in v) for n, v in rows.items()}
    return {"label": label, "seeds": S, "threads": threads, "steps": steps * rounds,
            "step_per_seed_s": med, "ratio": med["lockstep"] / med["solo"],
            "flop_per_s": fps, "fraction_of_peak": {n: v / (peak["max_gflops"] * 1e9) for n, v in fps.items()},
            "peak_gflops": peak["max_gflops"], "load": loadavg()}


def grid_wall(keep: str | None = None) -> dict:
    """``race pilot`` (the default grid) with --engine solo, then --engine auto (lockstep): wall
    seconds of each; ``keep``: a folder to keep both runs in (``solo/``, ``lockstep/``: results
    and the text report), else temporary folders."""
    out = {}
    for engine in ("solo", "auto"):
        name = "lockstep" if engine == "auto" else engine
        with tempfile.TemporaryDirectory(prefix=f"race-bench-{name}-") as tmp:
            d = os.path.join(keep, name) if keep else tmp
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "race", "pilot", "--engine", engine, "--out", d, "--quiet",
                                "--format", "text"], check=True, capture_output=True, text=True,
                               cwd=str(Path(__file__).resolve().parents[1]))
            out[name] = {"wall_s": time.perf_counter() - t, "load_after": loadavg(), "engine_flag": engine}
            if keep:
                with open(os.path.join(d, "report.txt"), "w") as fh:
                    fh.write(r.stdout)
            with open(os.path.join(d, "results.json")) as fh:
                res = json.load(fh)
            diag = res.get("diagnosis") or {}
            out[name]["verdict"] = diag.get("regime")
            out[name]["engines"] = sorted({p["extra"].get("engine", "solo") for p in res["pilots"]})
    out["ratio"] = out["lockstep"]["wall_s"] / out["solo"]["wall_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per block (default 10)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a pilot process gets 1 of 2 cores)")
    ap.add_argument("--reasoner", action="store_true")
    ap.add_argument("--config", action="append", default=[], metavar="CONFIG.yaml@RHO",
                    help="also time that grid point of a pilot config (repeatable)")
    ap.add_argument("--trl", action="store_true", help="also time TRL's GRPOTrainer at the TRL bench config")
    ap.add_argument("--grid", action="store_true", help="also time race pilot's default grid, solo vs lockstep")
    ap.add_argument("--grid-out", default=None, metavar="DIR", help="keep the two grid runs in DIR/solo, DIR/lockstep")
    ap.add_argument("--only", default=None, help="only configurations whose label contains this")
    ap.add_argument("--json", metavar="OUT")
    a = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    t0 = time.perf_counter()
    env = {"python": platform.python_version(), "torch": torch.__version__, "nproc": os.cpu_count(),
           "load_start": loadavg(), "command": " ".join([Path(sys.executable).name, *sys.argv])}
    results = []
    for label, cfg, sch in default_configs(a.reasoner, a.config):
        if a.only and a.only not in label:
            continue
        r = time_config(label, cfg, sch, seeds=list(range(a.seeds)), steps=a.steps, rounds=a.rounds,
                        warmup=a.warmup, threads=a.threads)
        results.append(r)
        print(f"{label}: per seed solo {1e3 * r['step_per_seed_s']['solo']:.1f} ms, lockstep "
              f"{1e3 * r['step_per_seed_s']['lockstep']:.1f} ms (ratio {r['ratio']:.2f}); lockstep "
              f"{r['flop_per_s']['lockstep'] / 1e9:.2f} GFLOP/s = {100 * r['fraction_of_peak']['lockstep']:.1f} % of "
              f"{r['peak_gflops']:.0f} GFLOP/s peak (solo {100 * r['fraction_of_peak']['solo']:.1f} %); load {r['load']}",
              flush=True)
    out = {"env": env, "configs": results}
    if a.trl:
        from step_vs_trl import RaceRunner, TrlRunner, compare

        with tempfile.TemporaryDirectory(prefix="race-bench-trl-") as d:
            res = compare(RaceRunner(0), TrlRunner(0, d), threads=a.threads, steps=a.steps * 2, rounds=a.rounds,
                          warmup=a.warmup)
        trl_step = res["trl"]["step_s"]["median"]
        mine = next((r for r in results if r["label"].startswith("TRL bench")), None)
        out["trl"] = {"trl_step_s": trl_step, "race_solo_step_s": res["race"]["step_s"]["median"],
                      "solo_over_trl": res["ratio_race_over_trl"],
                      **({"lockstep_per_seed_over_trl": mine["step_per_seed_s"]["lockstep"] / trl_step} if mine else {})}
        print(f"TRL step {1e3 * trl_step:.1f} ms; RACE solo / TRL {res['ratio_race_over_trl']:.2f}"
              + (f"; RACE lockstep per seed / TRL {out['trl']['lockstep_per_seed_over_trl']:.2f}" if mine else ""),
              flush=True)
    if a.grid:
        out["grid"] = grid_wall(a.grid_out)
        g = out["grid"]
        print(f"race pilot (default grid): solo {g['solo']['wall_s']:.0f} s, lockstep {g['lockstep']['wall_s']:.0f} s, "
              f"ratio {g['ratio']:.2f}; verdicts {g['solo']['verdict']} / {g['lockstep']['verdict']}", flush=True)
    env["total_s"] = time.perf_counter() - t0
    env["load_end"] = loadavg()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
