"""OpenRLHF's recipe: the version its flags were read from, how its GRPO step runs (FLOPs), its
``train_ppo_ray`` command-line flags for RACE's schedule, and the recipe written as that command
(OpenRLHF reads flags only: no YAML).

Invariants: pure (OpenRLHF itself is never imported); each optimizer step is one pass over the
rollout batch (``train.batch_size = rollout.batch_size × n``), μ of them per batch
(``train.max_epochs``); what OpenRLHF cannot take (a fractional LoRA alpha, a loss aggregation or a
decay it lacks, LoRA weight sync at this version) is one line in the notes.
"""
from __future__ import annotations

from typing import Any

from race.config.configfile import GridConfig
from race.core.errors import RaceError
from race.core.records import Schedule
from race.fullrun.recipe_base import (Recipe, Shape, TrainerRun, format_value, lora_alpha, max_prompt, micro_batch,
                                      watch_every)

VERSION = "OpenRLHF 0.11.2"     # where the flags and behaviour were read (docs/recipes.md)

# OpenRLHF: vLLM engines (prefix caching switched on by the recipe), weights broadcast as tensors;
# the actor forward of make_experience gives old log-probs every step; logits over all positions
RUN = TrainerRun("openrlhf", "vLLM, --vllm.enable_prefix_caching", prefix_shared=True,
                 adapter_in_sampler=False, old_logprob="always", completion_logits_only=False)

LORA_SYNC_NOTE = ("OpenRLHF 0.11.0 sends LoRA weights to vLLM under their adapter-wrapped names, unmerged: its open "
                  "issue #1349 reports LoRA + vLLM weight sync failing at this version. Until it is fixed the nearest "
                  "working recipe is race recipe --for verl (LoRA through vLLM), or this one with --ds.lora.rank 0 "
                  "(full fine-tuning: another FLOP count)")


def _whole_alpha(cfg: GridConfig) -> tuple[int | float, list[str]]:
    """The LoRA alpha as OpenRLHF parses it (``--ds.lora.alpha`` is an int), with a note when rounded."""
    notes = []
    alpha = lora_alpha(cfg)
    if not float(alpha).is_integer():                  # OpenRLHF parses --ds.lora.alpha as an int
        notes.append(f"lora.alpha {alpha:g}: OpenRLHF 0.11 takes a whole number; the recipe uses "
                     f"{round(alpha)} (LoRA scale {round(alpha) / cfg.lora.rank:g} instead of {alpha / cfg.lora.rank:g})")
        alpha = int(round(alpha))
    return alpha, notes


def _loss_and_scheduler(cfg: GridConfig) -> tuple[str, list[str]]:
    """OpenRLHF's learning-rate scheduler for the config's, with the notes on the loss and the schedule."""
    g, lr = cfg.grpo, cfg.learning_rate
    notes = []
    if g.loss_agg != "dapo":
        notes.append(f"grpo.loss_agg {g.loss_agg}: OpenRLHF 0.11's PPO loss is token-level (token sum / token "
                     "count of the optimizer step: RACE's dapo) and has no switch for it; the recipe uses that, "
                     "ρ unchanged")
    sched = {"constant": "constant_with_warmup" if lr.warmup else "constant"}.get(lr.schedule, lr.schedule)
    if lr.schedule == "wsd":
        sched = "cosine"
        notes.append("learning_rate.schedule wsd: OpenRLHF 0.11 passes no decay length to transformers' "
                     "warm-up–stable–decay schedule; the recipe uses cosine (also to 0), ρ unchanged")
    return sched, notes


def _training_flags(cfg: GridConfig, s: Schedule, P: float, micro: int, sched: str,
                    alpha: int | float) -> dict[str, Any]:
    """The rollout and training batches (one optimizer step per pass, μ passes), the optimizer, LoRA,
    the lengths, the sampling and the loss."""
    g, lr = cfg.grpo, cfg.learning_rate
    return {
        "--actor.model_name_or_path": cfg.model,
        "--algo.advantage.estimator": "group_norm" if g.advantage == "grpo" else "dr_grpo",
        "--rollout.batch_size": s.prompts_per_step,
        "--rollout.n_samples_per_prompt": s.n_gen,
        "--rollout.micro_batch_size": micro,
        "--train.batch_size": s.prompts_per_step * s.n_gen,   # one optimizer step per pass over the rollout batch
        "--train.micro_batch_size": micro,
        "--train.max_epochs": s.mu,
        "--train.num_episodes": 1,
        "--data.max_samples": s.steps * s.prompts_per_step,   # steps rollout batches in one episode
        "--actor.adam.lr": s.learning_rate,
        "--actor.lr_scheduler": sched,
        "--actor.lr_warmup_ratio": lr.warmup,
        "--ds.lora.rank": cfg.lora.rank,
        "--ds.lora.alpha": alpha,
        "--ds.lora.target_modules": list(cfg.lora.targets),
        "--rollout.max_new_tokens": g.max_completion_len,
        "--data.max_len": max_prompt(P) + g.max_completion_len,
        "--rollout.temperature": g.temperature,
        "--rollout.top_p": g.top_p,
        "--actor.eps_clip": g.clip_eps,
        **({"--actor.eps_clip_low_high": [g.clip_eps, g.clip_eps_high]} if g.clip_eps_high is not None else {}),
        "--actor.entropy_coef": g.entropy_coef,
        "--algo.kl.init_coef": g.beta,
    }


def _placement_flags(cfg: GridConfig, shape: Shape) -> dict[str, Any]:
    """vLLM and the actor (and with a KL term the reference) on the GPUs, the KL loss, checkpointing."""
    g = cfg.grpo
    flags: dict[str, Any] = {
        "--vllm.enable_prefix_caching": True,
        # generation runs only through vLLM: one engine per GPU, colocated with training (OpenRLHF's
        # hybrid engine), vLLM asleep during the update
        "--vllm.num_engines": shape.world,
        "--vllm.tensor_parallel_size": 1,
        "--train.colocate_all": True,
        "--vllm.enable_sleep": True,
        "--actor.num_nodes": shape.nodes,
        "--actor.num_gpus_per_node": shape.gpus,
    }
    if g.beta > 0:                                     # the reference model on the same GPUs
        flags.update({"--ref.num_nodes": shape.nodes, "--ref.num_gpus_per_node": shape.gpus})
    if g.beta > 0:
        flags["--algo.kl.use_loss"] = True
        flags["--algo.kl.estimator"] = "k3"
    if g.grad_checkpointing:
        flags["--actor.gradient_checkpointing_enable"] = True
    return flags


def settings(cfg: GridConfig, s: Schedule, P: float, shape: Shape) -> tuple[dict, dict, list[str]]:
    """(command-line flags, ``True`` for a bare flag; no model arguments outside them; notes) for schedule ``s``."""
    total = s.prompts_per_step * s.n_gen
    micro = micro_batch(cfg, total // shape.world)     # per GPU; accumulation = total / (micro · GPUs)
    alpha, notes = _whole_alpha(cfg)
    notes.append(LORA_SYNC_NOTE)
    sched, more = _loss_and_scheduler(cfg)
    notes += more
    flags = {**_training_flags(cfg, s, P, micro, sched, alpha), **_placement_flags(cfg, shape)}
    flags["--eval.steps"] = watch_every(s.steps)       # the watch (race.fullrun.watch): a validation every K steps
    notes.append(f"the watch: add --eval.dataset HELD_OUT (a fixed held-out set); OpenRLHF validates every "
                 f"{watch_every(s.steps)} steps and logs the mean (eval_*_pass1), and "
                 "race.fullrun.watch.check_means([(0, base mean), (step, mean), …], prompts=N) applies the pilots' "
                 "instability rule to those means (docs/stability.md); validation FLOPs are outside this "
                 "recipe's count")
    return flags, {}, notes


def command_lines(rec: Recipe) -> list[str]:
    """The ``python3 -m openrlhf.cli.train_ppo_ray`` command with every flag, one per line."""
    out = []
    for k, v in rec.settings.items():
        if v is True:
            out.append(k)
        elif isinstance(v, list):
            out.append(f"{k} {' '.join(map(str, v))}")
        else:
            out.append(f"{k} {format_value(v).strip(chr(39))}")
    return ["python3 -m openrlhf.cli.train_ppo_ray \\"] + [f"    {x} \\" for x in out[:-1]] + [f"    {out[-1]}"]


# no YAML rendering: race recipe refuses --format yaml with this line before it computes or writes anything
YAML_REFUSAL = ("OpenRLHF 0.11's train_ppo_ray.py takes command-line flags only (it has no --config): use --format "
                "text for the command, or --format json")


def yaml_document(rec: Recipe) -> tuple[dict[str, Any], list[str]]:
    """Refused: OpenRLHF's trainer reads command-line flags only."""
    raise RaceError(YAML_REFUSAL)


__all__ = ["LORA_SYNC_NOTE", "RUN", "VERSION", "YAML_REFUSAL", "command_lines", "settings", "yaml_document"]
