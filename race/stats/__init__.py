"""From pilots to a verdict: fits, the regime rule, the range at the full-run budget, and the results file. Pure.

Interface:
- ``fit``: response fits of reward against ρ and the bootstrap.
- ``regime``: ``classify``, fits → the verdict (search-, update- or reward-heavy, a ρ range); ``classify_input``:
  its arguments checked before any fit, and the settings a results file may store for it.
- ``confidence``: simulated reruns of a grid; the verdict's confidence is the share that states it.
- ``instability``: the rule that flags a pilot whose held-out checkpoints fell back.
- ``drift``: the ρ range at the full-run budget; ``rate``: the learning rate for it.
- ``forecast``: held-out reward at the full-run budget per ρ, or a one-line refusal; over ``curvefit`` (the
  curve models, their fits and backtests) and ``curves`` (the pilots' held-out curves as the fits read them).
- ``design``: what RACE knows before a pilot (the prior of the best ρ, the signal check) and
  pilots sized within a share of the full run.
- ``pilotdesign``: pilot designs as objects (``fit``, ``flat``, ``prior``): how a share of the full run
  becomes pilots, or none.
- ``report``: text / Markdown / LaTeX / JSON renderings of a diagnosis.
- ``results``: ``results.json`` read, written and re-diagnosed, with its stored probe records.

Invariants: stands on race.flops, race.config and race.core; pure functions of their inputs (no
torch, transformers, peft, vllm or optuna, no clocks, no I/O outside ``results``).
"""
