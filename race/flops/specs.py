"""What a config's models are, as the FLOP formulas see them: the policy's ``ArchSpec`` (read by
race.flops.architectures; refused outside its table unless ``allow_approximate_flops``), its
``LoRASpec`` (``lora.targets`` resolved against its family), the reward model's spec, whether
the update shares a prompt's prefix across its rollouts, and every assumption the count makes
(``flop_warnings``). Pure (no torch); the layer under the planner (race.flops.grid) and the memory
plan (race.flops.memory), which both read it."""
from __future__ import annotations

from race.flops import formulas as F
from race.config.configfile import GridConfig


def shares_prefix(config: GridConfig) -> bool:
    """Whether the update runs each prompt once for its group of rollouts (the lean path of
    race.engine.backends.lean: Llama-family models, ``grpo.fast_path`` on, no gradient checkpointing)."""
    if not config.grpo.fast_path or config.grpo.grad_checkpointing:
        return False
    from race.flops.architectures import LEAN_MODEL_TYPES, model_type_of
    from race.flops.catalog import load_hf_config

    return model_type_of(load_hf_config(config.model)) in LEAN_MODEL_TYPES


def reward_spec(config: GridConfig) -> F.RewardModelSpec | None:
    """The reward model whose forward counts in C_reward (None for rule-based rewards); an
    architecture outside race.flops.architectures' table is refused unless ``allow_approximate_flops``."""
    if config.reward.kind in ("prm", "proxy-prm"):
        from race.flops.catalog import load_reward_model

        return load_reward_model(config.reward.model, allow_approximate=config.allow_approximate_flops)
    return None


def policy_reading(config: GridConfig):
    """``race.flops.architectures.ArchReading`` of the policy: refused (one line) when its model type is
    outside the architecture table, unless ``allow_approximate_flops``."""
    from race.flops.catalog import load_arch_reading

    return load_arch_reading(config.model, allow_approximate=config.allow_approximate_flops)


def policy_arch(config: GridConfig) -> F.ArchSpec:
    return policy_reading(config).arch


def lora_spec(config: GridConfig, arch: F.ArchSpec) -> F.LoRASpec:
    """The policy's adapters: ``lora.targets`` resolved against its family (a target matching no
    module, or part of a fused module, is a one-line ConfigError)."""
    from race.flops.architectures import resolve_lora_targets
    from race.core.errors import ConfigError

    try:
        roles = resolve_lora_targets(arch, config.lora.targets)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return F.LoRASpec(rank=config.lora.rank, target_modules=roles)


def flop_warnings(config: GridConfig, *, prompt_len: float | None = None) -> tuple[str, ...]:
    """Every assumption the FLOP count of this config makes, one line each: an architecture read
    approximately (policy or reward model), local attention counted as full, LoRA that reaches
    fewer modules than its roles name (MoE). Empty when every figure is exact."""
    from race.flops.architectures import UnsupportedArchitecture, lora_note, sliding_window_warning
    from race.flops.catalog import load_arch_reading

    reading = policy_reading(config)
    longest = float(prompt_len if prompt_len is not None else config.prompt_len) + config.grpo.max_completion_len
    out = [*reading.warnings, sliding_window_warning(reading.arch, longest),
           lora_note(reading.arch, lora_spec(config, reading.arch).target_modules)]
    if config.reward.kind in ("prm", "proxy-prm"):
        rm = load_arch_reading(config.reward.model, allow_approximate=config.allow_approximate_flops,
                               what="reward model")
        out += [*rm.warnings, sliding_window_warning(rm.arch, longest)]
    if config.eval.judge_model:  # scores evaluations only (outside C_total), but its FLOPs are reported too
        try:
            out += load_arch_reading(config.eval.judge_model, allow_approximate=config.allow_approximate_flops,
                                     what="judge model").warnings
        except UnsupportedArchitecture:
            raise
        except ValueError:       # a hub id RACE has no config for: read when the pilot loads it
            pass
    return tuple(w for w in out if w)
