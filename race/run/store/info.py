"""What a study holds besides its trials (``StudyInfo``), a trial this process took (``Claim``), and
how a stored config is compared with a new one (``normalized``, ``fill_missing``,
``first_difference``): the plain values ``race.run.store.study`` builds its ``Store`` on.
Invariant: nothing here touches a storage."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from race.run.store.trials import Key


@dataclass
class Claim:
    """A trial this process took: its id, number, grid point and seed (and its budget-halving rung, None for
    an ordinary pilot)."""

    trial_id: int
    number: int
    key: Key
    trial: Any
    rung: int | None = None


@dataclass(frozen=True)
class StudyInfo:
    """What a study holds besides its trials: enough for any machine to run its pilots."""

    config: dict
    run_config: dict
    plan: dict
    classify: dict
    meta: dict
    adaptive: dict | None
    curve_step_flops: float

    @property
    def grid(self) -> tuple[float, ...]:
        return tuple(float(r) for r in self.run_config["grid"])

    @property
    def seeds(self) -> int:
        return int(self.run_config["seeds"])

    @property
    def first_seed(self) -> int:
        return int(self.run_config.get("first_seed", 0))

    @property
    def seed_ids(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)

    def keys(self) -> list[Key]:
        return [(r, s) for r in self.grid for s in self.seed_ids]


def normalized(obj: Any) -> Any:
    """``obj`` as it reads back from a stored attribute (JSON: tuples as lists, keys as strings)."""
    return json.loads(json.dumps(obj))


def fill_missing(stored: Any, defaults: Any) -> Any:
    """``stored`` with the keys it lacks taken from ``defaults``, recursively (mappings only)."""
    if not isinstance(stored, dict) or not isinstance(defaults, dict):
        return stored
    return {**defaults, **{k: fill_missing(v, defaults.get(k)) for k, v in stored.items()}}


def first_difference(a: Any, b: Any, path: str = "", *, rel_tol: float = 0.0) -> tuple[str, Any, Any] | None:
    """The first (dotted path, a's value, b's value) where ``a`` and ``b`` differ, mappings walked
    key by key; with ``rel_tol`` > 0 a float of ``a`` matches a number of ``b`` within that relative
    tolerance (everything else, and every value at 0, exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k, rel_tol=rel_tol)
            if d:
                return d
        return None
    if rel_tol > 0 and isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return None if math.isclose(a, b, rel_tol=rel_tol) else (path, a, b)
    return None if a == b else (path, a, b)


def short_value(v: Any) -> str:
    """``v`` as a one-line message shows it: a float in ``%g``, anything else as JSON."""
    return f"{v:g}" if isinstance(v, float) else json.dumps(v)
