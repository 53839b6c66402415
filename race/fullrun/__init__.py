"""The full run after the pilots: trainer recipes, the length probe, and the watch on a user's run.

Interface:
- ``recipes``: ``recipe`` — a verdict (or a ρ) → a TRL / verl / OpenRLHF config with RACE's FLOP
  count of it as that trainer runs it.
- ``emit``: ``race recipe --emit``: the recipe's runnable files (script, data, a self-contained reward).
- ``probe``: the length probe at the full-run budget: its plan and its record.
- ``watch``: ``Watch`` and ``trl_callback``, the pilots' instability rule on a user's full run.

Invariants: no torch, transformers or peft at import (the TRL callback loads them when built).
"""
