"""One real LoRA GRPO pilot: the policy, rollouts, rewards, the update and the budget loop.

Interface:
- ``pilot``: the one pilot loop, ``pilot_events(config, schedule, seeds)`` (progress, then each seed's
  ``PilotResult``); ``run_pilot(config, schedule, seed)`` and ``run_pilots`` consume it.
- ``seed_axis``: the one engine, ``SeedAxisEngine``: a grid point's seeds (one or several) as a seed
  axis, its policy a parameter (``LeanPolicy``, ``PeftPolicy``).
- ``continuation``: a pilot paused at a FLOP mark (its state file, its held-out reading there) and
  resumed from it, bit for bit as if run straight through.
- ``lean_engine``: whether the lean path runs a config, and how many seeds share a process.
- ``loop``: what every engine shares: the step record, the budget loop, the sync check, scoring and
  packing, the final evaluation.
- ``grpo``: advantages, the clipped loss, the update.
- ``backends``: rollout backends (``hf``, ``vllm``) and the lean decoder (``lean``, ``lockstep``).
- ``loading``: the device check, the policy with its adapter, seeds, software versions.
- ``evaluation``: held-out evaluation and checkpoints; ``calibration``: the base policy before a grid.

Invariants: the only package besides race.run that imports torch, transformers or peft (inside it,
at module level); ``import race`` never loads it.
"""
