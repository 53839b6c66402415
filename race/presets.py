"""The embedded pilot grids behind ``race pilot`` with no config.

Sized from the noise measured on this setting (REFERENCES.md, "A ρ grid on the tiny
model"): seed-to-seed SD ≈ 0.024 of held-out sampled accuracy; reuse (μ > 1) scored
0.04–0.06 below no reuse, a gap that 3 seeds resolve. The four points are that
measurement's knobs, which RACE's accounting (prefill shared by a prompt's rollouts, the
update running each prompt once per group, attention and LM head counted) places at:
n_gen = 32 per 8 trained (keep 0.25) → ρ ≈ 0.45, n_gen = 16 → 0.60, on-policy
(n_gen = n_train = 8) → 0.73, μ = 2 → 0.84, for ~6 prompt and ~3.5 completion tokens
(``race plan`` prints them for the calibrated lengths). The budget per pilot is the
largest that keeps ``race pilot`` under five minutes on a 2-core CPU (measured 4 min 03 s).
``THOROUGH`` adds a point, a seed and 2.5× the budget. docs/pilot.md has the verdicts.
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
    "grid": [0.45, 0.6, 0.73, 0.84],  # ≈ keep 0.25 / keep 0.5 / on-policy / μ = 2 (see below)
    "seeds": 3,
    "lengths": {"prompt": 6, "completion": 4},
    "schedule": {"prompts_per_step": 8, "n_train": 8, "max_n_gen": 64, "max_mu": 8},
    "grpo": {"temperature": 1.0, "max_completion_len": 6, "beta": 0.0, "loss_agg": "dapo", "advantage": "grpo"},
    "learning_rate": {"ref": 1e-3, "ref_batch": 64, "fixed": True},
    "eval": {"prompts": 500, "samples": 4, "temperature": 1.0},
    "backend": "hf",
}

THOROUGH: dict[str, Any] = {
    **DEFAULT,
    "name": "race-thorough-tiny-arith",
    "budget": 1.5e12,
    "grid": [0.35, 0.45, 0.6, 0.73, 0.84],
    "seeds": 4,
}
