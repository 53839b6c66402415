"""What ``race.stats.regime.classify`` takes: its arguments checked before any fit, and the error it raises.

Invariants: every refusal is one ``ClassifyError`` line naming the value; ``CLASSIFY_KEYS`` are classify's keyword
arguments, the settings a results file's ``classify`` may hold (race.stats.results refuses others). Pure.
"""
from __future__ import annotations

from typing import Any

from race.core import arguments as A
from race.core.errors import RaceError
from race.core.records import PilotResult

MAX_BOOT = 100_000             # bootstrap resamples classify takes (the default 1000; more only costs time)

# classify's keyword arguments: what a results file's "classify" settings may hold (race.stats.results)
CLASSIFY_KEYS = ("targets", "primary_target", "reward_share_threshold", "n_boot", "confidence_level", "seed", "meta",
                 "rerun_confidence")


class ClassifyError(RaceError):
    """A bad argument to ``classify`` or pilots it cannot classify; the message is one line."""


def checked(results: Any, targets: Any, primary_target: Any, threshold: Any, n_boot: Any, level: Any, seed: Any,
             meta: Any, rerun_confidence: Any) -> tuple[list[PilotResult], list[str] | None]:
    """classify's arguments, each checked before any fit (ClassifyError, one line naming the value)."""
    E = ClassifyError
    results = A.items("results", results, error=E, what="race.PilotResult records")
    for i, r in enumerate(results):
        A.instance(f"results[{i}]", r, PilotResult, error=E, expected="a race.PilotResult (PilotResult.from_dict "
                   "reads a stored one)")
        A.number(f"results[{i}].rho_target", r.rho_target, gt=0.0, lt=1.0, error=E)
    if targets is not None:
        targets = [A.text(f"targets[{i}]", t, error=E)
                   for i, t in enumerate(A.items("targets", targets, error=E, what="target names"))]
    A.text("primary_target", primary_target, error=E)
    A.number("reward_share_threshold", threshold, gt=0.0, le=1.0, error=E)
    A.whole("n_boot", n_boot, ge=1, le=MAX_BOOT, error=E, floats=False)
    A.number("confidence_level", level, gt=0.0, lt=1.0, error=E)
    A.whole("seed", seed, ge=0, error=E, floats=False)
    if meta is not None:
        A.mapping("meta", meta, error=E)
    if rerun_confidence is not None:
        A.flag("rerun_confidence", rerun_confidence, error=E)
    return results, targets
