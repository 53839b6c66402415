"""The embedded pilot grids behind ``race pilot`` with no config.

Sized from the noise measured on this setting (REFERENCES.md, "A ρ grid on the tiny
model"): seed-to-seed SD ≈ 0.024 of held-out sampled accuracy; at 1.5e12 FLOPs per
pilot, reuse (μ > 1, ρ ≈ 0.85) scored 0.04–0.06 below no-reuse and down-sampling
(ρ ≈ 0.36–0.53), a gap that 3 seeds resolve. Four points spanning that range × 3 seeds
resolve the slope (expected d acc / d log ρ ≈ −0.07 against a standard error of ≈ 0.02)
and fit a 2-core CPU's five minutes.

RACE's own accounting (prefill shared by a prompt's rollouts, the update running each
prompt once for its group, attention and LM head counted) puts the knobs of that
measurement at: n_gen = 32 per 8 trained (keep 0.25) → ρ ≈ 0.45, n_gen = 16 → 0.60,
on-policy (n_gen = n_train = 8) → 0.73, μ = 2 → 0.84, for ~6 prompt and ~3.5
completion tokens (``race plan`` prints them for the calibrated lengths). ``--thorough`` adds seeds, budget and a point.
See docs/pilot.md for the measured verdicts and times.
"""
from __future__ import annotations

from typing import Any

DEFAULT: dict[str, Any] = {
    "name": "race-default-tiny-arith",
    "model": "race/tiny-arith",
    "task": "arithmetic-easy",
    "reward": {"kind": "sparse"},
    "lora": {"rank": 8, "alpha": 16, "targets": "all"},
    "budget": 1.5e12,                 # FLOPs per pilot
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
    "budget": 3e12,
    "grid": [0.35, 0.45, 0.52, 0.6, 0.73, 0.84],
    "seeds": 4,
}
