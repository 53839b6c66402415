"""Adaptive grids: policies that run a share of the full grid's pilots, rung by rung, as objects.

Interface:
- ``base``: ``AdaptivePolicy`` (the protocol: ``name``, ``stored``, ``description``, ``needed``),
  ``adaptive_cap``, ``DEFAULT_SHARE``, ``Key``.
- ``informative``: ``Informative``, the default (seed 0 everywhere, then the most useful seeds).
- ``halving``: ``Halving`` (successive halving over ρ, seeds as the resource).
- ``budget``: ``BudgetHalving`` (successive halving over ρ, the budget as the resource: its keys are
  stages (ρ, seed, rung), and its ``resource`` is ``"budget"``; race.run.study pauses and continues pilots).
- ``POLICIES`` (the one table of policies, the default first), ``policy_named``, ``resolve_adaptive``,
  ``adaptive_needed`` (a policy over seeds that start at ``first_seed``), ``adaptive_subset`` (replays),
  ``adaptive_most`` (the most pilots a policy runs on a grid, from the grid alone; for budget halving
  its most training compute in pilots), ``is_budget`` (a policy whose keys are stages). ``adaptive_needed``,
  ``adaptive_subset`` and ``adaptive_most`` take the policy object itself as ``rule`` where it is not the
  table's (budget halving with another ``Ladder``).

Adding a policy is adding a file with a class that keeps the protocol, and its line in ``POLICIES``.

Invariants: pure and deterministic; a policy name is checked once, where the run options are
(race.run.options.RunOptions.check, through ``resolve_adaptive``).
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from race.run.adaptive.base import DEFAULT_SHARE, AdaptivePolicy, Key, adaptive_cap  # noqa: F401
from race.run.adaptive.budget import (BudgetHalving, Ladder, Stage, budget_halving, halving_cost, rung_marks,  # noqa: F401
                                      rung_survivors)
from race.run.adaptive.halving import Halving, successive_halving  # noqa: F401
from race.run.adaptive.informative import Informative, allocate_seeds, informative_seeds  # noqa: F401

POLICIES: dict[str, AdaptivePolicy] = {p.name: p for p in (Informative(), Halving(), BudgetHalving())}   # the first: --adaptive
ADAPTIVE_POLICIES = tuple(POLICIES)


def resolve_adaptive(adaptive: bool | str | None) -> str | None:
    """None (full grid) or a policy name; True means the default policy."""
    if adaptive is None or adaptive is False:
        return None
    if adaptive is True:
        return ADAPTIVE_POLICIES[0]
    if adaptive not in POLICIES:
        from race.core.errors import ConfigError

        raise ConfigError(f"adaptive policy {adaptive!r} is not known: expected one of {', '.join(ADAPTIVE_POLICIES)}")
    return adaptive


def policy_named(name: str) -> AdaptivePolicy:
    """The policy called ``name`` (a name ``resolve_adaptive`` accepted)."""
    return POLICIES[resolve_adaptive(name)]


def policy_stored(stored: Mapping[str, object] | None) -> AdaptivePolicy | None:
    """The policy a study's ``adaptive`` attribute names (None: none, or one this version lacks)."""
    kind = (stored or {}).get("policy")
    return next((p for p in POLICIES.values() if p.stored["policy"] == kind), None)


def adaptive_needed(policy: str, grid: Sequence[float], seeds: int, scores: Mapping[Key, float],
                    given_up: set[Key] = frozenset(), share: float = DEFAULT_SHARE,
                    first_seed: int = 0, rule: AdaptivePolicy | None = None) -> tuple[list[Key], bool]:
    """The pilots adaptive ``policy`` needs so far (``share`` of the full grid's), and whether
    that list is final. The rules number seeds 0 … seeds − 1 (rung k runs seed k); a grid whose
    seeds start at ``first_seed`` runs rung k's pilots with seed ``first_seed + k``. ``rule``: the
    policy object (default: the table's ``policy``)."""
    rule = rule or policy_named(policy)
    if not first_seed:
        return rule.needed(grid, seeds, scores, given_up, share=share)
    scores = {(k[0], k[1] - first_seed, *k[2:]): v for k, v in scores.items()}
    given_up = {(k[0], k[1] - first_seed, *k[2:]) for k in given_up}
    keys, final = rule.needed(grid, seeds, scores, given_up, share=share)
    return [(k[0], k[1] + first_seed, *k[2:]) for k in keys], final


def adaptive_subset(policy: str, grid: Sequence[float], seeds: int, score: Callable[[Key], float],
                    share: float = DEFAULT_SHARE, first_seed: int = 0, rule: AdaptivePolicy | None = None) -> list[Key]:
    """The pilots ``policy`` runs when pilot ``key`` scores ``score(key)``: its rule fed rung by
    rung with the scores of what it already ran (for replays on a stored full grid)."""
    scores: dict[Key, float] = {}
    while True:
        keys, final = adaptive_needed(policy, grid, seeds, scores, share=share, first_seed=first_seed, rule=rule)
        new = [k for k in keys if k not in scores]
        for k in new:
            scores[k] = score(k)
        if final and not new:
            return keys


def adaptive_most(policy: str, grid: Sequence[float], seeds: int, share: float = DEFAULT_SHARE,
                  rule: AdaptivePolicy | None = None) -> int:
    """The most pilots ``policy`` runs on ``grid`` × ``seeds`` at ``share``, known before any pilot: what it
    runs when every pilot finishes. Each policy's count depends only on which pilots finished, never on
    their scores (informative: ``adaptive_cap``, or every seed of every point; halving: ⌈P / 2^k⌉ points at
    rung k up to the cap, so under the cap at a large share), and a pilot that failed only lowers it. A
    check before compute that needs the grid's most compute (race.fullrun.probe.check_probe_config) uses
    this, not the full grid's points × seeds. Budget halving (whose keys are stages): its most training
    compute in pilots of the full budget, rounded up (every tie kept to the cap)."""
    rule = rule or policy_named(policy)
    keys = adaptive_subset(policy, grid, seeds, lambda key: 0.0, share=share, rule=rule)
    if is_budget(rule):
        return math.ceil(halving_cost(keys, eta=rule.eta, rungs=rule.rungs) - 1e-9)
    return len(keys)


def is_budget(policy: AdaptivePolicy | None) -> bool:
    """Whether ``policy`` spends budget, not seeds (its keys are stages (ρ, seed, rung))."""
    return getattr(policy, "resource", "seeds") == "budget"
