"""The study's record files: a grid's compact data as gzipped JSON (research/validation/…/runs/SETTING/KIND.json.gz).

A record is written whole or not at all (a temporary file, then a rename), and read once per process while its
file stays as it was: every caller of ``read_gz_json`` gets the same object and none changes it
(``validation_stats._memo`` keys its derived values on that object too). validation.py re-exports both names."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path


def write_gz_json(path: Path, record: dict) -> Path:
    """``record`` as compact gzipped JSON at ``path``, written whole or not at all (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(record, fh, separators=(",", ":"))
    os.replace(tmp, path)
    return path


_READ: dict[Path, tuple[tuple[int, int], dict]] = {}


def read_gz_json(path: Path) -> dict | None:
    """The gzipped JSON record at ``path`` (``write_gz_json``'s), or None where there is none.

    Decoded once per process while the file stays as it was (same size and modification time): the tables
    read each record many times, and decoding them again was most of their time. Every caller gets the same
    object, which no caller changes (``validation_stats._memo`` keys on it too); a file rewritten by
    ``write_gz_json`` is read afresh."""
    if not path.is_file():
        return None
    st = path.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    held = _READ.get(path)
    if held is not None and held[0] == stamp:
        return held[1]
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        record = json.load(fh)
    _READ[path] = (stamp, record)
    return record
