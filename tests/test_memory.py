"""Memory planning (race.flops.memory): hand-computed numbers, the plan's refusal, and the terms
checked against the tensors the engine really allocates on CPU."""
import os

import pytest
from click.testing import CliRunner

from conftest import PILOTS
from race.flops import formulas as F
from race.config.configfile import ConfigError
from race.flops.memory import (GiB, activation_bytes, estimate_memory, kv_cache_bytes, parse_bytes,
                         sampling_copy_bytes, update_sequences)
from race.flops.catalog import load_arch

TINY = load_arch("race/tiny-arith")          # h 128, 3 layers, 4 heads (d 32), 2 KV heads, MLP 512, V 23
QWEN15 = load_arch("Qwen/Qwen2.5-1.5B-Instruct")
LORA = F.LoRASpec(rank=8)


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 * 2 ** 30
    assert parse_bytes("80 GB") == 80 * 10 ** 9
    assert parse_bytes("141e9") == 141 * 10 ** 9
    assert parse_bytes("512MiB") == 2 ** 29
    for bad in ("80Gx", "-1GiB", "", "0"):
        with pytest.raises(ConfigError, match="gpu_memory"):
            parse_bytes(bad)


def test_terms_by_hand_qwen_1_5b():
    est = estimate_memory(QWEN15, LORA, prompt_len=150, completion_len=1024, rollouts=64, train_sequences=8,
                          dtype_bytes=2, sampler="vllm", overhead=GiB)
    assert est.weights == 1_543_714_304 * 2
    assert est.sampling_copy == 1_543_714_304 * 2               # vLLM's own copy of the base
    # LoRA r=8 on 7 modules: 28 · 8 · (1536+1536 + 1536+256 + 1536+256 + 1536+1536 + 3·(1536+8960))
    n_lora = 28 * 8 * (3072 + 1792 + 1792 + 3072 + 3 * 10496)
    assert F.lora_param_count(QWEN15, LORA) == n_lora
    assert est.lora_state == 16 * n_lora                        # fp32 param, grad, exp_avg, exp_avg_sq
    # 64 sequences × 1174 tokens × 28 layers × 2 (K, V) × 2 KV heads × 128 × 2 bytes
    assert est.kv_cache == 64 * 1174 * 28 * 2 * 2 * 128 * 2
    assert est.sampling_logits == 64 * 151936 * (2 + 8)
    per_token_layer = 4 * 1536 + 3 * 1536 + 2 * 256 + 4 * 8960 + 7 * 8
    assert est.activations == 8 * 1174 * 28 * per_token_layer * 2
    assert est.update_logits == 8 * 1025 * 151936 * 4 * 2 + 2 ** 24 * 20        # 4 bf16 copies, one fp32 block
    assert est.peak == max(est.rollout_peak, est.update_peak)
    assert est.rollout_peak == est.weights * 2 + est.lora_state + GiB + est.kv_cache + est.sampling_logits
    ckpt = activation_bytes(QWEN15, LORA, tokens=8 * 1174, dtype_bytes=2, grad_checkpointing=True)
    assert ckpt == 8 * 1174 * (28 * 1536 + per_token_layer) * 2
    assert ckpt < est.activations / 10


def test_micro_batch_sequences():
    from race.core.records import FlopBreakdown, Schedule

    s = Schedule(rho_target=0.5, prompts_per_step=8, n_gen=16, n_train=8, mu=1, steps=10, learning_rate=1e-5, lora_rank=8,
                 flops_per_step=FlopBreakdown(1, 1, 0), flops=FlopBreakdown(10, 10, 0))
    assert update_sequences(s, None) == 64
    assert update_sequences(s, 16) == 16 and update_sequences(s, 20) == 16
    assert update_sequences(s, 3) == 8            # a prompt's group stays whole
    assert update_sequences(s, 1000) == 64


def test_plan_shows_memory_and_refuses_what_cannot_fit():
    from race.run.cli import main

    cfg = os.path.join(PILOTS, "qwen2.5-1.5b-sparse.yaml")
    r = CliRunner().invoke(main, ["plan", cfg, "--gpu-memory", "141GiB"])
    assert r.exit_code == 0, r.output
    assert "est. GPU mem" in r.output and "GiB" in r.output
    r = CliRunner().invoke(main, ["plan", cfg, "--gpu-memory", "8GiB"])
    assert r.exit_code == 2
    err = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(err) == 1 and "needs an estimated" in err[0] and "gpu_memory is 8.00 GiB" in err[0]
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["plan", cfg, "--gpu-memory", "lots"])
    assert r.exit_code == 2 and "gpu_memory 'lots' is not a memory size" in r.output


def test_gpu_memory_in_config_and_json_plan(tmp_path):
    import json

    import yaml

    from race.run.cli import main

    raw = yaml.safe_load(open(os.path.join(PILOTS, "qwen2.5-1.5b-sparse.yaml")))
    raw["gpu_memory"] = "4GiB"
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(raw))
    r = CliRunner().invoke(main, ["plan", str(p)])
    assert r.exit_code == 2 and "gpu_memory is 4.00 GiB" in r.output
    r = CliRunner().invoke(main, ["plan", str(p), "--gpu-memory", "1TiB", "--json"])
    assert r.exit_code == 0, r.output
    mem = json.loads(r.output)["memory"]
    assert len(mem) == 5 and all(m["peak"] < 2 ** 40 for m in mem)
    assert all(m["peak"] == max(m["rollout_peak"], m["update_peak"]) for m in mem)


# ----------------------------------------------------------------------------- against torch on CPU

@pytest.fixture(scope="module")
def lean():
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import TINY_MODEL
    from race.engine.backends.lockstep import LockstepLM

    m = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)
    m.requires_grad_(False)
    return LockstepLM(m, rank=8, alpha=16, targets=LORA.target_modules, seeds=[0])


def test_kv_cache_formula_is_the_sampler_cache(lean):
    """The lean sampler's cache for B_p prompts × n rollouts of (prompt + max new tokens)."""
    prompts, n, max_len = 5, 8, 6 + 6
    cache = lean.repeat_cache(lean.new_cache(prompts, max_len), n)
    actual = sum(t.nbytes for t in cache.k + cache.v)
    assert actual == kv_cache_bytes(TINY, sequences=prompts * n, tokens=max_len, dtype_bytes=4)


def test_lean_sampling_copy_is_the_merged_weights(lean):
    lean.merge()
    actual = sum(t.nbytes for t in lean._merged[0].values())       # the one seed's merged weights
    assert actual == sampling_copy_bytes(TINY, LORA, "lean", 4)


def test_lora_state_is_params_grads_and_adam_moments(lean):
    import torch

    opt = torch.optim.AdamW([p for p in lean.parameters() if p.requires_grad], lr=1e-3)
    x = torch.tensor([[3, 4, 5, 6]])
    lean(x[None]).logits.sum().backward()          # a seed axis of 1
    opt.step()
    params = [p for p in lean.parameters() if p.requires_grad]
    actual = sum(p.nbytes + p.grad.nbytes for p in params)
    actual += sum(t.nbytes for st in opt.state.values() for k, t in st.items() if k != "step")
    est = estimate_memory(TINY, LORA, prompt_len=6, completion_len=6, rollouts=1, train_sequences=1, dtype_bytes=4)
    assert actual == est.lora_state
    opt.zero_grad(set_to_none=True)


def test_activation_formula_against_saved_tensors(lean):
    """Bytes autograd saves in an update forward (distinct storages, weights excluded) vs the
    formula: within 20 % for the tokens the lean path runs (each prompt once per group); the
    plan's figure (every sequence with its prompt) is an upper bound. (Measured 1.17× since the
    update packs prompts and completions: attention keeps views of the packed q/k/v of all
    tokens, which autograd saves whole.)"""
    import torch

    from race.engine import grpo

    G, n, P, C = 4, 8, 10, 6
    batch = grpo.pack([[5] * P] * G, [[6] * C] * (G * n), [i for i in range(G) for _ in range(n)],
                      [0.1] * (G * n), 0)
    weights = {t.untyped_storage().data_ptr() for t in [lean.embed, lean.lm_head, lean.norm]}
    for layer in lean.layers:
        for d in (layer.w, layer.b, layer.norms):
            weights |= {t.untyped_storage().data_ptr() for t in d.values()}
    weights |= {p.untyped_storage().data_ptr() for p in lean.parameters()}
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = max(seen.get(t.untyped_storage().data_ptr(), 0),
                                                   t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        one = grpo.stack_batches([batch], pad_id=0)             # a seed axis of 1
        lean.forward_grouped(one.prompt_ids, one.prompt_mask, one.group, one.completion_ids, one.completion_mask)
    measured = sum(v for k, v in seen.items() if k not in weights)
    shared = activation_bytes(TINY, LORA, tokens=G * P + G * n * C, dtype_bytes=4)
    full = activation_bytes(TINY, LORA, tokens=G * n * (P + C), dtype_bytes=4)
    assert 0.8 < measured / shared < 1.2, (measured, shared)
    assert measured < full


# ----------------------------------------------------------------------------- vLLM sleep mode

def _vllm_sparse(**over):
    import yaml

    from race.config.configfile import config_from_dict

    raw = yaml.safe_load(open(os.path.join(PILOTS, "qwen2.5-1.5b-sparse.yaml")))
    return config_from_dict({**raw, "backend": "vllm", **over})


def test_vllm_engine_holds_its_pool_unless_it_sleeps():
    """Awake, a vLLM engine keeps its KV-cache pool and weights through the update; asleep
    (level 1) it holds neither: the update phase differs by exactly those terms."""
    awake = estimate_memory(QWEN15, LORA, prompt_len=150, completion_len=1024, rollouts=64, train_sequences=8,
                            sampler="vllm")
    asleep = estimate_memory(QWEN15, LORA, prompt_len=150, completion_len=1024, rollouts=64, train_sequences=8,
                             sampler="vllm", vllm_sleep=True)
    lean = estimate_memory(QWEN15, LORA, prompt_len=150, completion_len=1024, rollouts=64, train_sequences=8,
                           sampler="lean", vllm_sleep=True)
    assert (awake.engine, asleep.engine, lean.engine) == ("awake", "asleep", "")
    assert awake.rollout_peak == asleep.rollout_peak
    base = awake.static + awake.activations + awake.update_logits
    assert awake.update_peak == base + awake.kv_cache + awake.sampling_logits
    assert asleep.update_peak == base - awake.sampling_copy
    assert lean.update_peak == lean.static + lean.activations + lean.update_logits
    assert "kv_cache" in dict(awake.largest(5)) and "sampling_copy" not in dict(asleep.largest(9))


def test_vllm_sleep_auto_turns_on_only_when_the_awake_plan_does_not_fit():
    from race.flops.grid import plan_grid
    from race.flops.memory import schedule_memory, wants_vllm_sleep

    cfg = _vllm_sparse()
    plan = plan_grid(cfg)
    awake = [schedule_memory(cfg, s, prompt_len=plan.prompt_len, vllm_sleep=False) for s in plan.schedules]
    asleep = [schedule_memory(cfg, s, prompt_len=plan.prompt_len, vllm_sleep=True) for s in plan.schedules]
    gpu = max(e.peak for e in asleep) * 1.01            # fits asleep, not awake (planned: 36.7 vs 49.8 GiB)
    assert max(e.peak for e in awake) > gpu
    assert wants_vllm_sleep("auto", awake[0], gpu) and not wants_vllm_sleep("auto", awake[0], 1e15)
    assert not wants_vllm_sleep("auto", awake[0], None) and wants_vllm_sleep("on", awake[0], None)
    assert not wants_vllm_sleep("off", awake[0], gpu)
    # the plan: auto sleeps where it must and says so; off refuses and names the way out
    fits = plan_grid(cfg.with_overrides(gpu_memory=gpu))
    engines = [m["engine"] for m in fits.extra["memory"]]
    assert engines == ["asleep" if a.peak > gpu else "awake" for a in awake] and "asleep" in engines
    from race.stats.report import render_plan

    assert "(vLLM sleeps)" in render_plan(fits)
    with pytest.raises(ConfigError, match="set vllm_sleep: auto"):
        plan_grid(_vllm_sparse(vllm_sleep=False, gpu_memory=gpu))   # YAML `off` is False
    with pytest.raises(ConfigError) as e:
        plan_grid(cfg.with_overrides(gpu_memory=max(e.peak for e in asleep) * 0.9))
    assert "vllm_sleep" not in str(e.value)             # sleeping already: other levers
