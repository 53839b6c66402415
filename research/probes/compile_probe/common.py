import os, sys, time, pickle, statistics, copy
import torch
torch.set_num_threads(1)
from race.run.api import build_config
from race.flops.grid import plan_grid
from race.engine.seed_axis import SeedAxisEngine
from race.tasks.taskdata import task_problems
from race.engine import grpo
import race.engine.backends.hf as hf

def engine(which, seed=0):
    if which == "arith":
        cfg = build_config(None); sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[2]
    else:
        cfg = build_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "pilots", "tiny-reasoner.yaml")); sch = plan_grid(cfg).schedules[1]
    e = SeedAxisEngine(cfg, sch, [seed])
    train = task_problems(cfg, e.backend.tok, split="train", seed=0)
    return cfg, sch, e, train

def capture(which, n):
    """run n real steps; record sampler calls (prompt ids, kwargs) and update batches"""
    cfg, sch, e, train = engine(which)
    rec = {"sample": [], "update": []}
    orig_sample, orig_update = hf.sample, grpo.update
    def s(model, prompt_ids, **kw):
        rec["sample"].append((prompt_ids, {k: v for k, v in kw.items() if k not in ("generator", "logprobs", "device")}))
        return orig_sample(model, prompt_ids, **kw)
    def u(policy, opt, batch, **kw):
        rec["update"].append((batch, {k: v for k, v in kw.items() if k != "lr_scheduler"}))
        return orig_update(policy, opt, batch, **kw)
    hf.sample, grpo.update = s, u
    try:
        for i in range(n):
            e.step([0], [train[i*8:(i+1)*8]])
    finally:
        hf.sample, grpo.update = orig_sample, orig_update
    return rec

def med(xs): return statistics.median(xs) if xs else float("nan")
