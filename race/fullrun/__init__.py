"""The full run after the pilots: trainer recipes, the length probe, and the watch on a user's run.

Interface:
- ``recipes``: ``recipe`` — a verdict (or a ρ) → a TRL / verl / OpenRLHF config with RACE's FLOP
  count of it as that trainer runs it (the dispatch over the trainer modules below).
- ``trl``, ``verl``, ``openrlhf``: one module per trainer: its version pin, how it runs a step
  (``RUN``), its config in its own parameter names (``settings``) and its command lines.
- ``recipe_base``: what the trainers share: ``Recipe``, ``TrainerRun``, ``Shape``, the micro-batch
  and watch-cadence rules.
- ``emit``: ``race recipe --emit``: the recipe's runnable files (script, data, a self-contained reward).
- ``reward_file``: the reward files' text (``race_reward.py``, verl's reward manager), below ``emit``.
- ``probe``: the length probe at the full-run budget: its plan and its record.
- ``watch``: ``Watch`` and ``trl_callback``, the pilots' instability rule on a user's full run.

Invariants: no torch, transformers or peft at import (the TRL callback loads them when built).
"""
