"""The policy and the machine it runs on: device checks, model loading with its LoRA adapter,
the rollout backend, memory before calibration, seeds and the software versions a pilot records.

Invariants: a device or a memory size RACE cannot run on is one ``ConfigError`` line before any
model loads; the adapters placed are the ones the FLOP count assumes (race.flops.architectures checks
them); torch, transformers and peft load inside the functions (``import race`` stays light).
"""
from __future__ import annotations

import random
import warnings

from race.flops import formulas as F
from race.config.configfile import GridConfig
from race.core.records import Schedule


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_device(device: str) -> str:
    """``device`` if pilots can run there, else a one-line ConfigError naming it and what exists:
    ``cpu``, ``cuda`` or ``cuda:N`` with a CUDA build of torch and an N below the device count."""
    import re

    from race.core.errors import ConfigError

    if device == "cpu":
        return device
    m = re.fullmatch(r"cuda(?::(\d+))?", str(device))
    if not m:
        raise ConfigError(f"device {device!r} is not one RACE runs pilots on: expected cpu, cuda or cuda:N")
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ConfigError(f"device {device!r} needs a CUDA GPU, but {why} (torch {torch.__version__}): "
                          "use --device cpu, or run on a GPU machine")
    if m.group(1) is not None and int(m.group(1)) >= n:
        raise ConfigError(f"device {device!r} does not exist: this machine has {n} CUDA GPU(s), cuda:0 … cuda:{n - 1}")
    return device


def model_load_kwargs(device: str) -> dict:
    """``from_pretrained`` keywords for a device: bf16 on CUDA (fp32 elsewhere: CPU bf16 matmuls are slow
    and the tests compare log-probs at fp32 tolerance) and PyTorch SDPA attention, which on CUDA runs
    the flash / memory-efficient kernels (``race.engine.backends.hf.load_causal_lm`` falls back to the
    model's default attention where an architecture has no SDPA)."""
    import torch

    cuda = str(device).startswith("cuda")
    return {"dtype": torch.bfloat16 if cuda else torch.float32, "attn_implementation": "sdpa"}


def load_policy(config: GridConfig, *, device: str = "cpu", seeds=(0,)):
    """(tokenizer, policy, model path): the model with a fresh LoRA adapter on the configured modules.

    The policy is a ``LockstepLM`` (race.engine.backends.lockstep: the lean path, one adapter per seed of
    ``seeds``, each drawn as ``torch.manual_seed(seed)`` draws it) when ``grpo.fast_path`` is on,
    the architecture is supported and gradient checkpointing is off, else the HF model wrapped by
    peft (one adapter, from torch's global stream) — with HF's non-reentrant gradient checkpointing
    (one checkpoint per decoder layer, as ``flops.learning_flops(grad_checkpointing=True)``
    counts) when ``grpo.grad_checkpointing`` is on."""
    from peft import LoraConfig, get_peft_model
    from transformers.utils import logging as hf_logging

    from race.flops.grid import lora_spec, policy_arch

    hf_logging.disable_progress_bar()
    arch = policy_arch(config)
    lora = lora_spec(config, arch)
    tok, model, path = _pretrained(config, arch, device)
    from race.engine.backends.lean import supports

    if config.grpo.fast_path and not config.grpo.grad_checkpointing and supports(model.config) is None:
        from race.engine.backends.lockstep import LockstepLM

        model.requires_grad_(False)
        return tok, LockstepLM(model, rank=config.lora.rank, alpha=config.lora.alpha, targets=lora.target_modules,
                               seeds=seeds), path
    targets = _peft_targets(arch, lora, model)
    lcfg = LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha, lora_dropout=0.0, bias="none",
                      target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings():     # peft 0.21.2 reads transformers' deprecated is_gradient_checkpointing
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        policy = get_peft_model(model, lcfg)
    _check_peft_adapters(arch, lora, policy)
    if config.grpo.grad_checkpointing:
        enable_checkpointing(model)
        policy.train()          # HF checkpoints only in training mode (dropout is 0: nothing else changes)
    return tok, policy, path


def enable_checkpointing(model) -> None:
    """HF's non-reentrant checkpointing, one checkpoint per decoder layer, by the method's current
    name: ``activation_checkpointing_enable`` (transformers 5.25; the old name warns, and goes in v6),
    else ``gradient_checkpointing_enable``."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _pretrained(config: GridConfig, arch, device: str):
    """(tokenizer, model on ``device``, model path) of ``config.model``; a model that cannot be
    loaded (not cached and no hub, a misspelt or gated id, a folder without weights) raises
    ``race.flops.catalog.load_error``'s one-line error."""
    from transformers import AutoTokenizer

    from race.flops.architectures import EXPERTS_IMPLEMENTATION
    from race.engine.backends.hf import load_causal_lm
    from race.flops.catalog import resolve_model_path

    path = resolve_model_path(config.model)
    kw = model_load_kwargs(device)
    if arch.num_experts:      # the experts implementation the FLOP count is verified against
        kw["experts_implementation"] = EXPERTS_IMPLEMENTATION
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = load_causal_lm(path, **kw)
    except OSError as e:      # not cached and no hub, a misspelt or gated id, a folder without weights
        from race.flops.catalog import load_error

        raise load_error(config.model, e) from None
    return tok, model.to(device), path


def _peft_targets(arch, lora, model) -> list[str]:
    """The full paths of the modules peft adapts: the model's modules named as the architecture
    names the configured roles (for an approximate reading, a family RACE does not know, only the
    names the model has), and ``UnsupportedArchitecture`` when it has none. Full paths keep peft
    ≥ 0.22 off a MoE's routed experts (``race.flops.architectures.peft_module_paths``)."""
    from race.flops.architectures import UnsupportedArchitecture, peft_module_paths, peft_target_modules

    targets = peft_target_modules(arch, lora.target_modules)
    paths = peft_module_paths(targets, [name for name, _ in model.named_modules()])
    if not paths:
        raise UnsupportedArchitecture(f"model type {arch.model_type!r} has none of the LoRA modules "
                                      f"{', '.join(lora.target_modules)}: RACE cannot place adapters on it")
    return paths


def _check_peft_adapters(arch, lora, policy) -> None:
    """For a family RACE knows, the adapters peft built must be the ones the FLOP count assumes
    (one line if not); an approximate reading is not checked."""
    from race.flops.architectures import FAMILIES, check_adapted_modules

    if arch.model_type in FAMILIES:
        check_adapted_modules(arch, lora, [name for name, mod in policy.named_modules()
                                           if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {})])


def backend_options(config: GridConfig, name: str, *, device: str = "cpu", schedule: Schedule | None = None) -> dict:
    """Keyword arguments for backend ``name`` beyond (policy, tokenizer, model_path, device).

    vLLM on a GPU gets ``gpu_memory_utilization`` from the memory plan (race.flops.memory): its
    weights and the KV cache of one rollout batch (``schedule``'s, or calibration's 64 × 4
    samples), leaving the rest to training; and ``sleep`` (sleep mode during the update) as
    ``config.vllm_sleep`` decides against the device's memory (race.flops.memory.wants_vllm_sleep).
    ``vllm_sleep: on`` off a GPU is passed on, for the backend to refuse."""
    if name != "vllm":
        return {}
    if not str(device).startswith("cuda"):
        return {"sleep": True} if config.vllm_sleep == "on" else {}
    import torch

    from race.flops.grid import lora_spec, policy_arch
    from race.flops.memory import estimate_memory, schedule_memory, vllm_memory_fraction, wants_vllm_sleep

    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    if schedule is not None:
        est = schedule_memory(config, schedule, prompt_len=config.prompt_len, vllm_sleep=False)
    else:
        arch = policy_arch(config)
        est = estimate_memory(arch, lora_spec(config, arch),
                              prompt_len=config.prompt_len, completion_len=config.grpo.max_completion_len,
                              rollouts=64 * 4, train_sequences=1, sampler="vllm")
    return {"gpu_memory_utilization": vllm_memory_fraction(est, total),
            "sleep": wants_vllm_sleep(config.vllm_sleep, est, total)}


def group_backend(config: GridConfig, policy, tok, path: str, *, device: str = "cpu",
                  schedule: Schedule | None = None):
    """The rollout backend of a lean-path policy (a ``LockstepLM``) as a group of its seeds
    (``generate_seeds``, ``sync(seeds)``, ``view(seed)``): the lean sampler over every seed's merged
    weights (backend ``hf``); vLLM's multi-LoRA engine for several seeds; for one seed, the
    single-adapter vLLM backend (its memory plan and sleep mode) as a group of one."""
    from race.engine.backends import resolve_backend
    from race.engine.backends.lockstep import LockstepBackend, OneSeedGroup

    name = resolve_backend(config.backend)
    if name != "vllm":
        return LockstepBackend(policy, tok, device=device)
    if len(policy.seeds) > 1:                 # one engine, every seed's adapter (multi-LoRA)
        from race.engine.backends.vllm import VLLMLockstepBackend

        return VLLMLockstepBackend(policy, tok, model_path=path, device=device, max_model_len=None)
    from race.engine.backends.vllm import VLLMBackend

    return OneSeedGroup(VLLMBackend(policy, tok, model_path=path, device=device,
                                    **backend_options(config, name, device=device, schedule=schedule)),
                        policy.seeds[0])


def load_rollout(config: GridConfig, *, device: str = "cpu", schedule: Schedule | None = None, seed: int = 0):
    """(policy, rollout backend): the policy of ``load_policy`` (adapter of ``seed``) and the backend
    the config names (``race.engine.backends`` registry; ``auto`` resolved), sampling from it. On the lean
    path the backend is the one-seed view of ``group_backend`` that owns its group."""
    from race.engine.backends import backend_class, resolve_backend

    from race.engine.backends.lockstep import LockstepLM

    tok, policy, path = load_policy(config, device=device, seeds=(seed,))
    if isinstance(policy, LockstepLM):        # the lean path
        return policy, group_backend(config, policy, tok, path, device=device, schedule=schedule).view(seed, owner=True)
    name = resolve_backend(config.backend)
    backend = backend_class(name)(policy, tok, model_path=path, device=device,
                                  **backend_options(config, name, device=device, schedule=schedule))
    return policy, backend


def software_versions() -> dict:
    """The versions a pilot ran with (its results are reproducible bit for bit under the same ones)."""
    import platform
    import sys

    import peft
    import torch
    import transformers

    from race.core.version import __version__

    out = {"race": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__}
    vllm = sys.modules.get("vllm")
    if vllm is not None:
        out["vllm"] = getattr(vllm, "__version__", "?")
    return out


def _available_bytes(device: str) -> float | None:
    """Memory a pilot could use on ``device``: free GPU memory, or the host's MemAvailable."""
    if str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return float(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(config, device: str = "cpu") -> None:
    """Refuse, before calibration, a policy whose weights, LoRA adapters, their gradients and
    AdamW state cannot fit the memory ``device`` has free (fp32 on CPU, bf16 weights on CUDA),
    in one ``ConfigError`` line naming the sizes (e.g. ``lora.rank: 1000000``)."""
    from race.core.errors import ConfigError
    from race.flops.specs import lora_spec, policy_arch
    from race.core.units import fmt_bytes

    arch = policy_arch(config)
    lora = lora_spec(config, arch)
    weights = F.param_count(arch) * (2 if str(device).startswith("cuda") else 4)
    adapters = F.lora_param_count(arch, lora) * 4 * 4        # fp32 value, gradient, two AdamW moments
    available = _available_bytes(device)
    if available is not None and weights + adapters > available:
        raise ConfigError(f"the policy needs {fmt_bytes(weights)} of weights and {fmt_bytes(adapters)} of LoRA "
                          f"adapters with their gradients and optimizer state (lora.rank {config.lora.rank}), more "
                          f"than the {fmt_bytes(available)} free on {device}: lower lora.rank or use a smaller model")
