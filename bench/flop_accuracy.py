"""How close are race.flops.formulas' formulas to torch's FlopCounterMode?

    python bench/flop_accuracy.py            # markdown table: architecture × quantity
    python bench/flop_accuracy.py --json     # the same rows as JSON

Tiny random-init models (float32, ``attn_implementation="eager"``, MoE experts with
``experts_implementation="eager"``: the default grouped_mm kernel is invisible to the
counter) are run under ``torch.utils.flop_counter.FlopCounterMode`` and the counted
FLOPs are compared with the formula for the same computation. Eager attention
multiplies the full T×T score matrix, so formulas are called with ``causal=False``.
tests/test_flops.py imports ``measure`` from here, so the table and the tests check
the same thing.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from race.flops import formulas as flops  # noqa: E402
from race.flops.architectures import peft_module_paths, peft_target_modules, read_arch, resolve_lora_targets  # noqa: E402

PROMPT_LEN, COMPLETION_LEN, SEQUENCES, LORA_RANK = 10, 12, 2, 4
_COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
ARCHS = {  # model_type, extra config fields (what makes each family different)
    "qwen2": ("qwen2", dict(tie_word_embeddings=True)),                   # q/k/v bias, tied
    "llama": ("llama", dict(tie_word_embeddings=False)),                  # GQA, untied
    "mistral": ("mistral", dict(tie_word_embeddings=False)),
    "qwen3": ("qwen3", dict(head_dim=24, tie_word_embeddings=False)),     # q/k norm, d≠h/H
    "gemma": ("gemma", dict(head_dim=32)),                                # GeGLU, tied, d=32
    "gemma2": ("gemma2", dict(head_dim=32)),                              # 4 norms, softcaps
    "gemma3_text": ("gemma3_text", dict(head_dim=32)),                    # 4 norms, q/k norm, local layers
    "granite": ("granite", dict(attention_bias=True, mlp_bias=True)),     # multipliers, all biases
    "olmo2": ("olmo2", dict()),                                           # post-norms, full q/k norm
    "phi3": ("phi3", dict()),                                             # fused qkv_proj, gate_up_proj
    "starcoder2": ("starcoder2", dict()),                                 # plain GELU MLP, LayerNorm, biases
    "phi": ("phi", dict(qk_layernorm=True)),                              # parallel block, dense/fc1/fc2
    "gpt_neox": ("gpt_neox", dict()),                                     # fused query_key_value, parallel
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("qwen2_moe", dict(**_MOE, shared_expert_intermediate_size=80)),
    "qwen2_moe_dense0": ("qwen2_moe", dict(**_MOE, shared_expert_intermediate_size=80, mlp_only_layers=[0])),
    "qwen3_moe": ("qwen3_moe", dict(**_MOE)),
}
DENSE_QUANTITIES = ("forward", "lora_fwd_bwd", "full_fwd_bwd", "lora_grad_ckpt", "grpo_step",
                    "grpo_step_kept_logits", "search_kv", "search_lora_kv", "generate_n2",
                    "reward_seqcls", "reward_prm_head")
# LoRA reaches attention (and a shared expert) only: routed experts are 3-D parameters in transformers 5.
MOE_QUANTITIES = ("forward", "lora_fwd_bwd", "full_fwd_bwd", "lora_grad_ckpt", "grpo_step_kept_logits", "search_kv",
                  "search_lora_kv", "generate_n2")
# What a supported model type must match (tests/test_architectures.py checks these for every one)
CORE_QUANTITIES = ("forward", "full_fwd_bwd", "lora_fwd_bwd")


def hf_config(arch_name: str, **extra):
    from transformers import AutoConfig

    model_type, fields = ARCHS[arch_name]
    return AutoConfig.for_model(model_type, **{**_COMMON, **fields, **extra})


def is_moe(arch_name: str) -> bool:
    fields = ARCHS[arch_name][1]
    return bool(fields.get("num_experts") or fields.get("num_local_experts"))


def build_model(arch_name: str, auto_class: str = "AutoModelForCausalLM", **extra):
    """(random-init float32 model with eager attention, its ``ArchSpec`` read back from
    the HF config dict, so ``race.flops.architectures.read_arch`` is exercised too)."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = hf_config(arch_name, **extra)
    kwargs = {"attn_implementation": "eager"}
    if is_moe(arch_name):  # the default grouped_mm experts are invisible to the counter
        kwargs["experts_implementation"] = "eager"
    model = getattr(transformers, auto_class).from_config(cfg, **kwargs).float()
    return model, read_arch(cfg.to_dict(), name=arch_name).arch


def add_lora(model, arch: flops.ArchSpec, targets=flops.LORA_TARGETS):
    """PEFT LoRA on the modules playing ``targets`` (default: every linear module), no dropout,
    with the module paths RACE gives peft: (peft model, matching LoRASpec)."""
    from peft import LoraConfig, get_peft_model

    paths = peft_module_paths(peft_target_modules(arch, targets), [n for n, _ in model.named_modules()])
    cfg = LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, lora_dropout=0.0, target_modules=paths)
    return get_peft_model(model, cfg), flops.LoRASpec(rank=LORA_RANK,
                                                      target_modules=resolve_lora_targets(arch, targets))


def count(fn) -> int:
    """FLOPs that FlopCounterMode records while ``fn()`` runs."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


def _ids(batch: int, length: int):
    import torch

    return torch.randint(1, _COMMON["vocab_size"], (batch, length))


def _completion_logprob_loss(model, ids, prompt_len: int):
    """GRPO-style loss: mean log-prob of the completion tokens (logits at all positions)."""
    logits = model(input_ids=ids).logits
    logp = logits[:, prompt_len - 1:-1].log_softmax(-1)
    return -logp.gather(-1, ids[:, prompt_len:, None]).mean()


def _kept_logits_loss(model, ids, completion_len: int):
    """The same loss from ``logits_to_keep=C + 1`` (TRL, race.engine.grpo): the last C + 1
    positions, of which the first C predict the completion tokens."""
    logits = model(input_ids=ids, logits_to_keep=completion_len + 1).logits[:, :-1]
    logp = logits.log_softmax(-1)
    return -logp.gather(-1, ids[:, -completion_len:, None]).mean()


def _decode(model, prompt, steps: int) -> None:
    """Greedy decoding by hand: prefill (logits at the last position), then steps."""
    from race.engine.backends.hf import cache_keyword, returned_cache

    key = cache_keyword(model)
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    for _ in range(steps):
        token = out.logits[:, -1:].argmax(-1)
        out = model(input_ids=token, use_cache=True, **{key: returned_cache(out)})


def measure(arch_name: str, quantity: str, *, prompt_len: int = PROMPT_LEN,
            completion_len: int = COMPLETION_LEN) -> tuple[int, float]:
    """(FLOPs counted by FlopCounterMode, FLOPs from race.flops.formulas) for one computation."""
    import torch

    p, c, b = prompt_len, completion_len, SEQUENCES
    lengths = dict(prompt_len=p, completion_len=c)
    auto = "AutoModelForCausalLM"
    if quantity == "reward_seqcls":
        auto = "AutoModelForSequenceClassification"
    elif quantity == "reward_prm_head":
        auto = "AutoModel"  # the decoder body; the PRM head is added below
    model, arch = build_model(arch_name, auto, **({"num_labels": 2, "pad_token_id": 0}
                                             if quantity == "reward_seqcls" else {}))
    ids = _ids(b, p + c)

    if quantity == "forward":
        with torch.no_grad():
            return count(lambda: model(input_ids=ids)), b * flops.forward_flops(
                arch, p + c, causal=False)
    if quantity in ("lora_fwd_bwd", "full_fwd_bwd", "lora_grad_ckpt"):
        lora = None
        if quantity != "full_fwd_bwd":
            model, lora = add_lora(model, arch)
        ckpt = quantity == "lora_grad_ckpt"
        if ckpt:  # HF default: non-reentrant checkpoints, embedding output requires grad
            from race.engine.loading import enable_checkpointing

            enable_checkpointing(model)
        model.train()
        counted = count(lambda: _completion_logprob_loss(model, ids, p).backward())
        return counted, flops.learning_flops(arch, sequences=b, lora=lora, causal=False,
                                             grad_checkpointing=ckpt, **lengths)
    if quantity == "grpo_step":  # μ = 2 with old-policy and reference log-probs
        model, lora = add_lora(model, arch)

        def step():
            with torch.no_grad():
                model(input_ids=ids)               # old-policy log-probs
                with model.disable_adapter():
                    model(input_ids=ids)           # reference log-probs
            for _ in range(2):
                _completion_logprob_loss(model, ids, p).backward()
        return count(step), flops.learning_flops(arch, sequences=b, lora=lora, mu=2,
                                                 ref_logprobs=True, causal=False, **lengths)
    if quantity == "grpo_step_kept_logits":  # race.engine.grpo: old log-probs from iteration 1
        model, lora = add_lora(model, arch)

        def step():
            with torch.no_grad(), model.disable_adapter():
                model(input_ids=ids, logits_to_keep=c + 1)      # reference log-probs
            for _ in range(2):
                _kept_logits_loss(model, ids, c).backward()
        return count(step), flops.learning_flops(
            arch, sequences=b, lora=lora, mu=2, ref_logprobs=True, causal=False,
            old_logprob_forward=False, completion_logits_only=True, **lengths)
    if quantity in ("search_kv", "search_lora_kv"):
        lora = None
        if quantity == "search_lora_kv":
            model, lora = add_lora(model, arch)  # unmerged adapter while sampling
        with torch.no_grad():
            counted = count(lambda: _decode(model, ids[:1, :p], c - 1))
        return counted, flops.search_flops(arch, n=1, lora=lora, causal=False, **lengths)
    if quantity == "generate_n2":  # HF generate duplicates the prompt: no prefix sharing
        prompt = ids[:1, :p]
        counted = count(lambda: model.generate(
            prompt, max_new_tokens=c, min_new_tokens=c, do_sample=True,
            num_return_sequences=2, pad_token_id=0))
        return counted, flops.search_flops(arch, n=2, prefix_shared=False, causal=False,
                                           **lengths)
    if quantity == "reward_seqcls":
        with torch.no_grad():
            counted = count(lambda: model(input_ids=ids))
        reward = flops.RewardModelSpec(arch, num_labels=2)
        return counted, flops.reward_flops(reward, sequences=b, causal=False, **lengths)
    if quantity == "reward_prm_head":  # Qwen2.5-Math-PRM head: Linear(h,h), ReLU, Linear(h,2)
        h = arch.hidden_size
        head = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 2))
        with torch.no_grad():
            counted = count(lambda: head(model(input_ids=ids).last_hidden_state))
        reward = flops.RewardModelSpec(arch, num_labels=2, head_hidden_size=h)
        return counted, flops.reward_flops(reward, sequences=b, causal=False, **lengths)
    raise ValueError(f"unknown quantity {quantity!r}")


def cases() -> list[tuple[str, str]]:
    return [(a, q) for a in ARCHS
            for q in (MOE_QUANTITIES if is_moe(a) else DENSE_QUANTITIES)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    args = parser.parse_args()
    import torch
    import transformers

    torch.set_num_threads(1)  # tiny matmuls: threads only add overhead
    rows = []
    for arch_name, quantity in cases():
        try:
            counted, predicted = measure(arch_name, quantity)
        except ValueError as err:       # e.g. no sequence-classification class for this family
            rows.append({"arch": arch_name, "quantity": quantity, "error": str(err).splitlines()[0][:90]})
            continue
        rows.append({"arch": arch_name, "quantity": quantity, "counted": counted,
                     "formula": predicted, "rel_error": (predicted - counted) / counted})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"P={PROMPT_LEN}, C={COMPLETION_LEN}, {SEQUENCES} sequences, LoRA r={LORA_RANK}\n")
    print("| architecture | quantity | FlopCounterMode | formula | rel. error |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['arch']} | {r['quantity']} | n/a: {r['error']} | | |")
            continue
        print(f"| {r['arch']} | {r['quantity']} | {r['counted']:,} | {r['formula']:,.0f} "
              f"| {r['rel_error']:+.2e} |")
    measured = [r for r in rows if "error" not in r]
    print(f"\nmax |rel. error| = {max(abs(r['rel_error']) for r in measured):.2e} "
          f"over {len(measured)} cases")


if __name__ == "__main__":
    main()
