"""RACE: reward-aware compute allocation for RL post-training.

``import race`` is light: it pulls in no torch, transformers, vllm or optuna.
Heavy pieces load when they are used.
"""
from race.core.records import (Diagnosis, FlopBreakdown, PilotResult, PointSummary, Regime, Schedule,
                          TargetVerdict)

from race.core.errors import ConfigError, RaceError  # noqa: E402
from race.core.version import __version__  # noqa: E402

_LAZY = {"diagnose": "race.run.api", "plan_grid": "race.flops.grid", "classify": "race.stats.regime",
         "GridConfig": "race.config.configfile", "load_config": "race.config.configfile", "load_results": "race.stats.results",
         "plot_results": "race.run.plot", "recipe": "race.fullrun.recipes", "run_models": "race.run.api",
         "plot_models": "race.run.plot"}


def __getattr__(name: str):
    """Heavy or secondary entry points load on first use, keeping ``import race`` light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'race' has no attribute {name!r}")


__all__ = [
    "classify", "diagnose", "plan_grid", "plot_results", "plot_models", "recipe", "run_models", "load_results", "GridConfig", "load_config", "Diagnosis", "FlopBreakdown", "PilotResult", "PointSummary", "Regime", "Schedule",
    "TargetVerdict", "RaceError", "ConfigError", "__version__",
]
