"""The architecture table: which model types RACE counts exactly, and how each one is read.

Pure module (stdlib and ``race.flops.formulas`` only; no torch, no transformers), so ``race flops`` /
``race plan`` stay torch-free. It holds

- ``FAMILIES``: one ``Family`` per supported ``model_type``, with everything the FLOP and
  parameter formulas need that a ``config.json`` does not say outright: the module names of a
  decoder layer and the LoRA *roles* they play (fused ``qkv_proj`` plays q, k and v), gated or
  plain MLP, where biases and norms sit, parallel residual blocks, and the defaults
  transformers fills in for keys a saved config leaves out (``save_pretrained`` drops values
  equal to the class default: a Gemma config need not say ``head_dim: 256``);
- ``read_arch``: a config dict → ``ArchReading`` (the ``ArchSpec`` plus warnings). A model type
  outside the table is refused with ``UnsupportedArchitecture`` (one line) unless the caller
  opts in to an approximate, Llama-style reading, which then carries a warning;
- ``resolve_lora_targets`` / ``peft_target_modules``: ``lora.targets`` are *roles* named as in
  Llama (``q_proj`` … ``down_proj``; the family's own module names are accepted too), mapped
  per family to the modules peft will adapt. A target that matches no module is refused, and so
  is a target that names part of a fused module only; ``peft_module_paths`` turns the names into
  the model's full module paths, which peft ≥ 0.22 does not extend to a MoE's routed experts;
- ``sliding_window_warning``: local attention is counted as full causal attention (an upper
  bound); the warning says so when a window is shorter than the sequences.

Invariant: for every model type in ``FAMILIES``, forward, full fwd+bwd and LoRA fwd+bwd FLOPs of
``race.flops.formulas`` equal ``torch.utils.flop_counter.FlopCounterMode``'s count of the transformers
model built from a small config (eager attention, eager experts), and parameter / trainable
counts equal the model's and peft's (tests/test_architectures.py, bench/flop_accuracy.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from race.core.errors import ConfigError, RaceError
from race.flops.formulas import LORA_TARGETS, ArchSpec

ROLES = LORA_TARGETS      # q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj

# model types whose policy the lean backend (race.engine.backends.lean) runs natively
LEAN_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")

# How the routed experts of a MoE layer compute: the transformers experts implementation RACE
# loads MoE models with. "eager" runs each expert on the tokens routed to it (top-k per token),
# which is what race.flops.formulas counts and what FlopCounterMode can see (grouped_mm does the same
# arithmetic in kernels the counter does not record).
EXPERTS_IMPLEMENTATION = "eager"


MAX_SIZE = 2 ** 40      # any size in a model's config.json (hidden, heads, layers, vocabulary …) is far below this


class UnsupportedArchitecture(RaceError):
    """A model type (or a feature of one) RACE cannot count exactly; the message is one line."""


_LLAMA_NAMES = {r: r for r in ROLES}


@dataclass(frozen=True)
class Family:
    """What RACE knows about one ``model_type`` beyond the sizes in its config.

    ``names``: role → module name in a decoder layer (two roles with one name: a fused module).
    ``mlp``: "gated" (act(gate)·up → down), "plain" (act(up) → down) or "moe" (routed experts,
    3-D parameters RACE does not adapt; ``shared_expert`` adds an always-on gated MLP of linear
    modules that it does). Bias flags are True / False or the config key that sets them.
    ``norm``: "rms" (weight) or "layer" (weight and bias); ``post_mlp_norm``: a norm reads the
    MLP output (its input is saved, so checkpointing recomputes the layer's last matmul).
    ``qk_norm``: "" none, "head" (one weight of d per q and k: Qwen3, Gemma3), "full" (over the
    whole projection: OLMo2), or a config key enabling per-head LayerNorms (Phi).
    ``defaults``: transformers' values for keys a saved config may omit.
    """

    model_type: str
    names: Mapping[str, str] = field(default_factory=lambda: dict(_LLAMA_NAMES))
    mlp: str = "gated"
    shared_expert: bool = False
    qkv_bias: bool | str = False
    o_bias: bool | str = False
    mlp_bias: bool | str = False
    lm_head_bias: bool = False
    norm: str = "rms"
    norms_per_layer: int = 2
    post_mlp_norm: bool = False
    qk_norm: str = ""
    parallel_residual: bool | str = False
    gqa: bool = True
    sliding: str = ""            # "" none, "all" (every layer when sliding_window is set), "qwen", "layer_types"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def fused(self) -> dict[str, tuple[str, ...]]:
        """Module name → the roles it plays, for every module in a decoder layer."""
        out: dict[str, tuple[str, ...]] = {}
        for role, name in self.names.items():
            out[name] = out.get(name, ()) + (role,)
        return out


def _family(model_type: str, **kw: Any) -> Family:
    return Family(model_type, **kw)


_QWEN_SLIDING = dict(sliding_window=None, use_sliding_window=False)
FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    _family("llama", qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                          intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False,
                          attention_bias=False, mlp_bias=False)),
    _family("mistral", sliding="all",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False, sliding_window=4096)),
    _family("qwen2", qkv_bias=True, sliding="qwen",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                          intermediate_size=22016, vocab_size=151936, tie_word_embeddings=False, **_QWEN_SLIDING)),
    _family("qwen3", qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="head", sliding="qwen",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                          head_dim=128, intermediate_size=22016, vocab_size=151936, tie_word_embeddings=False,
                          attention_bias=False, **_QWEN_SLIDING)),
    _family("gemma", qkv_bias="attention_bias", o_bias="attention_bias",
            defaults=dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=16,
                          head_dim=256, intermediate_size=24576, vocab_size=256000, tie_word_embeddings=True,
                          attention_bias=False)),
    _family("gemma2", qkv_bias="attention_bias", o_bias="attention_bias", norms_per_layer=4, post_mlp_norm=True,
            sliding="layer_types",
            defaults=dict(hidden_size=2304, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=256, intermediate_size=9216, vocab_size=256000, tie_word_embeddings=True,
                          attention_bias=False, sliding_window=4096)),
    _family("gemma3_text", qkv_bias="attention_bias", o_bias="attention_bias", norms_per_layer=4,
            post_mlp_norm=True, qk_norm="head", sliding="layer_types",
            defaults=dict(hidden_size=2304, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                          head_dim=256, intermediate_size=9216, vocab_size=262208, tie_word_embeddings=True,
                          attention_bias=False, sliding_window=4096)),
    _family("granite", qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias",
            note="embedding / residual / attention / logit multipliers are element-wise (not counted)",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                          intermediate_size=11008, vocab_size=32000, tie_word_embeddings=False,
                          attention_bias=False, mlp_bias=False)),
    _family("olmo2", qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="full", post_mlp_norm=True,
            note="norms after attention and after the MLP, none before",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                          intermediate_size=11008, vocab_size=50304, tie_word_embeddings=False,
                          attention_bias=False)),
    _family("phi3", names={"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
                           "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"},
            sliding="all", note="fused qkv_proj and gate_up_proj: one LoRA pair per fused module",
            defaults=dict(hidden_size=3072, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None,
                          intermediate_size=8192, vocab_size=32064, tie_word_embeddings=False, sliding_window=None)),
    _family("starcoder2", names={"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "o_proj",
                                 "up_proj": "c_fc", "down_proj": "c_proj"},
            mlp="plain", qkv_bias="use_bias", o_bias="use_bias", mlp_bias="use_bias", norm="layer", sliding="all",
            note="plain GELU MLP c_fc → c_proj, LayerNorm with bias",
            defaults=dict(hidden_size=3072, num_hidden_layers=30, num_attention_heads=24, num_key_value_heads=2,
                          intermediate_size=12288, vocab_size=49152, tie_word_embeddings=True, use_bias=True,
                          sliding_window=None)),
    _family("phi", names={"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "dense",
                          "up_proj": "fc1", "down_proj": "fc2"},
            mlp="plain", qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True, norm="layer",
            norms_per_layer=1, qk_norm="qk_layernorm", parallel_residual=True,
            note="attention and MLP in parallel from one LayerNorm; biases everywhere, LM head included",
            defaults=dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=None,
                          intermediate_size=8192, vocab_size=51200, tie_word_embeddings=False, qk_layernorm=False)),
    _family("gpt_neox", names={"q_proj": "query_key_value", "k_proj": "query_key_value",
                               "v_proj": "query_key_value", "o_proj": "dense",
                               "up_proj": "dense_h_to_4h", "down_proj": "dense_4h_to_h"},
            mlp="plain", qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias=True, norm="layer",
            parallel_residual="use_parallel_residual", gqa=False,
            note="fused query_key_value (no grouped-query attention), parallel residual by default",
            defaults=dict(hidden_size=6144, num_hidden_layers=44, num_attention_heads=64,
                          intermediate_size=24576, vocab_size=50432, tie_word_embeddings=False,
                          attention_bias=True, use_parallel_residual=True)),
    _family("mixtral", mlp="moe", sliding="all",
            defaults=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False,
                          num_local_experts=8, num_experts_per_tok=2, sliding_window=None)),
    _family("qwen2_moe", mlp="moe", shared_expert=True, qkv_bias="qkv_bias", sliding="qwen",
            defaults=dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                          intermediate_size=5632, vocab_size=151936, tie_word_embeddings=False, qkv_bias=True,
                          num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                          shared_expert_intermediate_size=5632, mlp_only_layers=[], decoder_sparse_step=1,
                          sliding_window=0, use_sliding_window=False)),
    _family("qwen3_moe", mlp="moe", qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="head",
            sliding="qwen",
            defaults=dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                          intermediate_size=6144, vocab_size=151936, tie_word_embeddings=False,
                          attention_bias=False, num_local_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768, mlp_only_layers=[], decoder_sparse_step=1,
                          sliding_window=None, use_sliding_window=False)),
)}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


@dataclass(frozen=True)
class ArchReading:
    """An ``ArchSpec`` read from a config, the family it was read as (None: approximate), and
    the assumptions made (one line each; empty when every figure is exact)."""

    arch: ArchSpec
    family: Family | None
    warnings: tuple[str, ...] = ()


def _text_config(cfg: Mapping) -> Mapping:
    """A multimodal config's language model (``text_config``) when the top level has no sizes."""
    if "hidden_size" not in cfg and isinstance(cfg.get("text_config"), Mapping):
        text = cfg["text_config"]
        out = {**text}
        if "tie_word_embeddings" not in text and "tie_word_embeddings" in cfg:
            out["tie_word_embeddings"] = cfg["tie_word_embeddings"]
        return out
    return cfg


def model_type_of(cfg: Mapping) -> str:
    """The config's ``model_type`` (a nested ``text_config``'s when the top level has no sizes)."""
    return str(_text_config(cfg).get("model_type", "") or "")


def read_arch(cfg: Mapping, *, name: str | None = None, allow_approximate: bool = False,
              what: str = "model") -> ArchReading:
    """Read a Hugging Face ``config.json`` dict.

    A ``model_type`` in ``FAMILIES`` is read exactly (defaults as transformers fills them in).
    Any other is refused with one line naming it and the supported types, unless
    ``allow_approximate``: then it is read as a Llama-style decoder (gated MLP when the config
    has an ``intermediate_size`` and no expert keys say otherwise) and the reading carries a
    warning saying so. ``what`` names the model in messages ("model", "reward model", …).
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"expected a config.json mapping, got {type(cfg).__name__}")
    top = cfg
    cfg = _text_config(cfg)
    model_type = str(cfg.get("model_type", "") or "")
    family, exact_family, warnings = _read_family(cfg, model_type, allow_approximate=allow_approximate, what=what)
    spec = _arch_spec(_ConfigReader(cfg, family, what), model_type, top=top, name=name)
    return ArchReading(spec, exact_family, tuple(warnings))


def _read_family(cfg: Mapping, model_type: str, *, allow_approximate: bool,
                 what: str) -> tuple[Family, Family | None, list[str]]:
    """(the family the config is read as, the table's family or None when approximate, warnings):
    ``UnsupportedArchitecture`` for a type outside the table unless ``allow_approximate``."""
    family = FAMILIES.get(model_type)
    if family is not None:
        return family, family, []
    shown = model_type or "(no model_type in config.json)"
    if not allow_approximate:
        raise UnsupportedArchitecture(
            f"{what} type {shown!r} is not in RACE's architecture table, so its FLOPs cannot be counted exactly: "
            f"supported are {', '.join(SUPPORTED_MODEL_TYPES)} (docs/flops.md); pass --allow-approximate "
            f"(config: allow_approximate_flops: true) to count it as a Llama-style decoder")
    warning = (f"{what} type {shown!r} is not in RACE's architecture table: its FLOPs are counted as a "
               f"Llama-style decoder (q/k/v/o, gated MLP, no fused modules), which may be wrong")
    family = Family(model_type or "unknown", qkv_bias="attention_bias", o_bias="attention_bias",
                    mlp_bias="mlp_bias",
                    mlp="moe" if (cfg.get("num_local_experts") or cfg.get("num_experts")) else "gated",
                    shared_expert=bool(cfg.get("shared_expert_intermediate_size")))
    return family, None, [warning]


class _ConfigReader:
    """A text config's keys as the family reads them: its defaults fill in what the config leaves
    out; values are checked as integers, missing required keys named (``what``: the model's noun)."""

    def __init__(self, cfg: Mapping, family: Family, what: str) -> None:
        self.cfg, self.family, self.what = cfg, family, what

    def get(self, key: str, default: Any = None) -> Any:
        cfg = self.cfg
        if cfg.get(key) is not None:
            return cfg[key]
        if key in cfg and cfg[key] is None and key in ("num_key_value_heads", "head_dim"):
            return default
        return self.family.defaults.get(key, default)

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"{self.what} config is missing '{key}' (needed for the architecture)")
        return value

    def flag(self, setting: bool | str) -> bool:
        """A family setting: a fixed bool, or the name of the config key that holds it."""
        return bool(self.get(setting, False)) if isinstance(setting, str) else bool(setting)

    def integer(self, key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or int(value) != value:
            raise ConfigError(f"{self.what} config '{key}' is {str(value)[:40]}: expected an integer")
        if not 0 <= value <= MAX_SIZE:
            raise ConfigError(f"{self.what} config '{key}' is {str(value)[:40]}: expected a size from 0 to {MAX_SIZE:,} "
                              "(a config.json of a real model)")
        return int(value)


def _arch_spec(r: _ConfigReader, model_type: str, *, top: Mapping, name: str | None) -> ArchSpec:
    """The ``ArchSpec`` of the config ``r`` reads (keys read, and their errors raised, in a fixed order)."""
    family, get, need, integer = r.family, r.get, r.need, r.integer
    hidden = integer("hidden_size", need("hidden_size"))
    heads = integer("num_attention_heads", need("num_attention_heads"))
    layers = integer("num_hidden_layers", need("num_hidden_layers"))
    kv_given, dim_given = get("num_key_value_heads"), get("head_dim")       # null: not given (0 is an error)
    kv = heads if not family.gqa or kv_given is None else integer("num_key_value_heads", kv_given)
    for key, value in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if value < 1:
            raise ConfigError(f"{r.what} config '{key}' is {value}: expected at least 1")
    head_dim = integer("head_dim", hidden // heads if dim_given is None else dim_given)
    moe = family.mlp == "moe"
    experts, dense_layers = _experts(r, model_type, layers) if moe else (0, ())
    tie = get("tie_word_embeddings")
    qk = family.qk_norm
    if qk not in ("", "head", "full"):
        qk = "head" if r.flag(qk) else ""
    return ArchSpec(
        name=name or str(top.get("_name_or_path") or model_type or "model"),
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=integer("intermediate_size", get("intermediate_size") or 0) if moe
        else integer("intermediate_size", need("intermediate_size")),
        vocab_size=integer("vocab_size", need("vocab_size")),
        tie_word_embeddings=bool(tie) if tie is not None else False,
        gated_mlp=family.mlp != "plain",
        qkv_bias=r.flag(family.qkv_bias), o_bias=r.flag(family.o_bias), mlp_bias=r.flag(family.mlp_bias),
        lm_head_bias=family.lm_head_bias, norm_bias=family.norm == "layer",
        num_experts=experts,
        experts_per_token=integer("num_experts_per_tok", need("num_experts_per_tok")) if moe else 0,
        moe_intermediate_size=integer("moe_intermediate_size", get("moe_intermediate_size")
                                      or (need("intermediate_size") if moe else 0)),
        shared_expert_intermediate_size=integer("shared_expert_intermediate_size",
                                                get("shared_expert_intermediate_size") or 0)
        if family.shared_expert else 0,
        dense_layers=dense_layers,
        qk_norm=qk, norms_per_layer=family.norms_per_layer, post_mlp_norm=family.post_mlp_norm,
        parallel_residual=r.flag(family.parallel_residual),
        fused_qkv=family.names["q_proj"] == family.names["k_proj"],
        fused_gate_up=family.names.get("gate_proj") is not None
        and family.names.get("gate_proj") == family.names.get("up_proj"),
        model_type=model_type,
        sliding_window=_sliding(r.cfg, family, layers, get),
    )


def _experts(r: _ConfigReader, model_type: str, layers: int) -> tuple[int, tuple[int, ...]]:
    """A MoE config's expert count and its dense (expert-free) layers."""
    experts = r.integer("num_experts", r.get("num_local_experts") or r.get("num_experts") or 0)
    if not experts:
        raise ConfigError(f"{r.what} config of type {model_type!r} has no expert count (num_experts / "
                         "num_local_experts)")
    only = r.get("mlp_only_layers") or []
    step = r.integer("decoder_sparse_step", r.get("decoder_sparse_step") or 1)
    return experts, tuple(i for i in range(layers) if i in only or (i + 1) % step != 0)


def _sliding(cfg: Mapping, family: Family, layers: int, get) -> tuple[int, int]:
    """(window, layers using it), (0, 0) when attention is global everywhere."""
    window = get("sliding_window")
    if not window or family.sliding == "":
        return (0, 0)
    types = cfg.get("layer_types")
    if isinstance(types, (list, tuple)) and types:
        n = sum(1 for t in types if t == "sliding_attention")
    elif family.sliding == "all":
        n = layers
    elif family.sliding == "qwen":
        if not get("use_sliding_window"):
            return (0, 0)
        n = max(0, layers - int(get("max_window_layers") or 0))
    else:                                        # gemma2: every other layer; gemma3: five of six
        n = layers // 2 if family.model_type == "gemma2" else layers - layers // 6
    return (int(window), n) if n else (0, 0)


def sliding_window_warning(arch: ArchSpec, max_tokens: float) -> str | None:
    """One line when local attention is shorter than the sequences (counted as full causal
    attention: an upper bound on what a sliding-window kernel computes)."""
    window, n = arch.sliding_window
    if not window or max_tokens <= window:
        return None
    return (f"{n} of {arch.num_layers} layers of {arch.name} use sliding-window attention (window {window} tokens), "
            f"shorter than sequences of up to {max_tokens:g} tokens: their attention is counted as full causal "
            f"attention, an upper bound")


# ---------------------------------------------------------------- LoRA targets

def _family_of(arch: ArchSpec) -> Family:
    return FAMILIES.get(arch.model_type) or Family(arch.model_type or "unknown",
                                                   mlp="moe" if arch.num_experts else "gated",
                                                   shared_expert=bool(arch.shared_expert_intermediate_size))


def adaptable_modules(arch: ArchSpec) -> dict[str, tuple[str, ...]]:
    """Module name → roles, for the linear modules of a decoder layer peft's ``target_modules``
    can adapt (routed experts are 3-D parameters, not linear modules; a shared expert's are)."""
    fam = _family_of(arch)
    out = {}
    for name, roles in fam.fused().items():
        mlp = any(r in ("gate_proj", "up_proj", "down_proj") for r in roles)
        if mlp and arch.num_experts and not arch.shared_expert_intermediate_size and not arch.dense_layers:
            continue
        out[name] = roles
    return out


def resolve_lora_targets(arch: ArchSpec, targets: Any) -> tuple[str, ...]:
    """The roles ``targets`` adapt in ``arch``, in ROLES order.

    ``targets``: roles (``q_proj`` … ``down_proj``) or the family's module names (``qkv_proj``,
    ``c_fc``, …). The full role set (the default, ``targets: all``) means every linear module of
    the layer, whatever the family calls it. Otherwise every entry must match a module peft can
    adapt, and a fused module is targeted whole or not at all. Raises ``ValueError`` (one line).
    """
    given = (targets,) if isinstance(targets, str) else tuple(targets)
    modules = adaptable_modules(arch)
    by_name = {**{r: (r,) for r in ROLES}, **modules}
    if set(given) == set(ROLES):
        return ROLES
    roles: set[str] = set()
    for t in given:
        if t not in by_name:
            raise ConfigError(f"lora.targets entry {t!r} is not a module of {arch.model_type or arch.name}: expected "
                             f"roles {', '.join(ROLES)} or its module names {', '.join(modules)}")
        wanted = by_name[t]
        if not any(set(wanted) & set(r) for r in modules.values()):
            why = (" (routed experts are 3-D parameters that peft's target_modules cannot adapt)"
                   if arch.num_experts and t in ("gate_proj", "up_proj", "down_proj") else "")
            raise ConfigError(f"lora.targets entry {t!r} matches no module of {arch.model_type or arch.name}{why}: "
                             f"adaptable modules are {', '.join(modules)}")
        roles |= set(wanted)
    for name, played in modules.items():
        if len(played) > 1 and roles & set(played) and not set(played) <= roles:
            raise ConfigError(f"lora.targets names part of the fused module {name!r} of {arch.model_type}: it plays "
                             f"{', '.join(played)} and is adapted whole, so target all of them or none")
    return tuple(r for r in ROLES if r in roles)


def peft_target_modules(arch: ArchSpec, roles: Any) -> list[str]:
    """The module names to give peft's ``LoraConfig(target_modules=…)`` for resolved ``roles``, in the
    family's layer order (``q_proj`` … ``down_proj`` on a Llama; ``qkv_proj`` … on a Phi-3)."""
    chosen = set(resolve_lora_targets(arch, roles))
    return [name for name, played in adaptable_modules(arch).items() if set(played) <= chosen]


def peft_module_paths(targets: list[str], module_names: Any) -> list[str]:
    """The full names, among a model's ``module_names``, of the modules whose last name part is in
    ``targets`` (what ``peft_target_modules`` returns), in the model's order.

    RACE gives peft these paths rather than the bare names: from peft 0.22, a bare ``gate_proj`` /
    ``up_proj`` / ``down_proj`` on a Qwen2-MoE also puts LoRA on the routed experts' 3-D parameters
    (peft maps transformers 4's per-expert names onto transformers 5's fused ones), which RACE
    neither counts nor adapts. A full path names one linear module and is left as it is."""
    wanted = set(targets)
    return [name for name in module_names if name.rsplit(".", 1)[-1] in wanted]


def lora_note(arch: ArchSpec, roles: Any) -> str | None:
    """A line for plans and reports when LoRA reaches fewer modules than the roles name
    (MoE: routed experts are not adapted)."""
    chosen = resolve_lora_targets(arch, roles)
    if arch.num_experts and any(r in chosen for r in ("gate_proj", "up_proj", "down_proj")):
        reached = "the shared expert's MLP" if arch.shared_expert_intermediate_size else "no MLP"
        return (f"LoRA on {arch.model_type}: the routed experts are not adapted (RACE adapts linear modules; the "
                f"experts are 3-D parameters); the MLP roles reach {reached}")
    return None


def check_adapted_modules(arch: ArchSpec, lora, adapted: list[str]) -> None:
    """Compare the modules peft adapted (full names) with what the FLOP count assumes for
    ``lora`` (a ``race.flops.formulas.LoRASpec`` of resolved roles): the same module names and one
    adapter per adapted module per layer. Raises ``UnsupportedArchitecture`` (one line) if not."""
    from race.flops.formulas import adapted_module_count

    expected_names = set(peft_target_modules(arch, lora.target_modules))
    names = {n.rsplit(".", 1)[-1] for n in adapted}
    expected = adapted_module_count(arch, lora)
    if names != expected_names or len(adapted) != expected:
        raise UnsupportedArchitecture(
            f"peft adapted {len(adapted)} modules ({', '.join(sorted(names)) or 'none'}) of {arch.model_type or arch.name}, "
            f"but RACE's architecture table counts {expected} ({', '.join(sorted(expected_names))}): the FLOP count "
            f"would not match the model, so the pilot stops; please report this model's config.json")
