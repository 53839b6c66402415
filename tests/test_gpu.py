"""Checks that need a CUDA GPU (marker ``gpu``; skipped where there is none, and left out of the
README's test command). On a GPU machine, from source, with no network and no optuna:

    PYTHONPATH=. python -m pytest -m gpu -q tests/test_gpu.py

They exercise what CPU runs cannot: bf16 weights, CUDA sampling, the fused optimizer on the
device, and race.flops.memory's plan against torch.cuda.max_memory_allocated.
"""
import os
import sys

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_bf16_training_logprobs_on_cuda_match_fp32_on_cpu():
    """The update's log-probs of the same tokens, bf16 on the GPU against fp32 on the CPU."""
    from race.engine import grpo
    from race.run.api import build_config
    from race.engine.loading import load_policy, seed_everything
    from race.tasks import load_task

    cfg = build_config(None)
    problems = load_task(cfg.task, split="eval", n=16)
    logps = {}
    for device in ("cpu", "cuda"):
        seed_everything(0)
        tok, policy, _ = load_policy(cfg, device=device)
        prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        completions = [tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for p in problems]
        batch = grpo.pack(prompts, completions, list(range(len(problems))), [0.0] * len(problems),
                          tok.pad_token_id, device)
        grouped = hasattr(policy, "forward_grouped")   # the lean path: a one-seed lockstep policy (a seed axis)
        with torch.no_grad():
            logp, _ = grpo.completion_logprobs(policy, grpo.stack_batches([batch], tok.pad_token_id)
                                               if grouped else batch)
        logps[device] = ((logp[0] if grouped else logp).float().cpu(), batch.completion_mask.bool().cpu())
        if device == "cuda":                       # the base weights are bf16 there (the lean path's tensors)
            assert getattr(policy, "embed", None) is None or policy.embed.dtype == torch.bfloat16
    (a, mask), (b, _) = logps["cpu"], logps["cuda"]
    diff = (a - b).abs()[mask]
    assert diff.mean() < 0.05 and diff.max() < 0.5, (diff.mean(), diff.max())


def test_a_cuda_pilot_raises_heldout_accuracy():
    """The CPU test's seeded on-policy pilot (2e11 FLOPs), run on the GPU in bf16."""
    from race.run.api import build_config
    from race.flops.grid import plan_grid
    from race.engine.evaluation import evaluate
    from race.engine.loading import load_rollout
    from race.engine.pilot import run_pilot
    from race.tasks.rewards import get_reward
    from race.tasks import load_task

    cfg = build_config(None, budget=2e11, grid="0.6,0.73,0.84")
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[1]
    _, backend = load_rollout(cfg, device="cuda")
    base = evaluate(backend, load_task(cfg.task, split="eval", n=500), get_reward("sparse"),
                    samples=4, temperature=1.0, max_new_tokens=6, seed=0)
    backend.close()
    result = run_pilot(cfg, schedule, seed=0, device="cuda")
    before, after = sum(base["pass@1"]) / 500, result.score("pass@1")
    assert after - before >= 0.05, (before, after)
    assert result.flops.total == pytest.approx(2e11, rel=0.02)
    assert abs(result.rho - schedule.rho) < 0.03
    assert result.extra["device"] == "cuda" and result.extra["reward_errors"] == 0


def test_memory_plan_bounds_the_measured_peak_on_cuda(tmp_path):
    """race.flops.memory's plan for a random Qwen2.5-0.5B schedule against max_memory_allocated.

    The plan must not under-estimate (it refuses schedules on it) and should not be more than
    twice the measured peak. The plan's flat 1 GiB overhead (CUDA context, allocator slack) is
    taken out: max_memory_allocated does not see the context."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    from race.flops.catalog import load_hf_config

    args = gpu_check.argparse.Namespace(prompts=4, n_gen=8, completion_len=128, micro_batch=16, mu=1,
                                        lora_rank=8, steps=1, warmup=1, grad_checkpointing=False)
    name = "Qwen/Qwen2.5-0.5B-Instruct"
    row = gpu_check.check_model(name, load_hf_config(name), args, "cuda", 1e15, str(tmp_path))
    measured, plan = row["peak_mem_measured"], row["peak_mem_plan"] - 1024 ** 3
    assert measured <= 1.10 * plan, (measured / 2 ** 30, plan / 2 ** 30)
    assert plan <= 2.0 * measured, (measured / 2 ** 30, plan / 2 ** 30)
