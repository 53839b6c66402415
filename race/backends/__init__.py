"""Rollout backends behind one small interface (see ``base.RolloutBackend``).

Backends are registered as lazy ``"module:Class"`` strings so that a heavy
engine (vLLM) is imported only when chosen.
"""
from __future__ import annotations

import importlib

BACKENDS = {
    "hf": "race.backends.hf:HFBackend",
}


def backend_class(name: str):
    """The backend class for ``name`` (imports its module on first use)."""
    if name not in BACKENDS:
        raise ValueError(f"backend {name!r} is unknown: expected one of {', '.join(sorted(BACKENDS))}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def resolve_backend(name: str) -> str:
    """``auto`` → vLLM when it is importable and a GPU is present, else HF."""
    if name != "auto":
        return name
    import importlib.util

    if "vllm" in BACKENDS and importlib.util.find_spec("vllm") is not None:
        import torch

        if torch.cuda.is_available():
            return "vllm"
    return "hf"
