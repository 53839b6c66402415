"""What a user asks for: the validated config, its schema, the embedded grids, the checkpoint schedule. Pure.

Interface:
- ``configfile``: ``GridConfig`` and its parts, ``load_config`` (YAML → validated dataclasses); raises
  ``ConfigError`` naming the field.
- ``rules``: the choices and bounds a config is checked against, and ``validate_config``, every rule a
  ``GridConfig`` keeps (``configfile`` calls it as each config is built).
- ``schema``: the typed schema (pydantic) every config passes before any compute.
- ``presets``: the embedded grids (``race init``'s and the shipped examples').
- ``checkpoints``: when a pilot's held-out checkpoints fire and their random streams.

Invariants: stands on race.core only; no torch, transformers, peft, vllm or optuna.
"""
