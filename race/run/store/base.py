"""Storage constants and the error type. Invariant: a ``StoreError`` message is one line and
never shows a password (race.core.urls masks every URL it names)."""
from __future__ import annotations

from race.core.errors import ConfigError

SCHEMA = 1
DEFAULT_HEARTBEAT = 20            # seconds between heartbeats; a trial is stale after GRACE_FACTOR × this
GRACE_FACTOR = 3
ATTR_LIMIT = 30_000               # characters per attribute value (MySQL TEXT holds 64 KiB)
OWNER = "race:owner"
HEARTBEAT = "race:heartbeat"      # journal storage only (RDB storages keep their own table)
COORDINATOR = "race:coordinator"  # study attr: the race pilot process coordinating the grid (one at a time)
ENCODED = "f8z:"                  # prefix of compact float arrays
CURVE_POINTS = 200                # intermediate values per trial (the full curve is in the "curve" attr)


class StoreError(ConfigError):
    """A storage problem a user can act on; the message is one line and never shows a password."""


class UnreadyStudy(StoreError):
    """A study that never became ready (no ``race:ready``): another process is creating it, or an
    interrupted creation left it (``Store.remove_unready`` removes one that holds no trial)."""
