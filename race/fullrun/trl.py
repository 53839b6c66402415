"""TRL's recipe: the version its names were read from, how its GRPOTrainer runs a step (FLOPs), its
``GRPOConfig`` keyword arguments for RACE's schedule, and the recipe written as a TRL script or a
``trl grpo --config`` file.

Invariants: pure (TRL itself is never imported; the one name that depends on the installed
transformers is read from its source text); each optimizer step is one pass over the rollout batch
(``gradient_accumulation_steps = steps_per_generation``), μ of them per batch (``num_iterations``).
"""
from __future__ import annotations

import os
from typing import Any

from race.config.configfile import GridConfig
from race.core.records import Schedule
from race.fullrun.recipe_base import (Recipe, Shape, TrainerRun, format_value, lora_alpha, micro_batch,
                                      warmup_steps)

VERSION = "TRL 1.16.0"      # where the parameter names and behaviour were read (docs/recipes.md)
# peft 0.21.2 (PeftModel.__init__) and TRL 1.16.0 (unwrap_model_for_generation) read transformers'
# deprecated is_gradient_checkpointing property whatever the settings: the one warning the recipe cannot avoid
PEFT_WARNING_FILTER = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"

# TRL 1.16 GRPOTrainer, use_vllm=False: unwrapped PeftModel.generate on B_p·n repeated prompts
# (RepeatSampler), old log-probs only when generation and optimizer steps are misaligned (μ > 1),
# the fused LM head scores only the completion tokens on CUDA and recomputes them in backward,
# the model's default SDPA attention recomputes its scores in backward (measured: bench/trl_split.py)
RUN = TrainerRun("trl", "transformers generate (use_vllm=False)", prefix_shared=False,
                 adapter_in_sampler=True, old_logprob="mu>1", completion_logits_only=True,
                 head_recompute=True, head_on_tokens=True, attention_recompute=True)


def _checkpointing_key() -> str:
    """TrainingArguments' name for activation checkpointing in the installed transformers:
    ``activation_checkpointing`` where its source declares that field (newer releases), else
    ``gradient_checkpointing``. Read from the source text, so this module never imports transformers."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("transformers")
    path = os.path.join(os.path.dirname(spec.origin), "training_args.py") if spec and spec.origin else ""
    try:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    except OSError:
        return "gradient_checkpointing"
    return "activation_checkpointing" if "\n    activation_checkpointing:" in source else "gradient_checkpointing"


def settings(cfg: GridConfig, s: Schedule, P: float, shape: Shape) -> tuple[dict, dict, list[str]]:
    """(GRPOConfig keyword arguments, the model and LoRA arguments outside it, notes) for schedule ``s``."""
    g, total = cfg.grpo, s.prompts_per_step * s.n_gen
    micro = micro_batch(cfg, total // shape.world)      # per process: the batch splits over the processes
    opt_steps = s.steps * s.mu
    lr = cfg.learning_rate
    sched = {"constant": "constant_with_warmup" if lr.warmup else "constant",
             "wsd": "warmup_stable_decay"}.get(lr.schedule, lr.schedule)
    out = {
        "num_generations": s.n_gen,
        "per_device_train_batch_size": micro,            # completions, not prompts
        "gradient_accumulation_steps": total // (micro * shape.world),
        "steps_per_generation": total // (micro * shape.world),   # generation batch = B_p · n_gen completions
        "num_iterations": s.mu,
        "max_steps": opt_steps,                          # optimizer steps: μ per generation batch
        "learning_rate": s.learning_rate,
        "lr_scheduler_type": sched,
        "warmup_steps": warmup_steps(cfg, opt_steps),
        "max_completion_length": g.max_completion_len,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "beta": g.beta,
        "epsilon": g.clip_eps,
        **({"epsilon_high": g.clip_eps_high} if g.clip_eps_high is not None else {}),
        "loss_type": g.loss_agg,
        "scale_rewards": "group" if g.advantage == "grpo" else "none",
        "entropy_coef": g.entropy_coef,
        # TRL sets checkpointing True by default, so it is set explicitly; newer transformers renamed the field
        # (gradient_checkpointing is then a deprecated alias with a FutureWarning): the name this one knows
        _checkpointing_key(): g.grad_checkpointing,
        "use_vllm": False,
    }
    if lr.schedule == "wsd":       # transformers' get_wsd_schedule: the decay's length, linear to 0 as RACE's
        out["lr_scheduler_kwargs"] = {"num_decay_steps": max(1, int(round(lr.decay * opt_steps))),
                                      "decay_type": "linear"}
    model = {"model_name_or_path": cfg.model, "use_peft": True, "lora_r": cfg.lora.rank,
             "lora_alpha": lora_alpha(cfg), "lora_target_modules": list(cfg.lora.targets)}
    notes = ["the watch: pass race.fullrun.watch.trl_callback(held-out prompts, your checker) in "
             "GRPOTrainer(callbacks=[…]): it stops a collapsing run and restores its best adapter (docs/stability.md)"]
    if shape.world > 1:
        notes.append(f"launch on {shape.world} processes (accelerate launch --num_processes {shape.world}"
                     + (f" --num_machines {shape.nodes}" if shape.nodes > 1 else "") + "): the per-device batch and "
                     "accumulation above assume it")
    return out, model, notes


def command_lines(rec: Recipe) -> list[str]:
    """A script that runs as printed (python - < it), on the --emit folder's files."""
    s, m = rec.settings, rec.model
    d = os.path.dirname(str(m.get("dataset_name", os.path.join("RACE_EMIT_DIR", "data"))))
    lines = ["import sys", "import warnings", "", "import torch", "from datasets import load_dataset",
             "from peft import LoraConfig", "from trl import GRPOConfig, GRPOTrainer", "",
             "# peft 0.21 and TRL 1.16 read transformers' deprecated is_gradient_checkpointing whatever the settings",
             "warnings.filterwarnings('ignore', message='`is_gradient_checkpointing` is deprecated', "
             "category=FutureWarning)",
             f"sys.path.insert(0, {d!r})            # race_reward.py, written by --emit",
             "from race_reward import reward  # noqa: E402", "",
             "cpu = not torch.cuda.is_available()",
             "args = GRPOConfig("]
    lines += [f"    {k}={format_value(v)}," for k, v in s.items()]
    lines += [f"    output_dir={os.path.join(d, 'out')!r}, report_to='none', save_strategy='no',",
              "    use_cpu=cpu, bf16=not cpu,",
              ")", f"peft_config = LoraConfig(r={m['lora_r']}, lora_alpha={m['lora_alpha']}, "
                   f"target_modules={m['lora_target_modules']!r}, task_type='CAUSAL_LM')",
              f"data = load_dataset('json', data_files={os.path.join(d, 'data', 'train.jsonl')!r}, split='train')",
              f"trainer = GRPOTrainer(model={m['model_name_or_path']!r}, reward_funcs=reward, args=args, "
              "train_dataset=data, peft_config=peft_config)",
              "trainer.train()"]
    return lines


def yaml_document(rec: Recipe) -> tuple[dict[str, Any], list[str]]:
    """(the file ``trl grpo --config`` reads: the model arguments and GRPOConfig's, one more comment line)."""
    placeholder = str(rec.model.get("dataset_name", "")).startswith("RACE_EMIT_DIR")
    comment = ("for `trl grpo --config FILE --output_dir OUT`, run from the --emit folder (race_reward.py "
               "is imported from there)" + ("; dataset_name and reward_funcs are placeholders until "
                                            "race recipe … --emit DIR" if placeholder else "")
               + "; on a machine without a GPU add --use_cpu true --bf16 false; peft 0.21 and TRL 1.16 read "
               "transformers' deprecated is_gradient_checkpointing whatever the settings (a FutureWarning of "
               f"theirs): PYTHONWARNINGS={PEFT_WARNING_FILTER!r} silences it")
    return {**rec.model, **rec.settings}, [comment]


__all__ = ["PEFT_WARNING_FILTER", "RUN", "VERSION", "command_lines", "settings", "yaml_document"]
