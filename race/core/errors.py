"""RACE's error types: what a user can act on, as one-line messages.

``RaceError`` (a ``ValueError``) is the root: the CLI turns any of them into ``Error: …`` and
exit code 2, and the Python API raises them where the CLI would exit 2. Stdlib only.
"""
from __future__ import annotations


class RaceError(ValueError):
    """A problem the user can act on; the message is one line and names the bad value."""


class ConfigError(RaceError):
    """A bad configuration value; the message is one line and names the value."""


class PilotsFailed(RaceError):
    """Pilots failed after their retries; the finished ones are kept in the storage."""
