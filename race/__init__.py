"""RACE: reward-aware compute allocation for RL post-training.

``import race`` is light: it pulls in no torch, transformers, vllm or optuna.
Heavy pieces load when they are used.
"""
from race.records import (Diagnosis, FlopBreakdown, PilotResult, PointSummary, Regime, Schedule,
                          TargetVerdict)

from race.version import __version__  # noqa: E402

_LAZY = {"diagnose": "race.api", "plan_grid": "race.grid", "classify": "race.regime",
         "GridConfig": "race.config", "load_config": "race.config", "load_results": "race.results",
         "plot_results": "race.plot", "recipe": "race.recipes", "run_models": "race.api",
         "plot_models": "race.plot"}


def __getattr__(name: str):
    """Heavy or secondary entry points load on first use, keeping ``import race`` light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'race' has no attribute {name!r}")


__all__ = [
    "classify", "diagnose", "plan_grid", "plot_results", "plot_models", "recipe", "run_models", "load_results", "GridConfig", "load_config", "Diagnosis", "FlopBreakdown", "PilotResult", "PointSummary", "Regime", "Schedule",
    "TargetVerdict", "__version__",
]
