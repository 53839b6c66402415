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

from race.backends import LEAN_MODEL_TYPES

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
# projections that read the same input run as one matmul on their stacked weights
GROUPS = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
          "down": ("down_proj",)}


class _LoRAGroup(torch.autograd.Function):
    """y = x·Wᵀ + b + s·(x·A_mᵀ)·B_mᵀ for each adapted member m (into m's output rows), as ONE
    autograd node.

    The members' A matrices are stacked so that x·Aᵀ, the A-gradient and the input
    gradient through A each take one matmul for the whole group; every product is one
    that peft's unmerged LoRA computes too (so ``flops.learning_flops`` counts them), only
    fewer and larger: forward x·Wᵀ, x·A_allᵀ, then (·)·B_mᵀ per member; backward g·B_m and
    dB_m = gᵀ·(s·x·A_mᵀ) per member, dA_all = (s·g·B)ᵀ·x and, only when x needs a
    gradient, dx = g·W + (s·g·B)·A_all. Autograd would build five nodes and a dozen small
    kernels per adapted layer; on small models that bookkeeping, not arithmetic, was the
    update's cost.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, scale, slices, *ab):
        y = F.linear(x, weight, bias)
        A_all = torch.cat(ab[0::2]) if len(slices) > 1 else ab[0]
        xa = F.linear(x, A_all.to(x.dtype)) * scale                            # [..., k·r]
        r = ab[0].shape[0]
        for j, ((lo, hi), B) in enumerate(zip(slices, ab[1::2])):
            y[..., lo:hi] += F.linear(xa[..., j * r:(j + 1) * r], B.to(x.dtype))
        ctx.save_for_backward(x, weight, xa, A_all, *ab[1::2])
        ctx.scale, ctx.slices, ctx.rank = scale, slices, r
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight, xa, A_all, *Bs = ctx.saved_tensors
        r = ctx.rank
        x2, g2, xa2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), xa.reshape(-1, xa.shape[-1])
        # every product is taken with the rank r as its ROW count (r × N, not N × r): CPU GEMM
        # kernels run a thin output of r columns 3–12× slower than the same product transposed
        gbTs, dBs = [], []
        for j, ((lo, hi), B) in enumerate(zip(ctx.slices, Bs)):
            gi = g2[:, lo:hi]
            gbTs.append((B.to(g.dtype).t() @ gi.t()) * ctx.scale)                # [r, N]
            dBs.append((xa2[:, j * r:(j + 1) * r].t() @ gi).t().to(B.dtype))     # [out_j, r]
        gbT = torch.cat(gbTs) if len(gbTs) > 1 else gbTs[0]                      # [k·r, N]
        dA_all = (gbT @ x2).to(A_all.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (g2 @ weight + gbT.t() @ A_all.to(g.dtype)).view_as(x)
        grads = []
        for j, dB in enumerate(dBs):
            grads += [dA_all[j * r:(j + 1) * r], dB]
        return (grad_x, None, None, None, None, *grads)


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


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:        # one fused kernel (and one autograd node), same numbers
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    h = x.float()                       # lower precision: normalise in fp32, as Transformers does
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


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
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
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
            self.layers.append(SimpleNamespace(w=w, b=b, slices=slices, norms=norms, merged={},
                                               q_dim=mods["q_proj"].weight.shape[0],
                                               kv_dim=mods["k_proj"].weight.shape[0]))
            self._adapter_shapes += [(i, name, *mods[name].weight.shape) for name in self.targets]
        self.lora = self.new_adapter(gen)
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

    def merge(self) -> float:
        """Refresh the merged weights W + s·B·A that sampling runs (``merged=True``); returns the
        FLOPs spent (2·r·in·out per adapted layer)."""
        flops = 0.0
        for i, layer in enumerate(self.layers):
            for group in layer.slices:
                layer.merged[group], f = self.merged_weight(i, layer, group, self.lora)
                flops += f
        return flops

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
    def _linear(self, i: int, layer, group: str, x: torch.Tensor, merged: bool) -> torch.Tensor:
        bias = layer.b.get(group)
        if merged and group in layer.merged:
            return F.linear(x, layer.merged[group], bias)
        members = layer.slices[group] if self._adapter_on else ()
        if not members:
            return F.linear(x, layer.w[group], bias)
        ab = [t for name, _ in members for t in (self.lora[f"{i}_{name}_A"], self.lora[f"{i}_{name}_B"])]
        return _LoRAGroup.apply(x, layer.w[group], bias, self.scale, [sl for _, sl in members], *ab)

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
            h = _rms(x, layer.norms["in"], self.eps)
            qkv = self._linear(i, layer, "qkv", h, merged)
            if "q" in layer.norms:          # Qwen3: per-head norms before the rotation
                q, k, v = qkv.split((layer.q_dim, layer.kv_dim, layer.kv_dim), -1)
                qk = torch.cat((_rms(q.unflatten(-1, (H, d)), layer.norms["q"], self.eps),
                                _rms(k.unflatten(-1, (Hkv, d)), layer.norms["k"], self.eps)), dim=-2)
            else:
                qk, v = qkv[..., :layer.q_dim + layer.kv_dim].unflatten(-1, (H + Hkv, d)), qkv[..., -layer.kv_dim:]
            qk = qk * cos + qk.roll(half, -1) * sin           # RoPE on queries and keys at once
            q, k = qk.split((H, Hkv), dim=-2)
            a = attend(i, q, k, v.unflatten(-1, (Hkv, d)))
            x = x + self._linear(i, layer, "o", a, merged)
            h = _rms(x, layer.norms["post"], self.eps)
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
        return F.linear(_rms(x, self.norm, self.eps), self.lm_head)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, *, logits_to_keep: int = 0,
                cache: SimpleNamespace | None = None, merged: bool = False, **_: object) -> SimpleNamespace:
        B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)[:, -T:]
        x = F.embedding(input_ids, self.embed)
        cos, sin = self._rope(position_ids, x.dtype)
        start = cache.length if cache is not None else 0
        keys = start + T
        # [B, 1, T, keys] boolean mask: causal within the new tokens, padding from attention_mask
        causal = torch.ones(T, keys, dtype=torch.bool, device=x.device).tril(diagonal=start)
        mask = causal[None, None] & attention_mask[:, -keys:].bool()[:, None, None, :]
        # every query also sees itself: a left-padding row would otherwise see no key and turn
        # to NaN, which the masked-out weights of later layers would still multiply
        rows = torch.arange(T, device=x.device)
        mask[..., rows, start + rows] = True

        def attend(i, q, k, v):
            if cache is None:
                return self._attend_rows(q, k, v, mask)
            cache.k[i][:, :, start:keys] = k.transpose(1, 2)
            cache.v[i][:, :, start:keys] = v.transpose(1, 2)
            a = self._attention(q.transpose(1, 2), cache.k[i][:, :, :keys], cache.v[i][:, :, :keys], mask)
            return a.transpose(1, 2).flatten(2)

        x = self._blocks(x, cos, sin, attend, merged=merged)
        if cache is not None:
            cache.length = keys
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return SimpleNamespace(logits=self._head(x))

    def forward_grouped(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, group: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """Logits predicting each completion token, with each prompt run ONCE for its group.

        prompt_ids / prompt_mask: [G, Lp] (left-padded); group: [B] prompt index of each
        sequence; completion_ids / completion_mask: [B, Lc] (right-padded). The prompt's
        keys/values (with their gradient) are shared by the group's rollouts, which is
        exact: a prompt's forward does not depend on what follows it. Returns [B, Lc, V],
        row t predicting completion token t (from the prompt's last position for t = 0).

        Prompt and completion tokens travel as one packed [G·Lp + B·Lc, D] batch through
        every projection (one matmul each instead of one per part); only attention splits
        them: prompts attend causally within themselves, completions to their prompt's
        keys/values and causally within themselves.
        """
        G, Lp = prompt_ids.shape
        B, Lc = completion_ids.shape
        Np = G * Lp
        dev = prompt_ids.device
        pos_p = (prompt_mask.cumsum(1) - 1).clamp(min=0)
        pos_c = prompt_mask.sum(1).index_select(0, group)[:, None] + torch.arange(Lc, device=dev)
        x = F.embedding(torch.cat((prompt_ids.reshape(-1), completion_ids.reshape(-1))), self.embed)
        cos, sin = self._rope(torch.cat((pos_p.reshape(-1), pos_c.reshape(-1))), x.dtype)
        rows = torch.arange(Lp, device=dev)
        mask_p = torch.ones(Lp, Lp, dtype=torch.bool, device=dev).tril()[None, None] \
            & prompt_mask.bool()[:, None, None, :]
        mask_p[..., rows, rows] = True
        causal = torch.ones(Lc, Lc, dtype=torch.bool, device=dev).tril()[None, None] \
            & completion_mask.bool()[:, None, None, :]
        prefix = prompt_mask.bool().index_select(0, group)[:, None, None, :].expand(B, 1, Lc, Lp)
        mask_c = torch.cat((prefix, causal), dim=-1)

        def attend(i, q, k, v):
            qp, kp, vp = (t[:Np].unflatten(0, (G, Lp)).transpose(1, 2) for t in (q, k, v))
            qc, kc, vc = (t[Np:].unflatten(0, (B, Lc)).transpose(1, 2) for t in (q, k, v))
            ap = self._attention(qp, kp, vp, mask_p)
            kc = torch.cat((kp.index_select(0, group), kc), dim=2)
            vc = torch.cat((vp.index_select(0, group), vc), dim=2)
            ac = self._attention(qc, kc, vc, mask_c)
            return torch.cat((ap.transpose(1, 2).reshape(Np, -1), ac.transpose(1, 2).reshape(B * Lc, -1)))

        x = self._blocks(x, cos, sin, attend)
        # the head reads each prompt's last position (predicting completion token 0, once per
        # group) and every completion position; the last one's logits are unused but computed,
        # as the FLOP formula counts
        head_rows = torch.cat((torch.arange(Lp - 1, Np, Lp, device=dev), torch.arange(Np, Np + B * Lc, device=dev)))
        logits = self._head(x.index_select(0, head_rows))
        # rows of ``logits``: G prompt-last rows, then B·Lc completion rows; sequence b reads its
        # prompt's row ``group[b]``, then its own completion rows but the last
        comp = G + torch.arange(B * Lc, device=dev).view(B, Lc)[:, :-1]
        return logits[torch.cat((group[:, None], comp), dim=1)]
