"""FLOP accounting for LoRA GRPO: search (rollouts), learning (updates), reward.

Pure module: integers (architecture sizes) and floats (expected token counts) in,
floats out. No torch, no numpy. `docs/flops.md` has the formulas in one place and
the measured accuracy table (``python bench/flop_accuracy.py``).

What is counted
    Every matrix multiplication, at 2 FLOPs per multiply-add: a (m×k)·(k×n) product
    costs 2·m·k·n. That covers the linear layers (q, k, v, o, the MLP or the routed
    experts, the router, the LM head or a reward head, the LoRA A/B matrices) and the
    two attention products, scores QKᵀ and values PV.

What is left out
    Norms, activations, softmax, RoPE, residual and bias adds, embedding look-ups,
    the loss, the optimizer step. `torch.utils.flop_counter.FlopCounterMode` leaves
    out the same things (it counts mm / addmm / bmm / baddbmm / SDPA only, and addmm
    without its add), so the formulas below reproduce it exactly. Against a count of
    all arithmetic the omission is ~0.1-0.3 % for 0.5B-8B models (about 10·h + 5·I
    element-wise FLOPs per token per layer, plus ~5 per attention score, against
    ~2·(4h² + 3hI) for the matmuls).

Attention convention
    Budgets use the CAUSAL count: a query at position i attends to keys 1..i, so one
    forward over T tokens has Σ_{i=1..T} i = T(T+1)/2 score entries per head, which
    is what fused causal kernels skip to. ``causal=False`` gives the EAGER count, T²
    entries per head: eager attention multiplies the full T×T matrix and masks it
    afterwards (this is what FlopCounterMode sees with ``attn_implementation="eager"``;
    note it also counts flash/SDPA kernels as non-causal T², and their backward as
    2.5× forward because the kernel recomputes QKᵀ). Each entry costs 2·d_head FLOPs
    for QKᵀ and 2·d_head for PV, per query head (K/V heads are repeated for GQA).

Backward (what autograd actually runs)
    A frozen matmul y = x·Wᵀ costs 1× its forward in backward (dL/dx) -- and 0× when
    its input x does not require grad: with LoRA and no gradient checkpointing the
    embedding output is frozen, so layer 0's q/k/v base matmuls have no backward at
    all. A trainable matmul adds 1× for dL/dW (full fine-tune: 3× forward in total).
    A LoRA adapter B·A·x (forward 2·r·(in+out) per token) costs 2·r·in for dL/dA,
    2·r·out each for dL/dB and dL/d(Ax), and 2·r·in for dL/dx when x requires grad.
    Attention backward is 2× forward (dQ, dK, dP, dV) when q, k, v all require grad.
    `_layer_backward` propagates "requires grad" through one decoder layer, so any
    subset of LoRA target modules is handled, not only "all linear".
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from race.core.errors import ConfigError

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


MAX_TOKENS = 1e9           # a sequence length past any context window; FLOP products stay finite below it


def _check_length(name: str, value: Any) -> float:
    """Token counts may be expected (fractional) values; they must be finite, >= 0 and at most MAX_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_TOKENS:
        raise ConfigError(f"{name} must be a number of tokens from 0 to {MAX_TOKENS:.0e}, got {value!r}")
    return float(value)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class ArchSpec:
    """The sizes and structure of a decoder-only transformer that matter for FLOPs and parameters.

    Read one from a ``config.json`` with ``race.flops.architectures.read_arch`` (which knows each
    family's module layout and transformers' defaults); build one by hand for what-ifs.
    ``head_dim`` need not be hidden_size / num_heads (Qwen3, Gemma). MoE models set
    ``num_experts`` > 0: ``moe_intermediate_size`` is then the size of one routed expert and
    ``shared_expert_intermediate_size`` that of an always-on shared expert (Qwen2-MoE);
    ``intermediate_size`` is the MLP of the layers in ``dense_layers`` (Qwen-MoE
    ``mlp_only_layers`` / ``decoder_sparse_step``). Structure that changes FLOPs:
    ``gated_mlp`` (act(gate)·up vs act(up)), ``parallel_residual`` (attention and MLP read the
    same input: Phi, GPT-NeoX), ``post_mlp_norm`` (a norm reads the MLP output, so gradient
    checkpointing recomputes the layer's last matmul). ``fused_qkv`` / ``fused_gate_up`` change
    LoRA only (one adapter per fused module). Parameters only: the bias flags, ``norm_bias``
    (LayerNorm), ``qk_norm`` ("" | "head": a weight of d per q and k | "full": over the whole
    projections), ``norms_per_layer``. ``sliding_window`` = (window, layers using it) is
    reported, never counted (local attention is counted as full: an upper bound).
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    gated_mlp: bool = True
    qkv_bias: bool = False
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    qk_norm: str = ""
    norms_per_layer: int = 2
    o_bias: bool = False
    mlp_bias: bool = False
    lm_head_bias: bool = False
    norm_bias: bool = False
    post_mlp_norm: bool = False
    parallel_residual: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    dense_layers: tuple[int, ...] = ()
    model_type: str = ""
    sliding_window: tuple[int, int] = (0, 0)

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "vocab_size"):
            _check_int(f, getattr(self, f), 1)
        for f in ("intermediate_size", "num_experts", "experts_per_token",
                  "moe_intermediate_size", "shared_expert_intermediate_size", "norms_per_layer"):
            _check_int(f, getattr(self, f), 0)
        if isinstance(self.qk_norm, bool):           # older callers: True = one weight per head dim
            object.__setattr__(self, "qk_norm", "head" if self.qk_norm else "")
        if self.qk_norm not in ("", "head", "full"):
            raise ConfigError(f"qk_norm must be '', 'head' or 'full', got {self.qk_norm!r}")
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        object.__setattr__(self, "sliding_window", tuple(self.sliding_window))
        if any(not 0 <= i < self.num_layers for i in self.dense_layers):
            raise ConfigError(f"dense_layers {self.dense_layers!r} must be layer indices below {self.num_layers}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.fused_gate_up and not self.gated_mlp:
            raise ConfigError("fused_gate_up needs a gated MLP")
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ConfigError(f"experts_per_token ({self.experts_per_token}) must be in "
                                 f"1..num_experts ({self.num_experts})")
            _check_int("moe_intermediate_size", self.moe_intermediate_size, 1)
            if self.dense_layers:
                _check_int("intermediate_size", self.intermediate_size, 1)
        else:
            if self.experts_per_token:
                raise ConfigError(f"experts_per_token ({self.experts_per_token}) needs "
                                 "num_experts > 0")
            if self.dense_layers:
                raise ConfigError("dense_layers is for MoE models (num_experts > 0)")
            _check_int("intermediate_size", self.intermediate_size, 1)

    def layer_kinds(self) -> list[tuple[bool, int]]:
        """(dense, how many layers) for the layer kinds present: MoE layers and dense ones."""
        dense = len(self.dense_layers) if self.num_experts else self.num_layers
        return [(k, n) for k, n in ((True, dense), (False, self.num_layers - dense)) if n]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LoRASpec:
    """LoRA adapters of rank ``rank`` on the linear modules of every layer that play the
    named roles (``q_proj`` … ``down_proj``, Llama's names; ``race.flops.architectures`` maps a
    config's ``lora.targets`` and a family's own module names to them). A fused module
    (Phi-3's ``qkv_proj``) carries one adapter and is adapted when all its roles are named.

    Default: all seven linear modules. Check against REFERENCES: h=128, 3 layers,
    4 heads (head_dim 32), 2 KV heads, MLP 512, r=8 gives 3·8·(256+192+192+256
    +640+640+640) = 67,584 parameters.
    """

    rank: int = 8
    target_modules: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        _check_int("rank", self.rank, 1)
        targets = (self.target_modules,) if isinstance(self.target_modules, str) \
            else tuple(self.target_modules)
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown or not targets:
            raise ConfigError(f"target_modules must be a non-empty subset of {LORA_TARGETS}, "
                             f"got {targets!r}")
        object.__setattr__(self, "target_modules", targets)


@dataclass(frozen=True)
class RewardModelSpec:
    """A reward model / PRM: the decoder body of ``arch`` plus a small head, no LM head.

    The head maps h → ``num_labels``, or h → ``head_hidden_size`` → ``num_labels``
    when ``head_hidden_size`` > 0 (Qwen2.5-Math-PRM: Linear(h, h), ReLU,
    Linear(h, 2)). It runs on every position, as in the HF classification heads.
    """

    arch: ArchSpec
    num_labels: int = 1
    head_hidden_size: int = 0

    def __post_init__(self) -> None:
        _check_int("num_labels", self.num_labels, 1)
        _check_int("head_hidden_size", self.head_hidden_size, 0)

    def head_flops_per_token(self) -> float:
        h, hh, k = self.arch.hidden_size, self.head_hidden_size, self.num_labels
        return 2.0 * (h * hh + hh * k) if hh else 2.0 * h * k


# ---------------------------------------------------------------- one decoder layer

@dataclass(frozen=True)
class _Linear:
    name: str         # unique within the layer: a role (q_proj …), "qkv", "gate_up", "router", …
    stage: str        # "qkv", "o", "mlp_in" (reads the residual), "mlp_out" (reads the MLP)
    fan_in: int
    fan_out: int
    copies: int = 1   # stored per layer (routed experts)
    active: int = 1   # applied per token (top-k experts)
    roles: tuple[str, ...] = ()   # LoRA roles it plays (a fused module plays several)
    adaptable: bool = True        # peft's target_modules can reach it (routed experts: no)
    bias: bool = False


def _lin(name: str, stage: str, fan_in: int, fan_out: int, *, roles: tuple[str, ...] | None = None,
         **kw) -> _Linear:
    return _Linear(name, stage, fan_in, fan_out, roles=(name,) if roles is None else roles, **kw)


def _layer_linears(arch: ArchSpec, dense: bool = True) -> list[_Linear]:
    """The matmuls of one decoder layer, in forward order (``dense``: a dense-MLP layer of a MoE)."""
    h, q_out, kv_out = arch.hidden_size, arch.num_heads * arch.head_dim, \
        arch.num_kv_heads * arch.head_dim
    qkv = ("q_proj", "k_proj", "v_proj")
    if arch.fused_qkv:
        out = [_lin("qkv", "qkv", h, q_out + 2 * kv_out, roles=qkv, bias=arch.qkv_bias)]
    else:
        out = [_lin(r, "qkv", h, o, bias=arch.qkv_bias) for r, o in zip(qkv, (q_out, kv_out, kv_out))]
    out.append(_lin("o_proj", "o", q_out, h, bias=arch.o_bias))

    def mlp(size: int, copies: int = 1, active: int = 1, adaptable: bool = True, bias: bool = False) -> list[_Linear]:
        kw = dict(copies=copies, active=active, adaptable=adaptable, bias=bias)
        if not arch.gated_mlp:
            ins = [_lin("up_proj", "mlp_in", h, size, **kw)]
        elif arch.fused_gate_up:
            ins = [_lin("gate_up", "mlp_in", h, 2 * size, roles=("gate_proj", "up_proj"), **kw)]
        else:
            ins = [_lin(r, "mlp_in", h, size, **kw) for r in ("gate_proj", "up_proj")]
        return ins + [_lin("down_proj", "mlp_out", size, h, **kw)]

    if not arch.num_experts or dense:
        return out + mlp(arch.intermediate_size, bias=arch.mlp_bias)
    out.append(_lin("router", "mlp_in", h, arch.num_experts, roles=(), adaptable=False))
    out += mlp(arch.moe_intermediate_size, arch.num_experts, arch.experts_per_token, adaptable=False)
    if arch.shared_expert_intermediate_size:
        out += mlp(arch.shared_expert_intermediate_size)
        out.append(_lin("shared_expert_gate", "mlp_in", h, 1, roles=()))
    return out


def _per_layer(arch: ArchSpec, fn) -> float:
    """Σ over the decoder layers of ``fn(dense)`` (one call per layer kind, times its count)."""
    return sum(n * fn(dense) for dense, n in arch.layer_kinds())


def _adapted(lin: _Linear, lora: LoRASpec | None) -> bool:
    return lora is not None and lin.adaptable and bool(lin.roles) \
        and all(r in lora.target_modules for r in lin.roles)


def _layer_forward_per_token(arch: ArchSpec, lora: LoRASpec | None, dense: bool = True) -> float:
    """Σ 2·in·out over the layer's matmuls (active experts only), plus 2·r·(in+out)
    for every adapted module (the x·Aᵀ and (xAᵀ)·Bᵀ products of an unmerged adapter)."""
    total = 0.0
    for lin in _layer_linears(arch, dense):
        per = 2.0 * lin.fan_in * lin.fan_out
        if _adapted(lin, lora):
            per += 2.0 * lora.rank * (lin.fan_in + lin.fan_out)
        total += per * lin.active
    return total


def _token_flops(arch: ArchSpec, lora: LoRASpec | None) -> float:
    """Matmul FLOPs of one token through the layers and the LM head (no attention)."""
    return _per_layer(arch, lambda dense: _layer_forward_per_token(arch, lora, dense)) \
        + 2.0 * arch.vocab_size * arch.hidden_size


def _attention_per_entry(arch: ArchSpec) -> float:
    """FLOPs per (query, key) score entry, all layers: 2·d for QKᵀ + 2·d for PV, per head."""
    return 4.0 * arch.num_layers * arch.num_heads * arch.head_dim


def _score_entries(seq_len: float, causal: bool) -> float:
    return seq_len * (seq_len + 1) / 2 if causal else seq_len * seq_len


def _linear_backward(lin: _Linear, lora: LoRASpec | None, input_rg: bool,
                     train_base: bool) -> tuple[float, bool]:
    """Backward FLOPs per token of one matmul (+ its adapter) and whether its output
    requires grad. dL/dx only if x requires grad; dL/dW only if W is trained."""
    base = 2.0 * lin.fan_in * lin.fan_out
    flops = base * (input_rg + train_base)
    if _adapted(lin, lora):
        r = lora.rank
        # dL/dA (always), dL/dB and dL/d(xAᵀ) (always), dL/dx through A (if x needs it)
        flops += 2.0 * r * lin.fan_in + 4.0 * r * lin.fan_out + 2.0 * r * lin.fan_in * input_rg
    return flops * lin.active, input_rg or train_base or _adapted(lin, lora)


def _layer_backward(arch: ArchSpec, lora: LoRASpec | None, train_base: bool,
                    resid_rg: bool, dense: bool = True) -> tuple[float, float, bool]:
    """One decoder layer's backward: (FLOPs per token for the matmuls, attention FLOPs
    per score entry, whether the layer output requires grad).

    Requires-grad flows: residual → q, k, v → scores (q or k) → PV (scores or v) → o
    → residual + o → MLP inputs (the residual alone in a parallel block) → MLP hidden
    → down → residual. ``rg`` is kept per role, so fused modules and shared experts fit.
    """
    per_token, rg = 0.0, {}
    stage_input = {"qkv": resid_rg}
    for lin in _layer_linears(arch, dense):
        if lin.stage == "o":
            scores = rg["q_proj"] or rg["k_proj"]
            stage_input["o"] = scores or rg["v_proj"]
        elif lin.stage == "mlp_in" and "mlp_in" not in stage_input:
            stage_input["mlp_in"] = resid_rg or (rg["o_proj"] and not arch.parallel_residual)
        elif lin.stage == "mlp_out" and "mlp_out" not in stage_input:
            stage_input["mlp_out"] = any(rg.get(n, False) for n in ("gate_proj", "up_proj"))
        flops, out_rg = _linear_backward(lin, lora, stage_input[lin.stage], train_base)
        per_token += flops
        for role in lin.roles or (lin.name,):
            rg[role] = rg.get(role, False) or out_rg
    # dQ = dS·K, dK = dSᵀ·Q (2·d per entry each), dP = dO·Vᵀ, dV = Pᵀ·dO (2·d each)
    grads = rg["q_proj"] + rg["k_proj"] + (rg["q_proj"] or rg["k_proj"]) + rg["v_proj"]
    attn_per_entry = 2.0 * arch.num_heads * arch.head_dim * grads
    return per_token, attn_per_entry, resid_rg or rg["o_proj"] or rg["down_proj"]


def backward_costs(arch: ArchSpec, lora: LoRASpec | None, *, train_base: bool,
                    embed_rg: bool) -> tuple[float, float, float]:
    """Whole-model backward: (body FLOPs per token, LM-head FLOPs per logit position,
    attention FLOPs per score entry)."""
    body = attn = 0.0
    rg = embed_rg
    dense_layers = set(arch.dense_layers)
    for i in range(arch.num_layers):
        b, a, rg = _layer_backward(arch, lora, train_base, rg,
                                   dense=not arch.num_experts or i in dense_layers)
        body, attn = body + b, attn + a
    head = 2.0 * arch.vocab_size * arch.hidden_size * (rg + train_base)
    return body, head, attn


# ---------------------------------------------------------------- parameters

def matmul_params(arch: ArchSpec) -> int:
    """Weights a token is multiplied with: all layer matmuls (active experts only) plus
    the LM head V·h, counted even when it shares its weight with the embedding."""
    layers = _per_layer(arch, lambda dense: sum(lin.fan_in * lin.fan_out * lin.active
                                                for lin in _layer_linears(arch, dense)))
    return int(layers) + arch.vocab_size * arch.hidden_size


def param_count(arch: ArchSpec) -> int:
    """All parameters: embedding (+ untied LM head, + its bias), every expert, linear biases,
    norm weights (and biases for LayerNorm): ``norms_per_layer`` per layer, q/k norms, the
    final norm."""
    h, d = arch.hidden_size, arch.head_dim
    per_norm = 2 if arch.norm_bias else 1
    qk = {"": 0, "head": 2 * d, "full": (arch.num_heads + arch.num_kv_heads) * d}[arch.qk_norm] * per_norm

    def layer(dense: bool) -> int:
        linears = _layer_linears(arch, dense)
        return sum(lin.fan_in * lin.fan_out * lin.copies + (lin.fan_out if lin.bias else 0) for lin in linears) \
            + arch.norms_per_layer * h * per_norm + qk
    embeddings = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2)
    return embeddings + int(_per_layer(arch, layer)) + h * per_norm \
        + (arch.vocab_size if arch.lm_head_bias else 0)


def lora_param_count(arch: ArchSpec, lora: LoRASpec) -> int:
    """r·(in+out) per adapted module per layer (a fused module has one adapter)."""
    if not isinstance(lora, LoRASpec):
        raise ConfigError(f"lora must be a LoRASpec, got {type(lora).__name__}")
    return int(_per_layer(arch, lambda dense: sum(lora.rank * (lin.fan_in + lin.fan_out) * lin.copies
                                                  for lin in _layer_linears(arch, dense) if _adapted(lin, lora))))


def adapted_module_count(arch: ArchSpec, lora: LoRASpec) -> int:
    """How many modules carry a LoRA adapter in the whole model (what peft should build)."""
    return int(_per_layer(arch, lambda dense: sum(1 for lin in _layer_linears(arch, dense) if _adapted(lin, lora))))


# ---------------------------------------------------------------- forward passes

def attention_flops(arch: ArchSpec, seq_len: float, *, causal: bool = True) -> float:
    """QKᵀ and PV of one forward over ``seq_len`` tokens, all layers:
    4·L·H·d·S with S = T(T+1)/2 (causal) or T² (eager, ``causal=False``)."""
    return _attention_per_entry(arch) * _score_entries(_check_length("seq_len", seq_len), causal)


def forward_flops(arch: ArchSpec, seq_len: float, *, lora: LoRASpec | None = None,
                  causal: bool = True) -> float:
    """One forward over a sequence (no KV cache), logits at every position:
    T·(2·N_matmul + 2·N_lora_active) + attention_flops(T)."""
    t = _check_length("seq_len", seq_len)
    return t * _token_flops(arch, lora) + attention_flops(arch, t, causal=causal)


def forward_flops_per_token(arch: ArchSpec, context_len: float, *,
                            lora: LoRASpec | None = None) -> float:
    """Marginal cost of one token that attends to ``context_len`` keys (itself
    included), i.e. one decode step with a KV cache: 2·N_matmul + 2·N_lora_active
    + 4·L·H·d·context_len. Summing it over positions 1..T gives the causal forward."""
    c = _check_length("context_len", context_len)
    return _token_flops(arch, lora) + _attention_per_entry(arch) * c


def search_flops(arch: ArchSpec, *, prompt_len: float, completion_len: float, n: int,
                 prefix_shared: bool = True, lora: LoRASpec | None = None,
                 causal: bool = True) -> float:
    """Generating ``n`` rollouts for ONE prompt with a KV cache, as HF ``generate`` and
    vLLM run it (P = prompt_len, C = completion_len):

    - prefill: P tokens through the layers, the LM head at the last position only
      (it gives token 1), attention over P(P+1)/2 entries (P² eager);
    - decode: C − 1 steps (the last token is sampled, never fed back); step k feeds
      token k at context P + k: (C − 1)·(2·N_matmul + 2·N_lora) + 4·L·H·d·Σ_k (P + k).

    ``prefix_shared`` (vLLM prefix caching): one prefill serves all n rollouts;
    otherwise (HF ``num_return_sequences``) the prompt is prefilled n times.
    ``lora`` is an unmerged adapter; pass None after merging. Expected lengths make
    the attention term use E[T]² instead of E[T²]; meter actual lengths in pilots.
    """
    p, c = _check_length("prompt_len", prompt_len), _check_length("completion_len", completion_len)
    _check_int("n", n, 1)
    head = 2.0 * arch.vocab_size * arch.hidden_size
    token = _token_flops(arch, lora)
    prefill = p * (token - head) + head + attention_flops(arch, p, causal=causal)
    steps = max(c - 1.0, 0.0)
    decode = steps * token + _attention_per_entry(arch) * (steps * p + steps * (steps + 1) / 2)
    return (1 if prefix_shared else n) * prefill + n * decode


def learning_flops(arch: ArchSpec, *, prompt_len: float, completion_len: float,
                   sequences: float, lora: LoRASpec | None = None, mu: int = 1,
                   ref_logprobs: bool = False, grad_checkpointing: bool = False,
                   causal: bool = True, old_logprob_forward: bool = True,
                   completion_logits_only: bool = False) -> float:
    """Policy-update FLOPs for ``sequences`` sequences of P + C tokens (``lora=None``:
    full fine-tune, for comparison). Sum of:

    - μ × (forward + backward), backward per `backward_costs` (module docstring);
    - the old-policy log-prob forward, once, when μ > 1 and ``old_logprob_forward``
      (TRL runs one; ``False`` when iteration 1's detached log-probs serve, as in
      race.engine.grpo; with μ = 1 no trainer runs it);
    - the reference forward when ``ref_logprobs`` (adapter disabled: base cost; a
      frozen copy of the base for a full fine-tune);
    - under gradient checkpointing (HF default: non-reentrant, one checkpoint per
      layer), μ × the recomputed layer forwards. Non-reentrant recomputation stops
      once the last tensor saved for backward exists again, so each layer's final
      matmul, whose output only feeds the residual add, is not redone: lora_B of
      down_proj when it is adapted, else the base down_proj. Not so when a norm
      follows the MLP (Gemma2/3, OLMo2: ``post_mlp_norm``, the norm saves its input),
      nor for MoE (whole layer counted). HF's ``gradient_checkpointing_enable`` also
      makes the embedding output require grad, which adds layer 0's dL/dx products.

    The LM head runs on all T positions (``model(input_ids)``), or on the last C + 1
    with ``completion_logits_only`` (``logits_to_keep=C + 1`` in TRL and race.engine.grpo),
    in every forward and backward above.
    """
    p, c = _check_length("prompt_len", prompt_len), _check_length("completion_len", completion_len)
    seqs = _check_length("sequences", sequences)
    _check_int("mu", mu, 1)
    t = p + c
    entries = _score_entries(t, causal)
    full = lora is None
    body_b, head_b, attn_b = backward_costs(arch, lora, train_base=full,
                                             embed_rg=full or grad_checkpointing)
    unused_logits = t - min(c + 1.0, t) if completion_logits_only else 0.0
    head_saved = unused_logits * 2.0 * arch.vocab_size * arch.hidden_size
    fwd = forward_flops(arch, t, lora=lora, causal=causal) - head_saved
    per_seq = mu * (fwd + t * body_b + (t - unused_logits) * head_b + entries * attn_b)
    if mu > 1 and old_logprob_forward:
        per_seq += fwd
    if ref_logprobs:
        per_seq += forward_flops(arch, t, causal=causal) - head_saved
    if grad_checkpointing:
        per_seq += mu * (t * _recompute_per_token(arch, lora)
                         + entries * _attention_per_entry(arch))
    return seqs * per_seq


def _recompute_per_token(arch: ArchSpec, lora: LoRASpec | None) -> float:
    """Layer matmuls redone per token by non-reentrant checkpointing: the forward minus
    each layer's last product, whose output nothing saves (see `learning_flops`); the whole
    forward of a MoE layer and of a layer whose MLP output feeds a norm."""
    def layer(dense: bool) -> float:
        full = _layer_forward_per_token(arch, lora, dense)
        if (arch.num_experts and not dense) or arch.post_mlp_norm:
            return full
        down = _layer_linears(arch, dense)[-1]
        return full - (2.0 * lora.rank * down.fan_out if _adapted(down, lora) else 2.0 * down.fan_in * down.fan_out)
    return _per_layer(arch, layer)


def reward_flops(reward: RewardModelSpec | None, *, prompt_len: float, completion_len: float,
                 sequences: float, causal: bool = True) -> float:
    """Scoring ``sequences`` sequences of P + C tokens with a reward model / PRM: one
    forward of its layers and its head on every position, no LM head. 0 for None
    (rule-based rewards cost CPU time, not model FLOPs)."""
    p, c = _check_length("prompt_len", prompt_len), _check_length("completion_len", completion_len)
    seqs = _check_length("sequences", sequences)
    if reward is None:
        return 0.0
    arch, t = reward.arch, p + c
    per_token = _per_layer(arch, lambda dense: _layer_forward_per_token(arch, None, dense)) \
        + reward.head_flops_per_token()
    return seqs * (t * per_token + attention_flops(arch, t, causal=causal))


def summarize(arch: ArchSpec, *, lora: LoRASpec | None, prompt_len: float,
              completion_len: float, n: int, mu: int = 1, ref_logprobs: bool = False,
              reward: RewardModelSpec | None = None, prefix_shared: bool = True,
              grad_checkpointing: bool = False, old_logprob_forward: bool = True,
              completion_logits_only: bool = False) -> dict:
    """JSON-ready summary for ``race flops``: sizes, the per-token cost at the mean
    decode context P + C/2, and one on-policy GRPO step for ONE prompt (n rollouts
    generated, all n trained, each scored once). Options as in `search_flops` and
    `learning_flops`."""
    lengths = {"prompt_len": prompt_len, "completion_len": completion_len}
    search = search_flops(arch, n=n, prefix_shared=prefix_shared, lora=lora, **lengths)
    learning = learning_flops(arch, sequences=n, lora=lora, mu=mu, ref_logprobs=ref_logprobs,
                              grad_checkpointing=grad_checkpointing,
                              old_logprob_forward=old_logprob_forward,
                              completion_logits_only=completion_logits_only, **lengths)
    feedback = reward_flops(reward, sequences=n, **lengths)
    total = search + learning + feedback
    context = float(prompt_len) + float(completion_len) / 2
    return {
        "model": arch.name,
        "params": param_count(arch),
        "matmul_params": matmul_params(arch),
        "lora": None if lora is None else {"rank": lora.rank,
                                           "target_modules": list(lora.target_modules)},
        "lora_params": 0 if lora is None else lora_param_count(arch, lora),
        "forward_flops_per_token": {"context_len": context,
                                    "flops": forward_flops_per_token(arch, context, lora=lora)},
        "settings": {**lengths, "n": n, "mu": mu, "ref_logprobs": ref_logprobs,
                     "prefix_shared": prefix_shared, "grad_checkpointing": grad_checkpointing,
                     "old_logprob_forward": old_logprob_forward,
                     "completion_logits_only": completion_logits_only,
                     "reward_model": None if reward is None else reward.arch.name},
        "per_prompt_flops": {"search": search, "learning": learning, "reward": feedback,
                             "total": total},
        "shares": {k: (v / total if total else 0.0) for k, v in
                   (("search", search), ("learning", learning), ("reward", feedback))},
        "rho": learning / total if total else 0.0,
    }
