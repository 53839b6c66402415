"""A prepared GPU check: a few real GRPO steps of RACE's engine on randomly initialised
Qwen2.5-1.5B / 0.5B (the shipped configs; throughput does not depend on the weights).

    PYTHONPATH=. python bench/gpu_check.py                  # one CUDA GPU, bf16, < 4 min on an H200
    PYTHONPATH=. python bench/gpu_check.py --cpu            # reduced: tiny random Qwen2, fp32, seconds

Needs torch, transformers, peft, PyYAML, tabulate — no network, no vLLM, no optuna (the HF
backend samples). Per model it builds a random bf16 model from race/assets/configs, saves it
with the shipped tiny policy's character tokenizer (ids < 23, valid in any vocabulary; a random
model rarely emits its end token, so completions run to full length), and runs
``race.engine.seed_axis.SeedAxisEngine`` steps — the same rollout, reward, GRPO update and adapter sync a
pilot runs — with arithmetic prompts. It prints, after ``--warmup`` untimed steps:

- rollout tokens/s (completion tokens sampled / rollout seconds);
- update tokens/s (prompt + completion tokens trained, × μ / update seconds);
- update-phase MFU: the FLOP meter's C_learning / update seconds, against a bf16 (fp32 with
  --cpu) matmul peak measured in the same run;
- peak memory (torch.cuda.max_memory_allocated) against race.flops.memory's plan for the schedule;
- then the same for a lockstep group (``--lockstep S``, default 3 seeds: race.engine.lean_engine), whose
  tokens/s are the group's, beside the solo row (the plan column stays the solo pilot's).

Target (recorded, not asserted): update-phase MFU ≥ 40 % of the measured peak for 1.5B + LoRA.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# the 1.5B first: it carries the MFU target, so a run cut short still measures it
GPU_MODELS = ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")
# the reduced (CPU) model: Qwen2 layout, a vocabulary larger than the tokenizer's
TINY_RANDOM = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 128,
               "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "rope_theta": 10000.0,
               "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "hidden_act": "silu"}


def matmul_peak(device: str, dtype, size: int, reps: int) -> float:
    """Best FLOP/s of an n×n×n matmul in ``dtype`` (the MFU denominator)."""
    import torch

    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = 0.0
    for _ in range(3):
        _sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = max(best, 2.0 * size ** 3 * reps / (time.perf_counter() - t))
    return best


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_random_model(config: dict, folder: str, dtype, device: str) -> str:
    """Random weights for ``config`` saved with the tiny policy's tokenizer into ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures",
                                                                                "transformers_version")})
    cfg.architectures = config.get("architectures")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(folder)
    del model
    tiny = os.path.join(ROOT, "race", "assets", "tiny-arith")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tiny, name), folder)
    return folder


def check_model(name: str, config: dict, args, device: str, peak: float, workdir: str, *, seeds: int = 1) -> dict:
    """One model's row: one ``race.engine.seed_axis.SeedAxisEngine`` carrying ``seeds`` seeds in one batch
    (1: a solo pilot; throughput is the group's: tokens of all seeds per second)."""
    import torch

    from race.flops import formulas as F
    from race.flops.architectures import read_arch
    from race.config.configfile import config_from_dict
    from race.flops.memory import schedule_memory
    from race.engine.seed_axis import SeedAxisEngine
    from race.core.records import FlopBreakdown, Schedule
    from race.tasks import load_task

    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    # a lockstep group of S seeds runs S × micro_batch sequences per pass: it gets micro_batch / S per
    # seed (whole prompt groups), so that its pass holds what the solo row's does (an H200 ran out of
    # memory for Qwen2.5-1.5B × 3 seeds at the solo row's 32 sequences each)
    micro = args.micro_batch
    if seeds > 1 and micro:
        micro = max(args.n_gen, micro // seeds // args.n_gen * args.n_gen)
    t0 = time.perf_counter()
    folder = build_random_model(config, os.path.join(workdir, name.replace("/", "--")), dtype, device)
    build_s = time.perf_counter() - t0
    cfg = config_from_dict({
        "model": folder, "budget": 1e30, "task": "arithmetic-easy", "backend": "hf",
        "lengths": {"prompt": 6, "completion": args.completion_len},
        "grpo": {"temperature": 1.0, "max_completion_len": args.completion_len, "micro_batch": micro,
                 "grad_checkpointing": args.grad_checkpointing},
        "lora": {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank, "targets": "all"},
        "schedule": {"prompts_per_step": args.prompts, "n_train": args.n_gen, "max_n_gen": args.n_gen}})
    zero = FlopBreakdown()
    schedule = Schedule(rho_target=0.5, prompts_per_step=args.prompts, n_gen=args.n_gen, n_train=args.n_gen,
                        mu=args.mu, steps=args.steps, learning_rate=1e-5, lora_rank=args.lora_rank,
                        flops_per_step=zero, flops=zero)
    base = 0
    if cuda:                  # what an earlier model left (a failed one's tensors wait for the cycle collector)
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    lengths = []

    def record_lengths(batch, n):
        lengths.append((sum(map(len, batch.prompt_ids)) * n, sum(len(c) for g in batch.completion_ids for c in g)))

    # one engine for any number of seeds: a solo pilot is a seed axis of length 1
    engine = SeedAxisEngine(cfg, schedule, list(range(seeds)), device=device)
    generate_seeds = engine.backend.generate_seeds

    def recording_generate_seeds(*a, **kw):
        batches = generate_seeds(*a, **kw)
        for b in batches:
            record_lengths(b, kw["n"])
        return batches

    engine.backend.generate_seeds = recording_generate_seeds

    def step(batch):
        records = engine.step(list(range(seeds)), [batch] * seeds)
        return sum((r.flops for r in records), FlopBreakdown())

    def walls():
        return {k: sum(w[k] for w in engine.walls) for k in ("rollout", "update", "sync", "reward")}

    def reset():
        for w in engine.walls:
            w.update(rollout=0.0, update=0.0, sync=0.0, reward=0.0)

    setup_s = time.perf_counter() - t0 - build_s
    problems = load_task("arithmetic-easy", split="train", seed=0)
    spent = FlopBreakdown()
    for k in range(args.warmup + args.steps):
        if k == args.warmup:
            _sync(device)
            reset()
            spent, lengths = FlopBreakdown(), []
        spent = spent + step(problems[k * args.prompts:(k + 1) * args.prompts])
    _sync(device)
    rollout_tokens = sum(c for _, c in lengths)
    update_tokens = args.mu * sum(p + c for p, c in lengths)
    w = walls()
    mem = schedule_memory(cfg, schedule, prompt_len=sum(p for p, _ in lengths) / max(1, len(lengths))
                          / (args.prompts * args.n_gen), dtype_bytes=2 if cuda else 4,
                          overhead=1024 ** 3 if cuda else 0.0)
    arch = read_arch(config, allow_approximate=True).arch
    out = {
        "model": name, "engine": f"lockstep ({seeds} seeds)" if seeds > 1 else "solo",
        "params": F.param_count(arch), "device": device, "dtype": str(dtype).replace("torch.", ""),
        "batch": f"{args.prompts}×{args.n_gen}, ≤{args.completion_len} tok, μ={args.mu}"
                 + (f", {micro}/pass" if micro else ""),
        "micro_batch": micro, "grad_checkpointing": args.grad_checkpointing,
        "steps_timed": args.steps, "rollout_s": w["rollout"], "update_s": w["update"], "sync_s": w["sync"],
        "rollout_tok_s": rollout_tokens / w["rollout"] if w["rollout"] else 0.0,
        "update_tok_s": update_tokens / w["update"] if w["update"] else 0.0,
        "search_flops": spent.search, "learning_flops": spent.learning,
        "update_flop_s": spent.learning / w["update"] if w["update"] else 0.0,
        "rollout_flop_s": spent.search / w["rollout"] if w["rollout"] else 0.0,
        "peak_flop_s": peak, "build_s": build_s, "setup_s": setup_s,
        "peak_mem_measured": torch.cuda.max_memory_allocated() - base if cuda else None, "mem_before": base,
        "peak_mem_plan": mem.peak, "plan_rollout_peak": mem.rollout_peak, "plan_update_peak": mem.update_peak,
    }
    out["update_mfu"] = out["update_flop_s"] / peak if peak else 0.0
    engine.close()
    del engine
    if cuda:
        torch.cuda.empty_cache()
    shutil.rmtree(folder, ignore_errors=True)
    return out


def render(rows: list[dict], peak: float, dtype: str) -> str:
    from tabulate import tabulate

    gib = 1024 ** 3
    table = [[r["model"], r.get("engine", "solo"),
              f"{r['params'] / 1e9:.2f} B" if r["params"] >= 1e8 else f"{r['params'] / 1e6:.2f} M",
              r["batch"], f"{r['rollout_tok_s']:,.0f}", f"{r['update_tok_s']:,.0f}",
              f"{r['update_flop_s'] / 1e9:,.1f}", f"{100 * r['update_mfu']:.1f} %",
              "n/a (CPU)" if r["peak_mem_measured"] is None else f"{r['peak_mem_measured'] / gib:.1f} GiB",
              f"{r['peak_mem_plan'] / gib:.2f} GiB"] for r in rows]
    head = [f"matmul peak ({dtype}, measured in this run): {peak / 1e9:,.1f} GFLOP/s"]
    return "\n".join(head) + "\n\n" + tabulate(
        table, headers=["model", "engine", "params", "B_p×n_gen", "rollout tok/s", "update tok/s", "update GFLOP/s",
                        "update MFU", "peak mem", "plan"], tablefmt="github", disable_numparse=True) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="reduced mode: a tiny random Qwen2 on CPU in fp32 (seconds)")
    p.add_argument("--models", nargs="*", default=None, help="shipped configs (default: Qwen2.5-1.5B, then 0.5B)")
    p.add_argument("--prompts", type=int, default=None, help="B_p per step")
    p.add_argument("--n-gen", type=int, default=None, help="rollouts per prompt (all trained)")
    p.add_argument("--completion-len", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per update pass")
    p.add_argument("--mu", type=int, default=1)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--lockstep", type=int, default=3, metavar="S",
                   help="after each model's solo row, a lockstep group of S seeds on the same schedule (0: none)")
    p.add_argument("--json", default=None, help="also write the rows to this file (rewritten after every model)")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="start no further model after this many seconds (0: no limit)")
    args = p.parse_args(argv)

    import torch

    from race.flops.catalog import load_hf_config

    if not args.cpu and not torch.cuda.is_available():
        p.error("no CUDA GPU: run on a GPU machine, or pass --cpu for the reduced check")
    device = "cpu" if args.cpu else "cuda"
    defaults = dict(prompts=2, n_gen=4, completion_len=8, micro_batch=None) if args.cpu else \
        dict(prompts=16, n_gen=8, completion_len=512, micro_batch=32)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    dtype = torch.float32 if args.cpu else torch.bfloat16
    t0 = time.perf_counter()
    peak = matmul_peak(device, dtype, 512 if args.cpu else 8192, 5 if args.cpu else 50)
    models = [("tiny-random-qwen2", TINY_RANDOM)] if args.cpu and not args.models else \
        [(m, load_hf_config(m)) for m in (args.models or GPU_MODELS)]
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0],
           "device_name": torch.cuda.get_device_name() if not args.cpu else "CPU",
           "command": "PYTHONPATH=. python bench/gpu_check.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows, failed = [], []

    def dump() -> None:          # after every model: a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump({"peak_flop_s": peak, "env": env, "rows": rows, "failed": failed}, fh, indent=2)

    with tempfile.TemporaryDirectory(prefix="race-gpu-check-") as work:
        for name, config in models:
            if args.max_seconds and rows and time.perf_counter() - t0 > args.max_seconds:
                failed.append({"model": name, "error": f"skipped: past --max-seconds {args.max_seconds:g}"})
                print(f"{name}: skipped (past --max-seconds)", file=sys.stderr, flush=True)
                continue
            for seeds in ((1, args.lockstep) if args.lockstep > 1 else (1,)):
                what = name if seeds == 1 else f"{name} lockstep ×{seeds}"
                if seeds > 1 and args.max_seconds and time.perf_counter() - t0 > args.max_seconds:
                    failed.append({"model": what, "error": f"skipped: past --max-seconds {args.max_seconds:g}"})
                    continue
                try:
                    rows.append(check_model(name, config, args, device, peak, work, seeds=seeds))
                    outcome = "done"
                except Exception as exc:          # one model failing must not lose the others' rows
                    import traceback

                    traceback.print_exc()
                    failed.append({"model": what, "error": f"{type(exc).__name__}: {exc}"})
                    outcome = "FAILED"
                if device.startswith("cuda"):  # after the except block: its traceback no longer holds tensors
                    import gc

                    gc.collect()
                    torch.cuda.empty_cache()
                print(f"{what}: {outcome} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
                dump()
    if rows:
        print(render(rows, peak, "fp32" if args.cpu else "bf16"))
    for f in failed:
        print(f"{f['model']}: {f['error']}")
    print(f"torch {env['torch']}; transformers {env['transformers']}; {env['device_name']}; "
          f"wall {time.perf_counter() - t0:.0f} s; command: {env['command']}")
    dump()
    return 1 if failed and not rows else 0


if __name__ == "__main__":
    sys.exit(main())
