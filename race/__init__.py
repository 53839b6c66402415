"""RACE: reward-aware compute allocation for RL post-training.

``import race`` is light: it pulls in no torch, transformers, vllm or optuna.
Heavy pieces load when they are used.
"""
from race.records import (Diagnosis, FlopBreakdown, PilotResult, PointSummary, Regime, Schedule,
                          TargetVerdict)

__version__ = "0.1.0"

__all__ = [
    "Diagnosis", "FlopBreakdown", "PilotResult", "PointSummary", "Regime", "Schedule",
    "TargetVerdict", "__version__",
]
