"""The lean forward matches Transformers (and its LoRA matches peft) on tiny random models.

The lean policy is race.engine.backends.lockstep.LockstepLM (race.engine.backends.lean's decoder with one adapter
per seed); a solo pilot's is a group of one seed, which these tests run: inputs carry a leading
seed axis of 1."""
import pytest
import torch

from race.engine.backends.lean import supports
from race.engine.backends.lockstep import LockstepLM

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _model(kind):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=50, max_position_embeddings=64)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)).eval()
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False)).eval()
    return Qwen3ForCausalLM(Qwen3Config(**common, head_dim=24, tie_word_embeddings=True)).eval()


def _batch():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)


def _lean(model):
    """A solo pilot's lean policy: one seed."""
    return LockstepLM(model, rank=4, alpha=8, targets=TARGETS, seeds=[0])


def _fwd(lean, ids, mask, pos, **kw):
    """Logits of [B, T] inputs through the one-seed policy (a seed axis of 1 added and removed)."""
    cache = kw.pop("cache", None)
    return lean(ids[None], mask[None], pos[None], cache=cache, **kw).logits[0]


def _randomise_lora(lean):
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in lean.adapters[0].items():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
def test_logits_match_transformers(kind):
    model = _model(kind)
    assert supports(model.config) is None
    ids, mask, pos = _batch()
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    lean = _lean(model)
    out = _fwd(lean, ids, mask, pos)                      # B = 0 at init: the base model
    real = mask.bool()
    assert torch.allclose(out[real], ref[real], atol=1e-5), (out[real] - ref[real]).abs().max()


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_lora_matches_peft_and_saves_in_peft_format(kind):
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    model = _model(kind)
    lean = _lean(model)
    _randomise_lora(lean)
    ids, mask, pos = _batch()
    ours = _fwd(lean, ids, mask, pos)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(TARGETS)))
    missing = set_peft_model_state_dict(peft_model, lean.adapter_state_dict())
    assert not getattr(missing, "unexpected_keys", [])
    theirs = peft_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    assert torch.allclose(ours[real], theirs[real], atol=1e-5), (ours[real] - theirs[real]).abs().max()
    assert len(lean.adapter_state_dict()) == 2 * 7 * 2      # 2 layers × 7 modules × (A, B)


def test_cached_decode_equals_full_forward_and_merge_equals_adapter():
    model = _model("qwen2")
    lean = _lean(model)
    _randomise_lora(lean)
    flops = lean.merge()[0]
    assert flops == pytest.approx(2 * 2 * 4 * sum(i * o for i, o in [(64, 64), (64, 32), (64, 32), (64, 64),
                                                                       (64, 128), (64, 128), (128, 64)]))
    ids, mask, pos = _batch()
    full = _fwd(lean, ids, mask, pos)
    cache = lean.new_cache(2, 8)
    pre = _fwd(lean, ids[:, :4], mask[:, :4], pos[:, :4], cache=cache, merged=True)
    steps = [_fwd(lean, ids[:, t:t + 1], mask[:, :t + 1], pos[:, t:t + 1], cache=cache, merged=True)
             for t in range(4, 6)]
    cached = torch.cat([pre] + steps, dim=1)
    real = mask.bool()
    assert torch.allclose(cached[real], full[real], atol=1e-4)


def test_disable_adapter_gives_the_base():
    model = _model("llama")
    lean = _lean(model)
    _randomise_lora(lean)
    ids, mask, pos = _batch()
    with lean.disable_adapter():
        base = _fwd(lean, ids, mask, pos)
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert torch.allclose(base[mask.bool()], ref[mask.bool()], atol=1e-5)
    assert not torch.allclose(_fwd(lean, ids, mask, pos), base)


def _loss(logits, ids, mask=None):
    """Sum of log-probs of ``ids`` at the real (unpadded) positions."""
    lp = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (lp * mask).sum() if mask is not None else lp.sum()


def test_lora_gradients_match_peft():
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    model = _model("qwen2")
    lean = _lean(model)
    _randomise_lora(lean)
    ids, mask, pos = _batch()
    grads = torch.autograd.grad(_loss(_fwd(lean, ids, mask, pos), ids, mask), list(lean.adapters[0].values()))
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(TARGETS)))
    set_peft_model_state_dict(peft_model, lean.adapter_state_dict())
    _loss(peft_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits, ids, mask).backward()
    named = dict(peft_model.named_parameters())
    for (key, g) in zip(lean.adapters[0].keys(), grads):
        i, name, ab = key.split("_", 1)[0], key.split("_", 1)[1].rsplit("_", 1)[0], key.rsplit("_", 1)[1]
        group = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        ref = named[f"base_model.model.model.layers.{i}.{group}.{name}.lora_{ab}.default.weight"].grad
        assert torch.allclose(g, ref, atol=1e-5, rtol=1e-4), key


def test_merge_follows_optimizer_steps():
    model = _model("qwen2")
    lean = _lean(model)
    assert lean.merge()[0] > 0
    opt = torch.optim.AdamW(lean.parameters(), lr=1e-2, fused=True)
    ids, mask, pos = _batch()
    _loss(_fwd(lean, ids, mask, pos), ids).backward()
    opt.step()
    assert lean.merge()[0] > 0
    with torch.no_grad():
        assert torch.allclose(_fwd(lean, ids, mask, pos, merged=True), _fwd(lean, ids, mask, pos), atol=1e-5)


def test_grouped_update_flops_match_the_counter():
    """The shared-prefix update costs what grid.grouped_learning says (eager attention, exact)."""
    from torch.utils.flop_counter import FlopCounterMode

    from race.flops import formulas as F
    from race.engine import grpo
    from race.flops.grid import ENGINE_LEARNING_KW, grouped_learning

    model = _model("llama")
    lean = _lean(model)
    lean.eager_attention = True
    b = grpo.pack([[3, 4, 5, 6], [7, 8, 9, 10]], [[11, 12, 13]] * 6, [0, 0, 0, 1, 1, 1], [1.0] * 6, pad_id=0)
    with FlopCounterMode(display=False) as counter:
        logp, _ = grpo.completion_logprobs(lean, grpo.stack_batches([b], pad_id=0))
        logp.sum().backward()
    from race.flops.architectures import read_arch

    arch = read_arch(model.config.to_dict()).arch
    lora = F.LoRASpec(rank=4, target_modules=TARGETS)

    def cost(p, c):
        return F.learning_flops(arch, prompt_len=p, completion_len=c, sequences=1, lora=lora, causal=False,
                                **ENGINE_LEARNING_KW)
    expected = grouped_learning([cost(4, 3)] * 6, [cost(4, 0)] * 2, [0, 0, 0, 1, 1, 1], shared_prefix=True)
    # Translating the eager (full-rectangle) convention exactly: a whole P+C sequence scores
    # (P+C)² entries, its prompt alone P²; the grouped run scores P² per prompt and C·(P+C)
    # per completion, so it never computes the P·C prompt-query × completion-key entries that
    # cost(P, C) − cost(P, 0) includes. Each entry costs its forward once plus twice in backward.
    per_entry = 3 * F.attention_flops(arch, 1, causal=False)
    expected -= 6 * (4 * 3) * per_entry
    assert counter.get_total_flops() == expected
