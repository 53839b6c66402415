"""A lean forward pass for Llama-family decoders (Qwen2, Qwen3, Llama, Mistral), with LoRA.

Why: on small models a Transformers forward costs ~4 ms of Python before any
arithmetic (mask building, output capturing, kwargs plumbing) and peft adds a
wrapper per adapted layer; GRPO calls the model ~8 times per step. This module
runs the same mathematics straight over the weights of a model loaded with the
ordinary ``AutoModelForCausalLM.from_pretrained`` (nothing is re-trained or
converted), with LoRA adapters of its own, so a pilot step costs a fraction of
the HF + peft one (docs/benchmarks.md). Tests check its logits against the HF
model's and its adapter against peft's.

Supported: decoders whose layers are ``RMSNorm → attention (RoPE, GQA, optional
q/k bias and q/k norm) → RMSNorm → SwiGLU MLP``, ``hidden_act == "silu"``, no
sliding window in use. Anything else runs through HF + peft (``supports``).

LoRA follows peft's conventions (``lora_A`` Kaiming-uniform, ``lora_B`` zeros,
scale ``alpha / r``) and ``adapter_state_dict`` uses peft's key names, so an
adapter saved from here loads with ``PeftModel.from_pretrained``.
"""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F

SUPPORTED_TYPES = ("qwen2", "qwen3", "llama", "mistral")
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def supports(config) -> str | None:
    """None when the lean path can run this model, else the reason it cannot."""
    if config.model_type not in SUPPORTED_TYPES:
        return f"model_type {config.model_type!r} (lean path: {', '.join(SUPPORTED_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    return None


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LeanLM(torch.nn.Module):
    """The policy: frozen base weights (shared with the HF model) + trainable LoRA.

    ``forward(input_ids, attention_mask, position_ids, logits_to_keep=0, cache=None)``
    returns an object with ``.logits``; with ``cache`` (from ``new_cache``) it
    appends keys/values for the given tokens (sampling). ``merged=True`` uses the
    merged weights refreshed by ``merge()`` instead of running the adapter.
    """

    def __init__(self, hf_model, *, rank: int, alpha: float, targets, seed: int | None = None):
        super().__init__()
        why = supports(hf_model.config)
        if why:
            raise ValueError(f"the lean path cannot run this model: {why}")
        cfg = hf_model.config
        self.config = cfg
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
        self.layers = []
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            w = {n: getattr(att, n).weight.detach() for n in _ATTN}
            w.update({n: getattr(mlp, n).weight.detach() for n in _MLP})
            b = {n: getattr(att, n).bias.detach() for n in _ATTN if getattr(att, n).bias is not None}
            norms = {"in": layer.input_layernorm.weight.detach(), "post": layer.post_attention_layernorm.weight.detach()}
            if hasattr(att, "q_norm"):
                norms["q"], norms["k"] = att.q_norm.weight.detach(), att.k_norm.weight.detach()
            self.layers.append(SimpleNamespace(w=w, b=b, norms=norms, merged={}))
        self.rank, self.scale = rank, alpha / rank
        self.targets = tuple(targets)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self.lora = torch.nn.ParameterDict()
        device = self.embed.device
        for i, layer in enumerate(self.layers):
            for name in self.targets:
                out_f, in_f = layer.w[name].shape
                a = torch.empty(rank, in_f)
                # peft's init: kaiming_uniform_(a=sqrt(5)) → U(−1/sqrt(in), 1/sqrt(in))
                bound = 1.0 / math.sqrt(in_f)
                a.uniform_(-bound, bound, generator=gen)
                self.lora[f"{i}_{name}_A"] = torch.nn.Parameter(a.to(device=device, dtype=torch.float32))
                self.lora[f"{i}_{name}_B"] = torch.nn.Parameter(torch.zeros(out_f, rank, device=device))
        self._adapter_on = True

    # ------------------------------------------------------------------ adapter plumbing
    @contextlib.contextmanager
    def disable_adapter(self):
        """The base model (reference policy for KL) without a second copy of the weights."""
        prev, self._adapter_on = self._adapter_on, False
        try:
            yield
        finally:
            self._adapter_on = prev

    def merge(self) -> float:
        """Refresh the merged weights W + s·B·A used by ``merged=True``; returns the FLOPs spent."""
        flops = 0.0
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                for name in self.targets:
                    A, B = self.lora[f"{i}_{name}_A"], self.lora[f"{i}_{name}_B"]
                    w = layer.w[name]
                    layer.merged[name] = torch.addmm(w.float(), B, A, alpha=self.scale).to(w.dtype)
                    flops += 2.0 * A.shape[0] * A.shape[1] * B.shape[0]
        return flops

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapter under peft's key names (``adapter_model.safetensors`` layout)."""
        out = {}
        for i in range(len(self.layers)):
            for name in self.targets:
                group = "self_attn" if name in _ATTN else "mlp"
                key = f"base_model.model.model.layers.{i}.{group}.{name}"
                out[f"{key}.lora_A.weight"] = self.lora[f"{i}_{name}_A"].detach().clone()
                out[f"{key}.lora_B.weight"] = self.lora[f"{i}_{name}_B"].detach().clone()
        return out

    # ------------------------------------------------------------------ forward
    def _linear(self, i: int, layer, name: str, x: torch.Tensor, merged: bool) -> torch.Tensor:
        bias = layer.b.get(name)
        if merged and name in layer.merged:
            return F.linear(x, layer.merged[name], bias)
        y = F.linear(x, layer.w[name], bias)
        if self._adapter_on and name in self.targets:
            A, B = self.lora[f"{i}_{name}_A"], self.lora[f"{i}_{name}_B"]
            y = y + F.linear(F.linear(x, A.to(x.dtype)) * self.scale, B.to(x.dtype))   # scale the rank-r tensor
        return y

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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, *, logits_to_keep: int = 0,
                cache: SimpleNamespace | None = None, merged: bool = False, **_: object) -> SimpleNamespace:
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
            if cache is not None:
                position_ids = position_ids[:, -T:]
        x = F.embedding(input_ids, self.embed)
        freqs = position_ids[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(x.dtype)[:, None]
        sin = (emb.sin() * self.rope_scale).to(x.dtype)[:, None]
        start = cache.length if cache is not None else 0
        keys = start + T
        # [B, 1, T, keys] boolean mask: causal within the new tokens, padding from attention_mask
        key_ok = attention_mask[:, -keys:].bool() if attention_mask.shape[1] >= keys else None
        causal = torch.ones(T, keys, dtype=torch.bool, device=x.device).tril(diagonal=start)
        mask = causal[None, None] & key_ok[:, None, None, :] if key_ok is not None else causal[None, None]
        # every query also sees itself: a left-padding row would otherwise see no key and turn
        # to NaN, which the masked-out weights of later layers would still multiply
        rows = torch.arange(T, device=x.device)
        mask = mask.clone()
        mask[..., rows, start + rows] = True
        for i, layer in enumerate(self.layers):
            h = _rms(x, layer.norms["in"], self.eps)
            q = self._linear(i, layer, "q_proj", h, merged).view(B, T, self.n_heads, self.head_dim)
            k = self._linear(i, layer, "k_proj", h, merged).view(B, T, self.n_kv, self.head_dim)
            v = self._linear(i, layer, "v_proj", h, merged).view(B, T, self.n_kv, self.head_dim)
            if "q" in layer.norms:
                q, k = _rms(q, layer.norms["q"], self.eps), _rms(k, layer.norms["k"], self.eps)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            if cache is not None:
                cache.k[i][:, :, start:keys] = k
                cache.v[i][:, :, start:keys] = v
                k, v = cache.k[i][:, :, :keys], cache.v[i][:, :, :keys]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
            x = x + self._linear(i, layer, "o_proj", a.transpose(1, 2).reshape(B, T, -1), merged)
            h = _rms(x, layer.norms["post"], self.eps)
            gate = self._linear(i, layer, "gate_proj", h, merged)
            up = self._linear(i, layer, "up_proj", h, merged)
            x = x + self._linear(i, layer, "down_proj", F.silu(gate) * up, merged)
        if cache is not None:
            cache.length = keys
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return SimpleNamespace(logits=F.linear(_rms(x, self.norm, self.eps), self.lm_head))
