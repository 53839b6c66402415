"""Memory sizes: ``parse_bytes`` ("80GiB", "80 GB", 141e9 → bytes) and ``fmt_bytes``. Stdlib
only; the bottom layer config and memory planning both read."""
from __future__ import annotations

import math
import re

from race.core.errors import ConfigError

GiB = 1024 ** 3
_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
          "kib": 1024, "mib": 1024 ** 2, "gib": GiB, "tib": 1024 ** 4, "k": 1024, "m": 1024 ** 2,
          "g": GiB, "t": 1024 ** 4}


def parse_bytes(value, what: str = "gpu_memory") -> int:
    """``80GiB``, ``80 GB``, ``141e9``, ``512MiB`` → bytes (bare G/M/K are binary units)."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} {value!r} is not a memory size: expected e.g. 80GiB")
    if isinstance(value, (int, float)):
        x, unit = float(value), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"{what} {value!r} is not a memory size: expected e.g. 80GiB, 80GB or 141e9")
        x, unit = float(m.group(1)), m.group(2).lower()
    b = x * _UNITS[unit]
    if not math.isfinite(b) or b <= 0:
        raise ConfigError(f"{what} {value!r} must be a positive memory size, e.g. 80GiB")
    return int(b)


def fmt_bytes(b: float) -> str:
    return f"{b / GiB:.2f} GiB" if b >= 0.1 * GiB else f"{b / 1024 ** 2:.1f} MiB"
