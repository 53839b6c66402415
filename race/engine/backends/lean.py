"""The lean decoder for Llama-family models (Qwen2, Qwen3, Llama, Mistral): weights and mathematics.

Why: on small models a Transformers forward costs ~4 ms of Python before any
arithmetic (mask building, output capturing, kwargs plumbing) and peft adds a
wrapper per adapted layer; GRPO calls the model ~8 times per step. ``LeanLM``
holds the frozen weights of a model loaded with the ordinary
``AutoModelForCausalLM.from_pretrained`` (nothing is re-trained or converted) and
the decoder mathematics over them (RoPE, attention, the blocks, the head, the KV
cache, LoRA adapters drawn and merged as peft does). Its one subclass,
race.engine.backends.lockstep.``LockstepLM``, adds the adapters (one per seed; a solo pilot
is a group of one) and the forward passes, so a pilot step costs a fraction of the
HF + peft one (docs/benchmarks.md). Tests check its logits against the HF model's
and its adapter against peft's.

Supported: decoders whose layers are ``RMSNorm → attention (RoPE, GQA, optional
q/k bias and q/k norm) → RMSNorm → SwiGLU MLP``, ``hidden_act == "silu"``, no
sliding window in use. Anything else runs through HF + peft (``supports``).

LoRA follows peft's conventions (``lora_A`` Kaiming-uniform, ``lora_B`` zeros,
scale ``alpha / r``) and ``peft_state_dict`` uses peft's key names, so an
adapter saved from here loads with ``PeftModel.from_pretrained``.
"""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from race.engine.backends import LEAN_MODEL_TYPES

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
# projections that read the same input run as one matmul on their stacked weights
GROUPS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
          "down": ("down_proj",)}


def supports(config) -> str | None:
    """None when the lean path can run this model, else the reason it cannot."""
    if config.model_type not in LEAN_MODEL_TYPES:
        return f"model_type {config.model_type!r} (lean path: {', '.join(LEAN_MODEL_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    return None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:        # one fused kernel (and one autograd node), same numbers
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    h = x.float()                       # lower precision: normalise in fp32, as Transformers does
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


class LeanLM(torch.nn.Module):
    """The frozen base weights (shared with the HF model, projections that read one input stacked:
    ``GROUPS``) and the decoder mathematics over them. A subclass supplies the adapters, ``_linear``
    (one projection group, adapted or merged) and the forward passes (race.engine.backends.lockstep)."""

    def __init__(self, hf_model, *, rank: int, alpha: float, targets):
        super().__init__()
        why = supports(hf_model.config)
        if why:
            raise ValueError(f"the lean path cannot run this model: {why}")
        cfg = hf_model.config
        self.config = cfg
        self.generation_config = getattr(hf_model, "generation_config", None)   # its stop tokens (sampling)
        inner = hf_model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.lm_head = hf_model.lm_head.weight.detach()
        self.eps = cfg.rms_norm_eps
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rot = inner.rotary_emb
        self.inv_freq = rot.inv_freq.detach().float()
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.rank, self.scale = rank, alpha / rank
        self.targets = tuple(targets)
        unknown = set(self.targets) - set(_ATTN + _MLP)
        if unknown:
            raise ValueError(f"LoRA target {sorted(unknown)[0]!r} is not a projection of this model: "
                             f"expected some of {', '.join(_ATTN + _MLP)}")
        self._adapter_shapes: list[tuple[int, str, int, int]] = []   # (layer, projection, out, in)
        self.layers = []
        for i, layer in enumerate(inner.layers):
            mods = {n: getattr(layer.self_attn if n in _ATTN else layer.mlp, n) for n in _ATTN + _MLP}
            w, b, slices = {}, {}, {}
            for group, members in GROUPS.items():
                w[group] = torch.cat([mods[m].weight.detach() for m in members]) if len(members) > 1 \
                    else mods[members[0]].weight.detach()
                if mods[members[0]].bias is not None:
                    b[group] = torch.cat([mods[m].bias.detach() for m in members])
                sizes = [mods[m].weight.shape[0] for m in members]
                offsets = [sum(sizes[:j]) for j in range(len(sizes))]
                slices[group] = [(m, (o, o + n)) for m, o, n in zip(members, offsets, sizes) if m in self.targets]
            att = layer.self_attn
            norms = {"in": layer.input_layernorm.weight.detach(), "post": layer.post_attention_layernorm.weight.detach()}
            if hasattr(att, "q_norm"):
                norms["q"], norms["k"] = att.q_norm.weight.detach(), att.k_norm.weight.detach()
            self.layers.append(SimpleNamespace(w=w, b=b, slices=slices, norms=norms,
                                               q_dim=mods["q_proj"].weight.shape[0],
                                               kv_dim=mods["k_proj"].weight.shape[0]))
            self._adapter_shapes += [(i, name, *mods[name].weight.shape) for name in self.targets]
        self.eager_attention = False    # True: attention as explicit matmuls (for FLOP-counter tests)
        self._adapter_on = True

    # ------------------------------------------------------------------ adapter plumbing
    def new_adapter(self, generator: torch.Generator | None = None) -> torch.nn.ParameterDict:
        """A fresh adapter for this model's targets, drawn from ``generator`` (None: torch's global
        stream, as peft draws): A ~ U(±1/√in) (peft's ``kaiming_uniform_(a=√5)``), B = 0, layer by
        layer in target order, so a seeded draw gives the adapter a solo pilot of that seed has."""
        out = torch.nn.ParameterDict()
        for i, name, out_f, in_f in self._adapter_shapes:
            a = torch.empty(self.rank, in_f)
            bound = 1.0 / math.sqrt(in_f)
            a.uniform_(-bound, bound, generator=generator)
            out[f"{i}_{name}_A"] = torch.nn.Parameter(a.to(device=self.embed.device))
            out[f"{i}_{name}_B"] = torch.nn.Parameter(torch.zeros(out_f, self.rank, device=self.embed.device))
        return out

    @contextlib.contextmanager
    def disable_adapter(self):
        """The base model (reference policy for KL) without a second copy of the weights."""
        prev, self._adapter_on = self._adapter_on, False
        try:
            yield
        finally:
            self._adapter_on = prev

    @torch.no_grad()
    def merged_weight(self, i: int, layer, group: str, lora) -> tuple[torch.Tensor, float]:
        """(W + s·B·A of ``lora``'s adapted members of layer ``i``'s ``group``, in the weight's dtype;
        the merge FLOPs, 2·r·in·out per member). A group without members is its base weight."""
        members = layer.slices[group]
        w = layer.w[group].float().clone() if members else layer.w[group]
        flops = 0.0
        for name, (lo, hi) in members:
            A, B = lora[f"{i}_{name}_A"], lora[f"{i}_{name}_B"]
            w[lo:hi].addmm_(B, A, alpha=self.scale)
            flops += 2.0 * A.shape[0] * A.shape[1] * B.shape[0]
        return w.to(layer.w[group].dtype), flops

    def peft_state_dict(self, lora) -> dict[str, torch.Tensor]:
        """Adapter ``lora`` (``new_adapter``'s layout) under peft's key names (``adapter_model.safetensors``)."""
        out = {}
        for i in range(len(self.layers)):
            for name in self.targets:
                group = "self_attn" if name in _ATTN else "mlp"
                key = f"base_model.model.model.layers.{i}.{group}.{name}"
                out[f"{key}.lora_A.weight"] = lora[f"{i}_{name}_A"].detach().clone()
                out[f"{key}.lora_B.weight"] = lora[f"{i}_{name}_B"].detach().clone()
        return out

    # ------------------------------------------------------------------ forward
    def _linear(self, i: int, layer, group: str, x: torch.Tensor, merged: bool) -> torch.Tensor:
        """Layer ``i``'s projection ``group`` over ``x``: adapted, or merged with ``merged`` (the subclass's)."""
        raise NotImplementedError

    def new_cache(self, batch: int, max_len: int) -> SimpleNamespace:
        shape = (batch, self.n_kv, max_len, self.head_dim)
        kw = dict(device=self.embed.device, dtype=self.embed.dtype)
        return SimpleNamespace(k=[torch.zeros(shape, **kw) for _ in self.layers],
                               v=[torch.zeros(shape, **kw) for _ in self.layers], length=0)

    @staticmethod
    def repeat_cache(cache: SimpleNamespace, n: int) -> SimpleNamespace:
        """Each row of the cache repeated ``n`` times (prefix sharing for n rollouts)."""
        return SimpleNamespace(k=[t.repeat_interleave(n, 0) for t in cache.k],
                               v=[t.repeat_interleave(n, 0) for t in cache.v], length=cache.length)

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin for ``position_ids`` [...], shaped [..., 1, head_dim] (one head axis).

        The sin's first half carries the minus of rotate_half, so that a rotation is
        x·cos + roll(x, half)·sin: four kernels instead of seven."""
        freqs = position_ids[..., None].float() * self.inv_freq
        cos = torch.cat((freqs, freqs), dim=-1).cos() * self.rope_scale
        sin = torch.cat((-freqs, freqs), dim=-1).sin() * self.rope_scale
        return cos.to(dtype).unsqueeze(-2), sin.to(dtype).unsqueeze(-2)

    def _blocks(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend, *,
                merged: bool = False) -> torch.Tensor:
        """The decoder layers over ``x`` [..., D]. ``attend(i, q, k, v)`` gets layer i's rotated
        queries/keys/values as [..., heads, head_dim] (same leading axes as ``x``) and returns
        the attention output as [..., heads·head_dim]; it is where the callers differ
        (KV-cache sampling, whole sequences, or prompts shared by their group)."""
        H, Hkv, d = self.n_heads, self.n_kv, self.head_dim
        half = d // 2
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.norms["in"], self.eps)
            qkv = self._linear(i, layer, "qkv", h, merged)
            if "q" in layer.norms:          # Qwen3: per-head norms before the rotation
                q, k, v = qkv.split((layer.q_dim, layer.kv_dim, layer.kv_dim), -1)
                qk = torch.cat((rms_norm(q.unflatten(-1, (H, d)), layer.norms["q"], self.eps),
                                rms_norm(k.unflatten(-1, (Hkv, d)), layer.norms["k"], self.eps)), dim=-2)
            else:
                qk, v = qkv[..., :layer.q_dim + layer.kv_dim].unflatten(-1, (H + Hkv, d)), qkv[..., -layer.kv_dim:]
            qk = qk * cos + qk.roll(half, -1) * sin           # RoPE on queries and keys at once
            q, k = qk.split((H, Hkv), dim=-2)
            a = attend(i, q, k, v.unflatten(-1, (Hkv, d)))
            x = x + self._linear(i, layer, "o", a, merged)
            h = rms_norm(x, layer.norms["post"], self.eps)
            gate, up = self._linear(i, layer, "gate_up", h, merged).chunk(2, dim=-1)
            x = x + self._linear(i, layer, "down", F.silu(gate) * up, merged)
        return x

    def _attention(self, q, k, v, mask):
        """q [N, H, T, d], k/v [N, H_kv, K, d], mask [N, 1, T, K] → [N, H, T, d]."""
        if not self.eager_attention:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        # explicit matmuls (FlopCounterMode counts these; it counts 0 for CPU SDPA): full T×K scores
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v

    def _attend_rows(self, q, k, v, mask):
        """Attention over [N, T, heads, d] rows → [N, T, heads·d]."""
        a = self._attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
        return a.transpose(1, 2).flatten(2)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(x, self.norm, self.eps), self.lm_head)
