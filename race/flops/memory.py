"""Memory planning: the estimated peak accelerator memory of one pilot. Pure (no torch).

A pilot process holds, on its device:

- ``weights``: the base model, ``param_count · dtype_bytes`` (bf16: 2 bytes on a GPU);
- ``sampling_copy``: what sampling runs besides the training weights —
  the lean path (race.engine.backends.lean) keeps merged copies ``W + s·B·A`` of every
  adapted projection group (qkv, o, gate_up, down), the HF + peft path a full merged
  copy of the base model, the vLLM backend its own copy of the base weights (it
  serves the adapter unmerged);
- ``reward_model``: a reward model / PRM's weights (no LM head) for model-based rewards;
- ``lora_state``: the adapter in fp32 with its gradient and AdamW's two moments,
  ``16 bytes`` per LoRA parameter;
- rollout phase: ``kv_cache`` for ``B_p · n_gen`` sequences of ``P + C`` tokens,
  ``L · 2 · kv_heads · head_dim · dtype_bytes`` per token (the sampler allocates the
  cache for the longest completion), plus ``sampling_logits`` (one position per row,
  in the model dtype and two fp32 copies: scaled logits and probabilities);
- update phase: the activations autograd saves for one update pass over
  ``B_p · n_train`` sequences, or of one micro-batch (``grpo.micro_batch``: whole prompt
  groups of at most that many sequences, race.engine.grpo.micro_batches),
  and ``update_logits``: at the ``C + 1`` completion positions, ``LOGIT_COPIES`` tensors of the
  logits' size in the model dtype, plus one block of fp32 temporaries (race.engine.grpo.token_logprobs
  computes the log-probs and their gradient in blocks of ``LOGIT_BLOCK_ENTRIES`` positions ×
  vocabulary, ``LOGIT_BLOCK_TEMP_BYTES`` per entry of a block). Measured on an H200 in bf16
  (docs/benchmarks.md, GPU check): 6.6–6.9 bytes per entry above the rest of the plan, that is
  the logits and their gradient and about as much again in copies on their way through the
  head; four copies bound it. A whole-tensor fp32 log-softmax held 16 bytes per entry instead.

Peak = weights + sampling_copy + lora_state + overhead + max(rollout phase, update phase).

A vLLM engine (sampler ``vllm``) allocates its KV-cache pool once and holds it, with its copy
of the weights, through the update as well: awake, its ``kv_cache`` and ``sampling_logits``
count in the update phase too. With vLLM's sleep mode (``vllm_sleep``; CUDA only) the
engine sleeps at level 1 during the update — its weights offloaded to CPU memory, its KV
cache freed — so the update phase holds neither ``sampling_copy`` nor the cache.
``vllm_sleep: auto`` turns sleep on only when the awake plan does not fit the GPU
(``wants_vllm_sleep``): waking up copies the weights back every step.

Activations saved per token and layer (no checkpointing), from what the lean layer
keeps for backward: the residual input and the normed input of both RMSNorms (4·h),
q after RoPE, the attention output and its re-laid-out copy for o_proj (3·q_dim), k and
v (2·kv_dim), the gate/up output, silu(gate) and their product (4·i), and the LoRA
down-projections x·Aᵀ (r per adapted module). With gradient checkpointing (HF,
non-reentrant, one checkpoint per layer) only each layer's input h is kept, plus one
layer's full activations while it is recomputed. tests/test_memory.py checks the
formula against the tensors autograd actually saves on CPU.

Attention scores are not stored (SDPA / flash attention); on CPU's math fallback they
are, so a CPU pilot can use more. ``overhead`` (default 1 GiB on a GPU: CUDA context,
allocator slack) is a flat allowance.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from race.flops import formulas as F
from race.core.units import GiB, fmt_bytes, parse_bytes  # noqa: F401  (parse_bytes: re-exported)

# race.engine.grpo.token_logprobs works in blocks of this many entries (positions × vocabulary); its
# backward holds about five fp32 temporaries of a block at once (module docstring)
LOGIT_BLOCK_ENTRIES = 1 << 24
LOGIT_BLOCK_TEMP_BYTES = 20
LOGIT_COPIES = 4
DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp32": 4, "float32": 4}
SAMPLERS = ("lean", "hf-merged", "peft", "vllm")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per term (see the module docstring)."""

    weights: float
    sampling_copy: float
    lora_state: float
    kv_cache: float
    sampling_logits: float
    activations: float
    update_logits: float
    overhead: float
    reward_model: float = 0.0
    engine: str = ""        # a vLLM engine: "awake" (holds its pool through the update) or "asleep"; "" none

    @property
    def static(self) -> float:
        return self.weights + self.sampling_copy + self.lora_state + self.overhead + self.reward_model

    @property
    def rollout_peak(self) -> float:
        return self.static + self.kv_cache + self.sampling_logits

    @property
    def update_peak(self) -> float:
        held = {"awake": self.kv_cache + self.sampling_logits, "asleep": -self.sampling_copy}.get(self.engine, 0.0)
        return self.static + self.activations + self.update_logits + held

    @property
    def peak(self) -> float:
        return max(self.rollout_peak, self.update_peak)

    def to_dict(self) -> dict:
        return {**asdict(self), "rollout_peak": self.rollout_peak, "update_peak": self.update_peak,
                "peak": self.peak}

    def largest(self, k: int = 3) -> list[tuple[str, float]]:
        update = self.update_peak > self.rollout_peak
        terms = {n: v for n, v in asdict(self).items() if n != "engine"
                 and not (n in ("kv_cache", "sampling_logits") and update and self.engine != "awake")
                 and not (n == "sampling_copy" and update and self.engine == "asleep")
                 and not (n in ("activations", "update_logits") and self.update_peak <= self.rollout_peak)}
        return sorted(terms.items(), key=lambda kv: -kv[1])[:k]


def group_estimate(est: MemoryEstimate, seeds: int) -> MemoryEstimate:
    """One pilot process running a lockstep group of ``seeds`` (race.engine.lean_engine): the base weights, a
    reward model and the overhead are shared; every other term is per seed (each seed keeps its
    own merged copies, LoRA state, rollouts and update pass), except a vLLM engine's copy of the
    base weights, which serves every seed's adapter. Measured on an H200 (docs/benchmarks.md):
    Qwen2.5-0.5B, 3 seeds of 16 × 8 rollouts at 8 sequences per seed and pass, 46.4 GiB against
    46.3 by this rule from that day's plan of one pilot."""
    k = max(1, int(seeds))
    return replace(est, sampling_copy=est.sampling_copy * (1 if est.engine else k), lora_state=est.lora_state * k,
                   kv_cache=est.kv_cache * k, sampling_logits=est.sampling_logits * k,
                   activations=est.activations * k, update_logits=est.update_logits * k)


def largest_group(estimates: list[MemoryEstimate], seeds: int, gpu_bytes: float) -> int:
    """The most seeds (≤ ``seeds``, at least 1) a lockstep group can carry with every schedule's
    group estimate within ``gpu_bytes``."""
    for k in range(max(1, int(seeds)), 1, -1):
        if all(group_estimate(e, k).peak <= gpu_bytes for e in estimates):
            return k
    return 1


def kv_cache_bytes(arch: F.ArchSpec, *, sequences: float, tokens: float, dtype_bytes: int) -> float:
    """sequences × tokens × layers × 2 (K and V) × kv_heads × head_dim × bytes."""
    return sequences * tokens * arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim * dtype_bytes


def activation_elements_per_token_layer(arch: F.ArchSpec, lora: F.LoRASpec | None) -> float:
    """Elements autograd keeps per token and layer for a LoRA update (module docstring)."""
    q_dim, kv_dim = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    inter = arch.moe_intermediate_size * arch.experts_per_token if arch.num_experts else arch.intermediate_size
    mlp = 4 * inter if arch.gated_mlp else 2 * inter
    adapted = len(lora.target_modules) * lora.rank if lora is not None else 0
    return 4 * arch.hidden_size + 3 * q_dim + 2 * kv_dim + mlp + adapted


def activation_bytes(arch: F.ArchSpec, lora: F.LoRASpec | None, *, tokens: float, dtype_bytes: int,
                     grad_checkpointing: bool = False, max_seq_tokens: float | None = None) -> float:
    """Saved activations of one update pass over ``tokens`` tokens (all sequences together)."""
    per_layer = activation_elements_per_token_layer(arch, lora)
    if not grad_checkpointing:
        return tokens * arch.num_layers * per_layer * dtype_bytes
    # layer inputs of every layer, plus one layer recomputed in full during backward
    return tokens * (arch.num_layers * arch.hidden_size + per_layer) * dtype_bytes


def update_logit_bytes(entries: float, dtype_bytes: int) -> float:
    """The update's logits at their peak: ``entries`` (positions × vocabulary) × LOGIT_COPIES in the
    model dtype, plus one block of race.engine.grpo.token_logprobs' fp32 temporaries (module docstring)."""
    return entries * LOGIT_COPIES * dtype_bytes + min(entries, LOGIT_BLOCK_ENTRIES) * LOGIT_BLOCK_TEMP_BYTES


def sampling_copy_bytes(arch: F.ArchSpec, lora: F.LoRASpec, sampler: str, dtype_bytes: int) -> float:
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r} is unknown: expected one of {', '.join(SAMPLERS)}")
    if sampler == "peft":
        return 0.0
    if sampler in ("hf-merged", "vllm"):
        return F.param_count(arch) * dtype_bytes
    # lean: one merged copy per projection group that has an adapted member
    h = arch.hidden_size
    q_dim, kv_dim = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    t = set(lora.target_modules)
    groups = []
    if t & {"q_proj", "k_proj", "v_proj"}:
        groups.append(h * (q_dim + 2 * kv_dim))
    if "o_proj" in t:
        groups.append(q_dim * h)
    if not arch.num_experts:
        i = arch.intermediate_size
        if t & {"gate_proj", "up_proj"}:
            groups.append(h * i * (2 if arch.gated_mlp else 1))
        if "down_proj" in t:
            groups.append(i * h)
    return arch.num_layers * sum(groups) * dtype_bytes


def estimate_memory(arch: F.ArchSpec, lora: F.LoRASpec, *, prompt_len: float, completion_len: float,
                    rollouts: int, train_sequences: int, dtype_bytes: int = 2, grad_checkpointing: bool = False,
                    sampler: str = "lean", overhead: float = GiB,
                    reward: F.RewardModelSpec | None = None, vllm_sleep: bool = False) -> MemoryEstimate:
    """Peak-memory terms of one pilot step (``vllm_sleep``: the vLLM engine sleeps during the update).

    ``rollouts`` = B_p · n_gen sequences sampled at once; ``train_sequences`` = B_p · n_train
    sequences in one update pass; ``completion_len`` is the longest completion (the
    sampler's cache and the update's padding are sized by it).
    """
    tokens = prompt_len + completion_len
    V = arch.vocab_size
    return MemoryEstimate(
        weights=F.param_count(arch) * dtype_bytes,
        sampling_copy=sampling_copy_bytes(arch, lora, sampler, dtype_bytes),
        lora_state=16.0 * F.lora_param_count(arch, lora),
        kv_cache=kv_cache_bytes(arch, sequences=rollouts, tokens=tokens, dtype_bytes=dtype_bytes),
        sampling_logits=rollouts * V * (dtype_bytes + 8),
        activations=activation_bytes(arch, lora, tokens=train_sequences * tokens, dtype_bytes=dtype_bytes,
                                     grad_checkpointing=grad_checkpointing),
        update_logits=update_logit_bytes(train_sequences * (completion_len + 1) * V, dtype_bytes),
        overhead=overhead,
        reward_model=(F.param_count(reward.arch) - (0 if reward.arch.tie_word_embeddings else
                                                    reward.arch.vocab_size * reward.arch.hidden_size))
        * dtype_bytes if reward is not None else 0.0,
        engine=("asleep" if vllm_sleep else "awake") if sampler == "vllm" else "",
    )


def sampler_for(config) -> str:
    """Which sampling copy a config's pilots keep (``auto`` is planned as ``hf``)."""
    if config.backend == "vllm":
        return "vllm"
    from race.flops.specs import shares_prefix

    return "lean" if shares_prefix(config) else "hf-merged"


def schedule_memory(config, schedule, *, prompt_len: float, arch: F.ArchSpec | None = None,
                    dtype_bytes: int = 2, overhead: float = GiB, gpu_bytes: float | None = None,
                    vllm_sleep: bool | None = None) -> MemoryEstimate:
    """The estimate for one planned schedule of ``config`` (bf16 weights by default). A vLLM
    engine sleeps during the update when ``vllm_sleep`` says so, or, when it is None, as
    ``config.vllm_sleep`` decides against ``gpu_bytes`` (default: ``config.gpu_memory``)."""
    from race.flops.specs import lora_spec, policy_arch, reward_spec

    arch = arch or policy_arch(config)
    lora = lora_spec(config, arch)

    def est(sleep: bool) -> MemoryEstimate:
        return estimate_memory(arch, lora, prompt_len=prompt_len, completion_len=config.grpo.max_completion_len,
                               rollouts=schedule.prompts_per_step * schedule.n_gen,
                               train_sequences=update_sequences(schedule, config.grpo.micro_batch),
                               dtype_bytes=dtype_bytes,
                               grad_checkpointing=config.grpo.grad_checkpointing, sampler=sampler_for(config),
                               overhead=overhead, reward=reward_spec(config), vllm_sleep=sleep)

    if vllm_sleep is not None:
        return est(vllm_sleep)
    awake = est(False)
    gpu = gpu_bytes if gpu_bytes is not None else config.gpu_memory
    return est(True) if wants_vllm_sleep(config.vllm_sleep, awake, gpu) else awake


def wants_vllm_sleep(mode: str, awake: MemoryEstimate, gpu_bytes: float | None) -> bool:
    """Whether a vLLM engine should sleep during the update: ``on`` / ``off`` as set; ``auto``
    only when the awake estimate exceeds ``gpu_bytes`` (each wake-up copies the weights back)."""
    if awake.engine == "" or mode == "off":
        return False
    return mode == "on" or (gpu_bytes is not None and awake.peak > gpu_bytes)


def update_sequences(schedule, micro_batch: int | None) -> int:
    """Sequences in one update pass: the kept batch, or whole prompt groups of ≤ ``micro_batch``
    (race.engine.grpo.micro_batches; a group larger than it stays whole)."""
    total = schedule.prompts_per_step * schedule.n_train
    if not micro_batch or micro_batch >= total:
        return total
    return schedule.n_train * max(1, micro_batch // schedule.n_train)


def check_fits(rho_target: float, est: MemoryEstimate, gpu_bytes: float) -> None:
    """Raise a one-line ``ConfigError`` when the estimate exceeds ``gpu_bytes``."""
    from race.core.errors import ConfigError

    if est.peak <= gpu_bytes:
        return
    top = ", ".join(f"{n} {fmt_bytes(v)}" for n, v in est.largest())
    phase = "update" if est.update_peak > est.rollout_peak else "rollout"
    raise ConfigError(f"schedule ρ={rho_target:g} needs an estimated {fmt_bytes(est.peak)} of GPU memory "
                      f"({phase} phase; largest: {top}) but gpu_memory is {fmt_bytes(gpu_bytes)}: set or lower "
                      f"grpo.micro_batch, lower schedule.prompts_per_step, max_n_gen or grpo.max_completion_len, "
                      f"{'set vllm_sleep: auto, ' if est.engine == 'awake' else ''}"
                      f"or turn on grpo.grad_checkpointing")


def vllm_memory_fraction(est: MemoryEstimate, gpu_bytes: float, *, headroom: float = 1.25) -> float:
    """``gpu_memory_utilization`` for a vLLM engine sharing the GPU with training: its
    weights + the rollout KV cache (× ``headroom`` for vLLM's block granularity and
    activations), as a fraction of the GPU, clamped to [0.05, 0.9]."""
    need = (est.sampling_copy + est.kv_cache + est.sampling_logits) * headroom + 0.5 * GiB
    return min(0.9, max(0.05, need / gpu_bytes))
