"""FLOP accounting: the model as the formulas see it, the formulas, memory, and the IsoFLOP planner. Pure.

Interface:
- ``formulas``: FLOPs of generation, training and reward-model scoring per token.
- ``architectures``: the supported model types, config defaults, LoRA roles → module names.
- ``catalog``: shipped configs and model folders by name → a config mapping.
- ``specs``: a config's policy / LoRA / reward-model specs, and the count's assumptions.
- ``memory``: peak GPU memory per schedule.
- ``grid``: the IsoFLOP planner, ``plan_grid``: ρ → schedule (B_p, n_gen, n_train, μ, steps, η).
- ``meter``: ``FlopMeter``, the planner's formulas on the tokens a pilot actually processed.

Invariants: stands on race.config and race.core; no torch, transformers, peft, vllm or optuna, so a
plan and its FLOP count never need a GPU stack.
"""
