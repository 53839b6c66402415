"""What every trainer's recipe builds on: the ``Recipe`` record, how a trainer runs a GRPO step as far as
FLOPs go (``TrainerRun``), the hardware a recipe is sized for (``Shape``), and the small rules that
every trainer module (race.fullrun.trl, race.fullrun.verl, race.fullrun.openrlhf) writes its settings
with: the micro-batch, the warm-up steps, the watch's validation cadence, the LoRA alpha, the
prompt-length cap and how a value is printed.

Invariants: pure (no torch, no trainer imported); imports nothing of race.fullrun, so the trainer
modules and race.fullrun.recipes (the dispatch over them) sit above it with no import circle; bad
hardware (``Shape.check``) raises ``RaceError`` with one line naming the value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from race.config.configfile import GridConfig
from race.core.errors import RaceError
from race.core.records import FlopBreakdown, Schedule

DEFAULT_MICRO_BATCH = 8     # sequences per forward/backward when the config sets no grpo.micro_batch
WATCH_EVALS = 20        # validations over a full run that the recipe asks verl / OpenRLHF for (race.fullrun.watch)


@dataclass(frozen=True)
class TrainerRun:
    """How a trainer runs a GRPO step, as far as FLOPs go.

    ``prefix_shared``: one prefill serves a prompt's n rollouts (vLLM prefix caching) or n prefills
    (transformers ``generate`` on the repeated prompt); ``adapter_in_sampler``: the sampler runs the
    unmerged LoRA adapter (2·r·(in+out) per adapted module per token) or plain base weights;
    ``old_logprob``: when a no-grad forward for the old policy's log-probs runs ("mu>1" or "always");
    ``completion_logits_only``: the LM head runs on the completion positions only (else all);
    ``head_recompute``: the log-prob kernel's backward recomputes the logits (one more LM-head
    product per scored position per iteration); ``head_on_tokens``: the fused head scores exactly the
    C completion tokens of a sequence (labels ≠ −100), not ``logits_to_keep`` = C + 1 positions;
    ``attention_recompute``: a fused attention kernel
    (transformers' default SDPA) recomputes the scores QKᵀ in its backward (2·d more per score entry
    and head per iteration, on top of race.flops.formulas' 8·d)."""

    name: str
    sampler: str
    prefix_shared: bool
    adapter_in_sampler: bool
    old_logprob: str
    completion_logits_only: bool
    head_recompute: bool = False
    head_on_tokens: bool = False
    attention_recompute: bool = False


@dataclass(frozen=True)
class Recipe:
    """A full-run configuration for one trainer at one ρ.

    ``rho``: the ρ asked for (the diagnosis' range centre, or given); ``schedule``: RACE's knobs for
    it at the full-run budget (``flops`` there are RACE's own engine accounting, ``steps`` the
    trainer's); ``settings``: the trainer's parameters (TRL: GRPOConfig keyword arguments; verl: Hydra
    overrides; OpenRLHF: command-line flags, ``True`` for a bare flag); ``model``: LoRA and model
    arguments outside the trainer config proper; ``flops_per_step`` / ``flops``: RACE's FLOP count of
    the recipe as the trainer runs it; ``planned``: the ρ RACE's pilots counted for the knobs actually
    used; ``notes``: one line per knob the trainer cannot express."""

    trainer: str
    version: str
    source: str
    rho: float
    full_run_budget: float
    schedule: Schedule
    settings: Mapping[str, Any]
    model: Mapping[str, Any]
    flops_per_step: FlopBreakdown
    flops: FlopBreakdown
    planned: FlopBreakdown
    run: TrainerRun
    prompt_len: float
    completion_len: float
    notes: tuple[str, ...] = ()
    asked: Schedule | None = None            # RACE's own schedule when it was not expressible
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return self.schedule.steps

    def to_dict(self) -> dict[str, Any]:
        return {"trainer": self.trainer, "version": self.version, "source": self.source, "rho": self.rho,
                "full_run_budget": self.full_run_budget, "schedule": self.schedule.to_dict(),
                "settings": dict(self.settings), "model": dict(self.model),
                "flops_per_step": self.flops_per_step.to_dict(), "flops": self.flops.to_dict(),
                "rho_as_run": self.flops.rho, "rho_race_pilots": self.planned.rho,
                "accounting": {"sampler": self.run.sampler, "prefix_shared": self.run.prefix_shared,
                               "adapter_in_sampler": self.run.adapter_in_sampler,
                               "old_logprob_forward": self.run.old_logprob,
                               "completion_logits_only": self.run.completion_logits_only,
                               "head_recompute": self.run.head_recompute,
                               "head_on_tokens": self.run.head_on_tokens,
                               "attention_recompute": self.run.attention_recompute,
                               "prompt_len": self.prompt_len, "completion_len": self.completion_len},
                "notes": list(self.notes), "asked": self.asked.to_dict() if self.asked else None,
                **dict(self.extra)}


@dataclass(frozen=True)
class Shape:
    """The hardware a recipe is sized for: ``gpus`` per node × ``nodes`` (verl / OpenRLHF: every
    count and batch divides on it; TRL: data-parallel processes)."""

    gpus: int = 8
    nodes: int = 1

    @property
    def world(self) -> int:
        return self.gpus * self.nodes

    def check(self) -> "Shape":
        for name, v in (("gpus", self.gpus), ("nodes", self.nodes)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
                raise RaceError(f"{name} {v!r} is not a whole number from 1 to 4096 (the hardware the recipe is for)")
        return self


# ----------------------------------------------------------------------------- the trainers' shared rules

def divisor_at_most(total: int, cap: int) -> int:
    """The largest divisor of ``total`` that is at most ``cap``."""
    return max(d for d in range(1, min(total, cap) + 1) if total % d == 0)


def micro_batch(cfg: GridConfig, total: int) -> int:
    """Sequences per forward/backward: the config's micro-batch (or ``DEFAULT_MICRO_BATCH``), lowered
    to a divisor of the ``total`` sequences each GPU or process holds."""
    return divisor_at_most(total, cfg.grpo.micro_batch or DEFAULT_MICRO_BATCH)


def warmup_steps(cfg: GridConfig, optimizer_steps: int) -> int:
    """The learning rate's warm-up, in optimizer steps."""
    return int(round(cfg.learning_rate.warmup * optimizer_steps))


def watch_every(steps: int) -> int:
    """Steps between validations: WATCH_EVALS over the run (at least every step)."""
    return max(1, round(steps / WATCH_EVALS))


def lora_alpha(cfg: GridConfig) -> int | float:
    """The config's LoRA alpha, a whole number written as an int."""
    a = cfg.lora.alpha
    return int(a) if float(a).is_integer() else a


def max_prompt(P: float) -> int:
    """A prompt-length cap twice the expected prompt, in multiples of 64 (set it to the data's longest)."""
    return int(64 * math.ceil(2.0 * P / 64.0))


def format_value(v: Any) -> str:
    """A setting as a recipe prints it: booleans and ints as Python writes them, floats to 6
    significant digits, strings quoted."""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v) if isinstance(v, str) else str(v)


__all__ = ["DEFAULT_MICRO_BATCH", "WATCH_EVALS", "Recipe", "Shape", "TrainerRun", "divisor_at_most",
           "format_value", "lora_alpha", "max_prompt", "micro_batch", "warmup_steps", "watch_every"]
