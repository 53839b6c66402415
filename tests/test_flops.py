"""race.flops.formulas: hand-checked numbers, identities between formulas, and agreement with
torch's FlopCounterMode on tiny real models (via bench/flop_accuracy.py, which prints
the same comparisons as a table)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from race.flops.architectures import read_arch
from race.flops.formulas import (ArchSpec, LoRASpec, RewardModelSpec, attention_flops, forward_flops,
                        forward_flops_per_token, learning_flops, lora_param_count, matmul_params,
                        param_count, reward_flops, search_flops, summarize)

ROOT = Path(__file__).resolve().parents[1]

# Qwen2.5-1.5B: hidden 1536, 28 layers, 12 heads, 2 KV heads, head_dim 128, MLP 8960,
# vocab 151936, tied embeddings, q/k/v biases.
QWEN15 = ArchSpec("Qwen2.5-1.5B", hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                  head_dim=128, intermediate_size=8960, vocab_size=151936,
                  tie_word_embeddings=True, qkv_bias=True)
# The 0.74 M arithmetic model RACE ships (race/tiny-arith, docs/tiny-models.md).
TINY = ArchSpec("tiny", hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32,
                intermediate_size=512, vocab_size=15, tie_word_embeddings=True, qkv_bias=True)


# ---------------------------------------------------------------- derived by hand

def test_qwen25_15b_by_hand():
    # One layer's matmul weights:
    #   q 1536·1536 = 2,359,296   k 1536·256 = 393,216   v 393,216   o 2,359,296
    #   attention: 5,505,024;  MLP gate/up/down 3·1536·8960 = 41,287,680
    #   layer: 46,792,704;  28 layers: 1,310,195,712
    # LM head (counted although tied): 151936·1536 = 233,373,696
    assert matmul_params(QWEN15) == 1_310_195_712 + 233_373_696 == 1_543_569_408
    # Parameters: + biases (1536+256+256 = 2,048) and 2 norms (3,072) per layer
    # = 46,797,824 · 28 = 1,310,339,072; + embedding once (tied) + final norm 1,536
    # = 1,543,714,304 (the published "1.54B").
    assert param_count(QWEN15) == 1_543_714_304
    # Decode step at context 1024: 2·N_matmul = 3,087,138,816
    # + attention 4·L·H·d·ctx = 4·28·12·128·1024 = 176,160,768
    assert forward_flops_per_token(QWEN15, 1024) == 3_263_299_584
    # LoRA r=8, all 7 modules, per layer: q 8·3072 = 24,576  k 8·1792 = 14,336  v 14,336
    # o 24,576  gate/up/down 3·8·10496 = 251,904  -> 329,728 · 28 = 9,232,384
    assert lora_param_count(QWEN15, LoRASpec(rank=8)) == 9_232_384
    # An unmerged adapter adds 2·N_lora per token.
    assert forward_flops_per_token(QWEN15, 1024, lora=LoRASpec(rank=8)) == \
        3_263_299_584 + 2 * 9_232_384


def test_references_tiny_model():
    assert param_count(TINY) == 740_864
    assert lora_param_count(TINY, LoRASpec(rank=8)) == 67_584


def test_attention_conventions():
    # causal: T(T+1)/2 entries per head, eager: T²; 4·d FLOPs per entry per head per layer
    per_entry = 4 * 28 * 12 * 128
    assert attention_flops(QWEN15, 100) == per_entry * 5050
    assert attention_flops(QWEN15, 100, causal=False) == per_entry * 10_000
    # Summing the marginal per-token cost over positions 1..T gives the causal forward.
    t = 37
    assert sum(forward_flops_per_token(QWEN15, i) for i in range(1, t + 1)) == \
        pytest.approx(forward_flops(QWEN15, t), rel=1e-12)


# ---------------------------------------------------------------- identities

def test_full_finetune_is_three_forwards():
    for causal in (True, False):
        assert learning_flops(QWEN15, prompt_len=64, completion_len=192, sequences=3,
                              causal=causal) == \
            pytest.approx(3 * 3 * forward_flops(QWEN15, 256, causal=causal), rel=1e-12)


def test_lora_learning_between_bounds():
    # Frozen base: matmul backward ≤ 1× forward (less: layer 0's q/k/v have no input
    # grad), attention backward 2× forward, LoRA ≤ 3× its forward 2·N_lora per token.
    # So ≈ (4N + 6·N_lora)·T + 3·attention, from above.
    lora = LoRASpec(rank=16)
    t = 256
    got = learning_flops(QWEN15, prompt_len=64, completion_len=192, sequences=1, lora=lora)
    upper = 2 * forward_flops(QWEN15, t) + attention_flops(QWEN15, t) \
        + 6 * lora_param_count(QWEN15, lora) * t
    assert 0.97 * upper < got < upper


def test_learning_terms_compose():
    lora = LoRASpec(rank=8)
    kw = dict(prompt_len=100, completion_len=300, sequences=5, lora=lora)
    one = learning_flops(QWEN15, **kw)
    fwd_lora, fwd_base = 5 * forward_flops(QWEN15, 400, lora=lora), 5 * forward_flops(QWEN15, 400)
    assert learning_flops(QWEN15, mu=3, **kw) == pytest.approx(3 * one + fwd_lora)
    assert learning_flops(QWEN15, ref_logprobs=True, **kw) == pytest.approx(one + fwd_base)
    assert learning_flops(QWEN15, grad_checkpointing=True, **kw) > one + 0.8 * fwd_lora
    # race.engine.grpo: old log-probs from iteration 1; logits only on the last C + 1 positions,
    # which saves the LM head (2·V·h forward + 2·V·h backward with LoRA) on P − 1 positions
    lean = learning_flops(QWEN15, mu=3, old_logprob_forward=False, **kw)
    assert lean == pytest.approx(3 * one)
    kept = learning_flops(QWEN15, completion_logits_only=True, **kw)
    assert one - kept == pytest.approx(5 * 99 * 4 * 151936 * 1536)


def test_search_prefix_sharing_and_linearity():
    kw = dict(prompt_len=200, completion_len=500)
    one = search_flops(QWEN15, n=1, **kw)
    shared = search_flops(QWEN15, n=8, **kw)
    separate = search_flops(QWEN15, n=8, prefix_shared=False, **kw)
    assert separate == pytest.approx(8 * one)
    prefill = one - search_flops(QWEN15, n=2, **kw) + one  # one prefill = 2·one − shared(2)
    assert separate - shared == pytest.approx(7 * prefill)
    # decode with a KV cache ≈ 2·N_matmul per generated token, plus attention
    assert shared > 8 * 499 * 2 * matmul_params(QWEN15)


def test_reward_flops():
    assert reward_flops(None, prompt_len=10, completion_len=10, sequences=4) == 0.0
    prm = RewardModelSpec(QWEN15, num_labels=2, head_hidden_size=1536)
    lm_head = 2 * 151936 * 1536
    head = 2 * (1536 * 1536 + 1536 * 2)
    assert reward_flops(prm, prompt_len=10, completion_len=30, sequences=2) == \
        pytest.approx(2 * (forward_flops(QWEN15, 40) + 40 * (head - lm_head)))


def test_summarize_is_json_ready():
    prm = RewardModelSpec(QWEN15, num_labels=2, head_hidden_size=1536)
    s = summarize(QWEN15, lora=LoRASpec(), prompt_len=150, completion_len=600, n=8, reward=prm)
    json.dumps(s)
    per = s["per_prompt_flops"]
    assert per["total"] == pytest.approx(per["search"] + per["learning"] + per["reward"])
    assert sum(s["shares"].values()) == pytest.approx(1.0)
    assert s["rho"] == pytest.approx(per["learning"] / per["total"])
    assert s["lora_params"] == 9_232_384 and s["params"] == 1_543_714_304
    assert s["forward_flops_per_token"]["context_len"] == 450.0


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("call, message", [
    (lambda: forward_flops(QWEN15, -1), "seq_len"),
    (lambda: search_flops(QWEN15, prompt_len=-3, completion_len=5, n=2), "prompt_len"),
    (lambda: search_flops(QWEN15, prompt_len=3, completion_len=5, n=0), "n must be"),
    (lambda: learning_flops(QWEN15, prompt_len=3, completion_len=5, sequences=1, mu=0), "mu"),
    (lambda: learning_flops(QWEN15, prompt_len=3, completion_len=float("nan"), sequences=1),
     "completion_len"),
    (lambda: LoRASpec(rank=0), "rank"),
    (lambda: LoRASpec(target_modules=("q_proj", "lm_head")), "lm_head"),
    (lambda: ArchSpec("x", 64, 2, 6, 4, 16, 96, 10, True), "num_kv_heads"),
    (lambda: read_arch({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "num_hidden_layers": "two"}), "num_hidden_layers"),
])
def test_bad_input_names_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_read_arch_families():
    mixtral = read_arch({
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}).arch
    assert (mixtral.num_experts, mixtral.moe_intermediate_size) == (8, 14336)
    assert not mixtral.tie_word_embeddings
    assert param_count(mixtral) == pytest.approx(46.7e9, rel=0.01)   # "46.7B"
    assert matmul_params(mixtral) == pytest.approx(12.9e9, rel=0.02)  # "12.9B active"
    gemma = read_arch({"model_type": "gemma", "hidden_size": 3072,
                                     "intermediate_size": 24576, "num_hidden_layers": 28,
                                     "num_attention_heads": 16, "num_key_value_heads": 16,
                                     "head_dim": 256, "vocab_size": 256000}).arch
    assert gemma.tie_word_embeddings and gemma.head_dim == 256
    assert param_count(gemma) == pytest.approx(8.54e9, rel=0.01)     # Gemma-7B: 8.54B
    nested = read_arch({"model_type": "x", "text_config": {"model_type": "llama",
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 96, "vocab_size": 10}}, name="vlm").arch
    assert nested.name == "vlm" and nested.hidden_size == 64
    assert ArchSpec(**QWEN15.to_dict()) == QWEN15


def test_flops_module_imports_without_torch():
    code = "import sys, race.flops.formulas, race.flops.catalog; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ---------------------------------------------------------------- FlopCounterMode

@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("flop_accuracy",
                                                  ROOT / "bench" / "flop_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead
    yield module
    torch.set_num_threads(threads)


COUNTER_CASES = [
    *[(arch, q) for arch in ("qwen2", "llama", "qwen3", "gemma")
      for q in ("forward", "lora_fwd_bwd", "full_fwd_bwd")],
    ("mistral", "forward"), ("mistral", "lora_fwd_bwd"),
    ("qwen2", "lora_grad_ckpt"), ("gemma2", "lora_grad_ckpt"),   # early stop / post-MLP norm
    ("qwen2", "grpo_step"),                                       # μ=2, old + ref log-probs
    ("qwen3", "grpo_step_kept_logits"),                           # as race.engine.grpo runs it
    ("qwen2", "search_kv"), ("qwen3", "search_kv"), ("llama", "search_lora_kv"),
    ("qwen2", "generate_n2"),
    ("qwen2", "reward_seqcls"), ("llama", "reward_prm_head"),
    ("mixtral", "forward"), ("qwen2_moe", "full_fwd_bwd"),
]


@pytest.mark.parametrize("arch, quantity", COUNTER_CASES)
def test_formula_matches_flop_counter(bench, arch, quantity):
    counted, predicted = bench.measure(arch, quantity)
    assert predicted == pytest.approx(counted, rel=0.01)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "gemma2", "mixtral", "qwen2_moe"])
def test_param_counts_match_torch(bench, arch):
    model, spec = bench.build_model(arch)
    assert param_count(spec) == sum(p.numel() for p in model.parameters())
    if arch in ("qwen2", "qwen3"):
        peft_model, lora = bench.add_lora(model, spec)
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert lora_param_count(spec, lora) == trainable
