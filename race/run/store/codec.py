"""Compact values in optuna attributes: float arrays as zlib-compressed float64 in base64
(prefix ``f8z:``), JSON blobs, and values longer than one attribute holds split into chunks.
Invariant: what is encoded decodes bit for bit (floats included)."""
from __future__ import annotations

import base64
import json
import struct
import zlib
from typing import Any, Callable, Iterable, Mapping

from race.run.store.base import ATTR_LIMIT, ENCODED


def encode_floats(values: Iterable[float]) -> str:
    vals = [float(v) for v in values]
    raw = struct.pack(f"<{len(vals)}d", *vals)
    return ENCODED + base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def decode_floats(text: str) -> tuple[float, ...]:
    if not text.startswith(ENCODED):
        raise ValueError(f"not an encoded float array: {text[:20]!r}")
    raw = zlib.decompress(base64.b64decode(text[len(ENCODED):]))
    return struct.unpack(f"<{len(raw) // 8}d", raw)


def json_blob(obj: Any) -> str:
    return "jz:" + base64.b64encode(zlib.compress(json.dumps(obj).encode(), 9)).decode("ascii")


def unjson_blob(text: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(text[3:])))


def put_chunked(setter: Callable[[str, Any], None], key: str, text: str) -> None:
    """Store a long string as ``key`` = {"chunks": n} plus ``key#0 …`` (each ≤ ATTR_LIMIT)."""
    if len(text) <= ATTR_LIMIT:
        setter(key, text)
        return
    parts = [text[i:i + ATTR_LIMIT] for i in range(0, len(text), ATTR_LIMIT)]
    for i, part in enumerate(parts):
        setter(f"{key}#{i}", part)
    setter(key, {"chunks": len(parts)})


def get_chunked(attrs: Mapping[str, Any], key: str) -> str | None:
    v = attrs.get(key)
    if isinstance(v, dict) and "chunks" in v:
        return "".join(attrs[f"{key}#{i}"] for i in range(int(v["chunks"])))
    return v
