"""race.flops.memory's update-phase plan against the memory a real update takes, on the CPU.

    python research/probes/memory_probe.py --model Qwen/Qwen2.5-0.5B-Instruct --completion-len 64
    python research/probes/memory_probe.py --model Qwen/Qwen2.5-0.5B-Instruct --completion-len 128

Builds a randomly initialised model from a shipped config (fp32; a random model rarely emits
its end token, so completions run to full length), runs two real ``SeedAxisEngine`` steps (rollout,
reward, GRPO update, adapter sync) and measures the second step's update as the rise of the
process's peak resident memory over its resident memory just before the update (Linux:
``/proc/self/clear_refs`` resets VmHWM; tensors this large are mmapped, so freeing returns them).
It prints that next to the plan's update phase (activations + update logits: race.flops.memory's
``update_peak − static``, fp32). On the CPU, SDPA's math fallback also keeps the attention
scores, which the plan (written for GPU kernels that do not) leaves out; they grow with the
square of the sequence length. Linux only.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]


def _proc(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="a shipped config")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--n-gen", type=int, default=8)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=16)
    a = ap.parse_args()

    import torch

    import gpu_check
    from race.engine import grpo
    from race.config.configfile import config_from_dict
    from race.flops.memory import schedule_memory
    from race.flops.catalog import load_hf_config
    from race.engine.seed_axis import SeedAxisEngine
    from race.core.records import FlopBreakdown, Schedule
    from race.tasks import load_task

    work = tempfile.TemporaryDirectory(prefix="race-memory-probe-")     # ~2 GB of random weights, removed at exit
    folder = gpu_check.build_random_model(load_hf_config(a.model), os.path.join(work.name, "m"),
                                          torch.float32, "cpu")
    C = a.completion_len
    cfg = config_from_dict({
        "model": folder, "budget": 1e30, "task": "arithmetic-easy", "backend": "hf",
        "lengths": {"prompt": 6, "completion": C},
        "grpo": {"temperature": 1.0, "max_completion_len": C, "micro_batch": a.micro_batch},
        "lora": {"rank": 8, "alpha": 16, "targets": "all"},
        "schedule": {"prompts_per_step": a.prompts, "n_train": a.n_gen, "max_n_gen": a.n_gen}})
    zero = FlopBreakdown()
    sched = Schedule(rho_target=0.5, prompts_per_step=a.prompts, n_gen=a.n_gen, n_train=a.n_gen, mu=1, steps=2,
                     learning_rate=1e-5, lora_rank=8, flops_per_step=zero, flops=zero)
    engine = SeedAxisEngine(cfg, sched, [0], device="cpu")
    real_update, seen = grpo.update_seeds, {}      # the pilot's update (grpo.update calls it too)

    def measured_update(*args, **kw):
        gc.collect()
        before = _proc("VmRSS:")
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")                       # VmHWM := VmRSS
        out = real_update(*args, **kw)
        seen["transient"] = _proc("VmHWM:") - before
        return out

    grpo.update_seeds = measured_update
    problems = load_task("arithmetic-easy", split="train", seed=0)
    for s in range(2):
        batch = problems[s * a.prompts:(s + 1) * a.prompts]
        engine.step([0], [batch])
    mem = schedule_memory(cfg, sched, prompt_len=6, dtype_bytes=4, overhead=0.0)
    plan = mem.update_peak - mem.static
    G = 2 ** 30
    print(f"| {a.model} | {a.prompts}×{a.n_gen}, ≤{C} tok, micro-batch {a.micro_batch} | "
          f"{seen['transient'] / G:.2f} GiB | {plan / G:.2f} GiB (activations {mem.activations / G:.2f}, "
          f"logits {mem.update_logits / G:.2f}) | {seen['transient'] / plan:.2f} |")
    engine.backend.close()
    work.cleanup()


if __name__ == "__main__":
    main()
