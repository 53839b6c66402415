"""Where a group step's ``torch.cat`` and ``torch.stack`` calls go (one thread, the default grid's ρ 0.74 point).

    PYTHONPATH=. python research/probes/lockstep_probes/stack_callers.py lockstep   # or solo

Wraps ``torch.cat`` and ``torch.stack`` with a timer keyed by their caller, runs 3 warm-up and 10
timed steps of a group of 3 seeds (or one), and prints milliseconds and calls per step by caller.
"""
import collections
import sys
import time
import traceback

import torch

torch.set_num_threads(1)
ACC = collections.defaultdict(lambda: [0, 0.0])


def timed(name):
    f = getattr(torch, name)

    def g(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        frame = traceback.extract_stack(limit=3)[-2]
        entry = ACC[(name, frame.filename.split("race/")[-1], frame.lineno, frame.name)]
        entry[0] += 1
        entry[1] += time.perf_counter() - t
        return out
    setattr(torch, name, g)


if __name__ == "__main__":
    for name in ("cat", "stack"):
        timed(name)
    from race.engine.seed_axis import SeedAxisEngine
    from race.flops.grid import plan_grid
    from race.run.api import build_config
    from race.tasks.taskdata import task_problems

    cfg = build_config(None)
    sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[2]
    seeds = [0, 1, 2] if sys.argv[1:] == ["lockstep"] else [0]
    engine = SeedAxisEngine(cfg, sch, seeds)
    train, P = task_problems(cfg, engine.backend.tok, split="train", seed=0), sch.prompts_per_step
    wall = []
    for i in range(13):
        if i == 3:
            ACC.clear()
        t = time.perf_counter()
        engine.step(seeds, [train[i * P:(i + 1) * P]] * len(seeds))
        wall.append(time.perf_counter() - t)
    print(f"{len(seeds)} seed(s): median step {sorted(wall[3:])[5] * 1e3:.1f} ms; cat + stack "
          f"{sum(v[1] for v in ACC.values()) * 100:.2f} ms per step")
    for key, (n, s) in sorted(ACC.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"{s * 100:7.2f} ms/step {n / 10:6.1f} calls/step  {key}")
