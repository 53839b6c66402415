"""verl's recipe: the version its names were read from, how its GRPO step runs (FLOPs), its Hydra
overrides for RACE's schedule, and the recipe written as a ``verl.trainer.main_ppo`` command or as
the overrides nested in YAML.

Invariants: pure (verl itself is never imported); each optimizer step is one pass over the rollout
batch (``ppo_mini_batch_size = train_batch_size``), μ of them per batch (``ppo_epochs``); a schedule
or loss that verl lacks is one line in the notes, with the nearest setting it has.
"""
from __future__ import annotations

from typing import Any, Mapping

from race.config.configfile import GridConfig
from race.core.records import Schedule
from race.fullrun.recipe_base import (Recipe, Shape, TrainerRun, format_value, lora_alpha, max_prompt, micro_batch,
                                      watch_every)

VERSION = "verl 0.9.1"      # where the parameter names and behaviour were read (docs/recipes.md)

# verl: vLLM rollout with enable_prefix_caching (default true) and the adapter loaded as a LoRA
# request; compute_log_prob recomputes old log-probs every step; logits over all positions
RUN = TrainerRun("verl", "vLLM, prefix caching, LoRA adapter", prefix_shared=True,
                 adapter_in_sampler=True, old_logprob="always", completion_logits_only=False)

# RACE's grpo.loss_agg → verl's actor.loss_agg_mode
LOSS_AGG = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}


def _scheduler(cfg: GridConfig) -> tuple[str, list[str]]:
    """verl's learning-rate schedule for the config's (constant and cosine only), with its note."""
    lr = cfg.learning_rate
    notes = []
    sched = lr.schedule
    if sched in ("linear", "wsd"):
        sched = "cosine"
        notes.append(f"learning_rate.schedule {lr.schedule}: verl's actor optimizer has constant and cosine only; "
                     "the recipe uses cosine (also to 0), ρ unchanged")
    return sched, notes


def _rollout_overrides(cfg: GridConfig, s: Schedule, P: float, micro: int) -> dict[str, Any]:
    """The algorithm, the data's batch and lengths, and the vLLM rollout."""
    g = cfg.grpo
    return {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": g.advantage == "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_batch_size": s.prompts_per_step,
        "data.max_prompt_length": max_prompt(P),
        "data.max_response_length": g.max_completion_len,
        "actor_rollout_ref.rollout.n": s.n_gen,
        # mandatory in verl's ppo_trainer.yaml (`???`); vLLM and safetensors as its LoRA page requires
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.load_format": "safetensors",
        "actor_rollout_ref.rollout.temperature": g.temperature,
        "actor_rollout_ref.rollout.top_p": g.top_p,
        "actor_rollout_ref.rollout.enable_prefix_caching": True,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
    }


def _actor_overrides(cfg: GridConfig, s: Schedule, micro: int, sched: str) -> dict[str, Any]:
    """The actor's update (μ epochs of one optimizer step each), its optimizer and loss, the reference."""
    g, lr = cfg.grpo, cfg.learning_rate
    return {
        "actor_rollout_ref.actor.ppo_mini_batch_size": s.prompts_per_step,   # prompts: one optimizer step per epoch
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.ppo_epochs": s.mu,
        "actor_rollout_ref.actor.optim.lr": s.learning_rate,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": sched,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": lr.warmup,
        "actor_rollout_ref.actor.clip_ratio": g.clip_eps,
        **({"actor_rollout_ref.actor.clip_ratio_low": g.clip_eps, "actor_rollout_ref.actor.clip_ratio_high": g.clip_eps_high}
           if g.clip_eps_high is not None else {}),
        "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG[g.loss_agg],
        "actor_rollout_ref.actor.entropy_coeff": g.entropy_coef,
        "actor_rollout_ref.actor.use_kl_loss": g.beta > 0,
        "actor_rollout_ref.actor.kl_loss_coef": g.beta,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
    }


def _run_overrides(cfg: GridConfig, s: Schedule, shape: Shape) -> dict[str, Any]:
    """The model with its LoRA, the run's length and hardware, and the watch's validations."""
    return {
        "actor_rollout_ref.model.path": cfg.model,
        "actor_rollout_ref.model.lora_rank": cfg.lora.rank,
        "actor_rollout_ref.model.lora_alpha": lora_alpha(cfg),
        "actor_rollout_ref.model.target_modules": list(cfg.lora.targets),
        "actor_rollout_ref.model.enable_gradient_checkpointing": cfg.grpo.grad_checkpointing,
        "trainer.total_training_steps": s.steps,
        # total_training_steps ends the run; enough epochs that a dataset of ≥ B_p prompts never ends it first
        "trainer.total_epochs": s.steps,
        "trainer.n_gpus_per_node": shape.gpus,
        "trainer.nnodes": shape.nodes,
        # the watch (race.fullrun.watch): the base policy, then every test_freq steps, samples dumped per step
        "trainer.val_before_train": True,
        "trainer.test_freq": watch_every(s.steps),
        "trainer.validation_data_dir": "race_watch_val",
    }


def settings(cfg: GridConfig, s: Schedule, P: float, shape: Shape) -> tuple[dict, dict, list[str]]:
    """(Hydra overrides, no model arguments outside them, notes) for schedule ``s``."""
    g, lr = cfg.grpo, cfg.learning_rate
    # verl splits a mini-batch of B_p · n sequences over the data-parallel GPUs, then into micro-batches
    micro = micro_batch(cfg, s.prompts_per_step * s.n_gen // shape.world)
    sched, notes = _scheduler(cfg)
    ov: dict[str, Any] = {**_rollout_overrides(cfg, s, P, micro), **_actor_overrides(cfg, s, micro, sched),
                          **_run_overrides(cfg, s, shape)}
    notes.append("the watch: with a fixed held-out set as data.val_files, verl validates every "
                 f"{watch_every(s.steps)} steps and dumps each sample's score to race_watch_val/STEP.jsonl; "
                 "race.fullrun.watch.check_scores(race.fullrun.watch.verl_history('race_watch_val')) applies the pilots' "
                 "instability rule (docs/stability.md); validation FLOPs are outside this recipe's count")
    if g.loss_agg == "dr_grpo":
        ov["actor_rollout_ref.actor.loss_scale_factor"] = g.max_completion_len
    if lr.schedule != "constant" or lr.warmup:
        notes.append(f"verl steps its learning-rate schedule once per rollout batch ({s.steps} steps), RACE once "
                     f"per optimizer step ({s.steps * s.mu}): the same shape, μ={s.mu} optimizer steps share a rate")
    return ov, {}, notes


def _override(k: str, v: Any) -> str:
    """One Hydra override as a shell word: lists bracketed and quoted, booleans lower-case."""
    if isinstance(v, list):
        return f"{k}='[{','.join(map(str, v))}]'"
    return f"{k}={str(v).lower() if isinstance(v, bool) else format_value(v).strip(chr(39))}"


def command_lines(rec: Recipe) -> list[str]:
    """The ``python3 -m verl.trainer.main_ppo`` command with every override, one per line."""
    s = rec.settings
    return ["python3 -m verl.trainer.main_ppo \\"] + [f"    {_override(k, v)} \\" for k, v in s.items()][:-1] + \
        [f"    {_override(*list(s.items())[-1])}"]


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted override names as nested mappings (``a.b: 1`` → ``{a: {b: 1}}``)."""
    out: dict[str, Any] = {}
    for k, v in flat.items():
        node = out
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out


def yaml_document(rec: Recipe) -> tuple[dict[str, Any], list[str]]:
    """(the overrides nested, no more comment lines)."""
    return nest(rec.settings), []


__all__ = ["LOSS_AGG", "RUN", "VERSION", "command_lines", "nest", "settings", "yaml_document"]
