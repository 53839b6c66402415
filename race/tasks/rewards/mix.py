"""Weighted sums of rule rewards: ``reward: {kind: mix, mix: {math: 0.9, format: 0.1}}``.

``mix_reward(weights)`` is ``Σ weight · reward(prompt, completion, reference)`` over the named rule
rewards (``RULE_REWARDS``: sparse, structured, dense, math, format). Invariants: at least one
component; every name a rule reward; every weight a finite number > 0 (not a boolean); the
weights are used as given (not normalised), so ``{math: 0.9, format: 0.1}`` stays in [0, 1].
The math-checking components share one time limit per check (``reward.check_timeout``). A bad
mix is a one-line ``RewardError`` naming the value and what was expected; ``race.config.configfile`` checks
the same rules before any compute.
"""
from __future__ import annotations

import math
from typing import Mapping

from race.tasks.rewards.answers import CHECK_TIMEOUT, format_reward, math_reward
from race.tasks.rewards.base import REWARDS, RewardError, RewardFn

RULE_REWARDS = ("sparse", "structured", "dense", "math", "format")


def rule_reward(name: str, *, check_timeout: float = CHECK_TIMEOUT) -> RewardFn:
    """The rule reward ``name``; ``math`` and ``format`` with ``check_timeout`` seconds a check."""
    if name == "math":
        return math_reward(check_timeout)
    if name == "format":
        return format_reward(check_timeout)
    if name not in RULE_REWARDS:
        raise RewardError(f"reward {name!r} is not a rule reward: expected one of {', '.join(RULE_REWARDS)}")
    return REWARDS[name]


def check_mix(weights: object) -> dict[str, float]:
    """``weights`` as ``{name: float}``, or a one-line ``RewardError``."""
    if not isinstance(weights, Mapping) or not weights:
        raise RewardError(f"reward.mix {weights!r} is not valid: expected a mapping of rule rewards to weights, "
                          "e.g. {math: 0.9, format: 0.1}")
    out = {}
    for name, w in weights.items():
        if name not in RULE_REWARDS:
            raise RewardError(f"reward.mix component {name!r} is unknown: expected one of {', '.join(RULE_REWARDS)}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise RewardError(f"reward.mix weight {w!r} of {name!r} is not valid: expected a finite number > 0")
        out[name] = float(w)
    return out


def mix_reward(weights: Mapping[str, float], *, check_timeout: float = CHECK_TIMEOUT) -> RewardFn:
    """``fn(prompt, completion, reference) = Σ weights[name] · name(prompt, completion, reference)``."""
    parts = [(w, rule_reward(name, check_timeout=check_timeout)) for name, w in check_mix(weights).items()]

    def mix(prompt: str, completion: str, reference: str) -> float:
        return sum(w * float(fn(prompt, completion, reference)) for w, fn in parts)

    mix.weights = dict(check_mix(weights))      # type: ignore[attr-defined]
    return mix
