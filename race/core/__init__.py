"""Foundations every other package stands on: errors, records, safe file I/O, argument checks. Pure.

Interface:
- ``errors``: ``RaceError`` (every error RACE raises on bad input), ``ConfigError``, ``PilotsFailed``.
- ``records``: the frozen result dataclasses (``PilotResult``, ``Diagnosis``, ``Schedule``, …) with
  ``to_dict`` / ``from_dict``.
- ``safeio``: untrusted files read within bounds; ``write_inside``, the one way RACE writes a file.
- ``arguments``: argument checks on entry (numbers, whole numbers, booleans, ordered ranges).
- ``validation``: what validation refused, as one line (a pydantic error; a number given as a string or a boolean).
- ``signals``: SIGTERM as ``Terminated`` (a ``KeyboardInterrupt``), re-raised at safe points if lost.
- ``units`` (memory sizes), ``urls`` (storage URLs, masked), ``version`` (``__version__``).

Invariants: imports nothing from the rest of RACE, and no torch, transformers, peft, vllm or optuna.
"""
