"""Argument checks on entry: the one copy behind the config's own checks and the public Python API
(race.fullrun.watch, race.stats.drift, race.stats.rate, race.stats.forecast). Stdlib only.

Each helper returns the value in its checked form or raises ``error`` (a ``RaceError`` subclass
the caller names: ``ConfigError``, ``WatchError``, ``DriftError`` …) with one line that names the
argument, quotes the value (race.core.safeio.quote) and says what was expected:

- ``number``: a real number (never a boolean, never NaN or ±inf unless ``finite=False``), in the
  bounds given (``gt``, ``ge``, ``lt``, ``le``); a numeric string only with ``strings=True``;
- ``whole``: a whole number (an int, or a float with no fraction part), in the bounds given;
- ``flag``: a real boolean: the string ``'false'`` is not False, and it is not True either;
- ``interval``: an ordered pair ``(lo, hi)`` of numbers within the bounds given, ``lo ≤ hi``;
- ``one_of``: one of a fixed set of strings; ``text``: a string; ``function``: a callable;
- ``items``: a list or tuple (not a string, not a mapping); ``mapping``: a mapping;
- ``instance``: an object of a given class (a ``Results``, a ``Curves``, a ``Regime`` …).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from race.core.errors import RaceError
from race.core.safeio import quote


def shown(value: Any) -> str:
    """``value`` quoted for a message (race.core.safeio.quote, 80 characters); an int too long for
    ``repr`` (past Python's digit limit) by its size."""
    try:
        return quote(value, 80)
    except ValueError:
        return f"<an integer of {value.bit_length():,} bits>" if isinstance(value, int) else f"<a {type(value).__name__}>"


def _bound(x: float) -> str:
    """A bound as a message writes it: a whole number in full (2147483647), anything else as %g (0.5, 1e+30)."""
    return str(x) if isinstance(x, int) else f"{x:g}"


def _bounds(gt: float | None, ge: float | None, lt: float | None, le: float | None) -> str:
    return " and ".join(f"{op} {_bound(b)}" for op, b in ((">", gt), ("≥", ge), ("<", lt), ("≤", le)) if b is not None)


def _within(x: float, gt: float | None, ge: float | None, lt: float | None, le: float | None) -> bool:
    return not ((gt is not None and not x > gt) or (ge is not None and not x >= ge)
                or (lt is not None and not x < lt) or (le is not None and not x <= le))


def number(name: str, value: Any, *, error: type[RaceError] = RaceError, gt: float | None = None,
           ge: float | None = None, lt: float | None = None, le: float | None = None, finite: bool = True,
           strings: bool = False, expected: str | None = None) -> float:
    """``value`` as a float, checked (see the module docstring). The message is built only for a refusal: a
    results file's per-prompt scores pass through here by the million."""
    def refused() -> RaceError:
        bounds = _bounds(gt, ge, lt, le)
        want = expected or ("a finite number" if finite else "a number") + (f" {bounds}" if bounds else "")
        return error(f"{name} {shown(value)} must be {want}")

    if isinstance(value, bool) or (isinstance(value, str) and not strings):
        raise refused()
    try:
        x = float(value.strip().replace("_", "")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise refused() from None
    if math.isnan(x):
        if finite or any(b is not None for b in (gt, ge, lt, le)):
            raise refused()
    elif (finite and not math.isfinite(x)) or not _within(x, gt, ge, lt, le):
        raise refused()
    return x


def whole(name: str, value: Any, *, error: type[RaceError] = RaceError, ge: int | None = None,
          le: int | None = None, expected: str | None = None, floats: bool = True) -> int:
    """``value`` as an int: an int (numpy's integers too), or (``floats``) a float with no fractional
    part; never a boolean or a string."""
    bounds = _bounds(None, ge, None, le)
    want = expected or "a whole number" + (f" {bounds}" if bounds else "")
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float) if floats else numbers.Integral) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise error(f"{name} {shown(value)} must be {want}")
    n = int(value)
    if not _within(n, None, ge, None, le):
        raise error(f"{name} {shown(value)} must be {want}")
    return n


def flag(name: str, value: Any, *, error: type[RaceError] = RaceError) -> bool:
    """``value`` when it is a real boolean (``True`` / ``False``); anything else is refused."""
    if not isinstance(value, bool):
        raise error(f"{name} {shown(value)} must be True or False (a boolean"
                    + (", not a string" if isinstance(value, str) else "") + ")")
    return value


def interval(name: str, value: Any, *, error: type[RaceError] = RaceError, ge: float | None = None,
             le: float | None = None, gt: float | None = None, lt: float | None = None) -> tuple[float, float]:
    """``value`` as an ordered pair ``(lo, hi)`` of finite numbers within the bounds, ``lo ≤ hi``."""
    bounds = _bounds(gt, ge, lt, le)
    bounds = f" {bounds}" if bounds else ""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or len(value) != 2:
        raise error(f"{name} {shown(value)} must be a pair (lo, hi) of numbers{bounds}")
    lo, hi = (number(f"{name}[{i}]", v, error=error, gt=gt, ge=ge, lt=lt, le=le) for i, v in enumerate(value))
    if lo > hi:
        raise error(f"{name} {shown(value)} is inverted: expected (lo, hi) with lo ≤ hi")
    return lo, hi


def one_of(name: str, value: Any, choices: Sequence[str], *, error: type[RaceError] = RaceError) -> str:
    if not isinstance(value, str) or value not in choices:
        raise error(f"{name} {shown(value)} must be one of {', '.join(map(repr, choices))}")
    return value


def text(name: str, value: Any, *, error: type[RaceError] = RaceError) -> str:
    if not isinstance(value, str) or not value:
        raise error(f"{name} {shown(value)} must be a non-empty string")
    return value


def function(name: str, value: Any, *, error: type[RaceError] = RaceError) -> Callable[..., Any]:
    if not callable(value):
        raise error(f"{name} {shown(value)} must be a function (a callable)")
    return value


def items(name: str, value: Any, *, error: type[RaceError] = RaceError, what: str = "items") -> list[Any]:
    """``value`` as a list: a list or tuple (or another sequence), never a string, bytes or a mapping."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise error(f"{name} {shown(value)} must be a list of {what}")
    return list(value)


def mapping(name: str, value: Any, *, error: type[RaceError] = RaceError) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise error(f"{name} {shown(value)} must be a mapping")
    return value


def instance(name: str, value: Any, cls: type | tuple[type, ...], *, error: type[RaceError] = RaceError,
             expected: str | None = None) -> Any:
    """``value`` when it is an instance of ``cls``; ``expected`` names it for the user (default: the
    class's module and name)."""
    if not isinstance(value, cls):
        first = cls[0] if isinstance(cls, tuple) else cls
        want = expected or f"a {first.__module__}.{first.__qualname__}"
        raise error(f"{name} {shown(value)} must be {want}")
    return value
