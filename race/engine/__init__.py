"""One real LoRA GRPO pilot: the policy, rollouts, rewards, the update and the budget loop.

Interface:
- ``pilot``: ``run_pilot(config, schedule, seed, calibration) → PilotResult``, one pilot to its budget.
- ``lean_engine``: the engine of the lean path (one seed, or a grid point's seeds in one batch).
- ``loop``: what every engine shares: the step record, the budget loop, the sync check, scoring and
  packing, the final evaluation.
- ``grpo``: advantages, the clipped loss, the update.
- ``backends``: rollout backends (``hf``, ``vllm``) and the lean decoder (``lean``, ``lockstep``).
- ``loading``: the device check, the policy with its adapter, seeds, software versions.
- ``evaluation``: held-out evaluation and checkpoints; ``calibration``: the base policy before a grid.

Invariants: the only package besides race.run that imports torch, transformers or peft (inside it,
at module level); ``import race`` never loads it.
"""
