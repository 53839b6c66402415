"""What validation refused, as one line: a pydantic error (``validation_line``), and a number given as something
else (``coerced_number``).

pydantic's lax mode reads the string ``"0.3"`` as 0.3 and ``true`` as 1; RACE writes numbers as numbers, so a
record (race.core.records) and a results file (race.stats.results) refuse such a value in one line naming its
path. Invariants: an int (numpy's too) stands for a float; the walk follows the validated data, so pydantic decides
where a number belongs; a message is one line. Stdlib only (pydantic's errors are read, never imported).
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


def coerced_number(given: Any, read: Any, where: str = "") -> tuple[str, Any] | None:
    """(dotted path, value) of the first number that validation read (``read``, the validated data as plain values)
    from something in ``given`` that is not a number (a string "0.3", a boolean), or None. pydantic's lax mode
    would read those as 0.3 or 1; RACE writes numbers as numbers, so a record refuses them (an int stands for a
    float). The walk follows ``read``: pydantic decides where a number belongs."""
    if isinstance(read, bool) or read is None:
        return None
    if isinstance(read, (int, float)):
        return None if isinstance(given, numbers.Real) and not isinstance(given, bool) else (where, given)
    if isinstance(read, Mapping) and isinstance(given, Mapping):
        for k, v in read.items():
            if k in given:
                found = coerced_number(given[k], v, f"{where}.{k}" if where else str(k))
                if found:
                    return found
    elif isinstance(read, (list, tuple)) and isinstance(given, (list, tuple)):
        if all(type(a) is float or type(a) is int for a in given):   # plain numbers: nothing was coerced
            return None
        for i, (a, b) in enumerate(zip(given, read)):
            found = coerced_number(a, b, f"{where}.{i}")
            if found:
                return found
    return None


def number_kind(value: Any) -> str:
    """What a refused number was given as, for its message: a string, a boolean, or its type."""
    return "a string" if isinstance(value, str) else "a boolean" if isinstance(value, bool) else type(value).__name__


def validation_line(err: Any, name: str = "") -> str:
    """The first error of a pydantic ``ValidationError`` as one line: ``name.field: problem, got
    value`` (the value cut to 80 characters); an object-level check (``ValueError`` from a model
    validator or ``__post_init__``) keeps its own sentence. Used for records and results files."""
    e = err.errors(include_url=False)[0]
    where = ".".join(str(x) for x in e.get("loc", ()))
    msg = str(e.get("msg", "")).removeprefix("Value error, ")
    if e.get("type") == "value_error" and not where:
        return f"{name}: {msg}" if name else msg
    got = repr(e.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{'.'.join(x for x in (name, where) if x) or 'the file'}: {msg}, got {got}{more}"
