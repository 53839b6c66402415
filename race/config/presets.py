"""The embedded pilot grids behind ``race pilot`` with no config.

Sized from the noise measured on this setting before RACE's engine existed (a plain-torch LoRA
GRPO grid on the tiny model, 500 held-out problems): seed-to-seed SD ≈ 0.024 of held-out sampled accuracy; reuse (μ > 1) scored
0.04–0.06 below no reuse, a gap that 3 seeds resolve. The four points are that
measurement's knobs — 8 rollouts per prompt, of which the max-reward-variance 2 (keep
0.25), 4 (keep 0.5) or all 8 are trained, then μ = 2 — which RACE's accounting (prefill
shared by a prompt's rollouts, the update running each prompt once per group, attention
and LM head counted) places at ρ ≈ 0.50, 0.62, 0.74, 0.85 for ~6 prompt and ~3.5
completion tokens (``race plan`` prints them for the calibrated lengths). Keep 0.25 of 8
is the lowest ρ of the fixed group; below it the planner generates more rollouts for the
2 trained. The budget per pilot is the largest that keeps ``race pilot`` under five minutes
on a 2-core CPU. ``THOROUGH`` extends the grid below the default's lowest point (ρ 0.42:
2 trained of ~13), adds a seed and 2.5× the budget. docs/pilot.md has the verdicts.
"""
from __future__ import annotations

from typing import Any

DEFAULT: dict[str, Any] = {
    "name": "race-default-tiny-arith",
    "model": "race/tiny-arith",
    "task": "arithmetic-easy",
    "reward": {"kind": "sparse"},
    "lora": {"rank": 8, "alpha": 16, "targets": "all"},
    "budget": 6e11,                   # FLOPs per pilot
    "grid": [0.5, 0.62, 0.74, 0.85],  # keep 2 / keep 4 / all 8 of 8 rollouts / μ = 2 (see above)
    "seeds": 3,
    "lengths": {"prompt": 5.9, "completion": 3.5},
    "schedule": {"prompts_per_step": 8, "n_train": 8, "lower_rho_by": "keep", "min_n_train": 2, "max_mu": 8},
    "grpo": {"temperature": 1.0, "max_completion_len": 6, "beta": 0.0, "loss_agg": "dapo", "advantage": "grpo"},
    "learning_rate": {"ref": 1e-3, "ref_batch": 64, "fixed": True},
    "eval": {"prompts": 500, "samples": 4, "temperature": 1.0},
    "backend": "hf",
}

THOROUGH: dict[str, Any] = {
    **DEFAULT,
    "name": "race-thorough-tiny-arith",
    "budget": 1.5e12,
    "grid": [0.42, 0.5, 0.62, 0.74, 0.85],  # 0.42: keep 2 of ~13 (below the default's lowest point)
    "seeds": 4,
}
