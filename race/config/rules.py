"""The rules a pilot-grid config keeps: the choices and bounds its settings are checked against, and
``validate_config``, every per-field and cross-field rule of a ``GridConfig`` (race.config.configfile
calls it as each config is built). Pure: stdlib only.

Invariants: the rules run in a fixed order and the first one broken is the error, a ``ConfigError``
(a ``ValueError``) with a one-line message naming the setting, its value and what was expected; a
choice (``REWARD_KINDS``, ``LR_SCHEDULES``, …) is written out here once.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from race.core.arguments import whole       # the argument checks the public API shares
from race.core.errors import ConfigError
from race.core.safeio import quote          # a bad value in a message: at most ~200 characters of it

MAX_CHECKPOINTS = 64            # eval.checkpoints: at most this many held-out evaluations per pilot (race.stats.instability)
RULE_REWARDS = ("sparse", "structured", "dense", "math", "format")   # race.tasks.rewards.mix.RULE_REWARDS: mix components
REWARD_KINDS = (*RULE_REWARDS, "mix", "prm", "proxy-prm", "custom")
LOSS_AGGREGATIONS = ("dapo", "grpo", "dr_grpo")
ADVANTAGES = ("grpo", "dr_grpo")
BACKENDS = ("auto", "hf", "vllm")
CHAT_TEMPLATE = ("auto", "on", "off")
CHECKERS = ("auto", "exact", "math")     # eval.checker: how pass@k judges a sample (race.tasks.taskdata.answer_check)
VLLM_SLEEP = ("auto", "on", "off")
# pilot_design: how the pilots are sized: the config as written, or a design of race.stats.pilotdesign.DESIGNS
# (the same names, tied by tests/test_sizing.py) within pilot_share of the full run (race.run.sizing)
AS_WRITTEN = "grid"
PILOT_DESIGNS = (AS_WRITTEN, "fit", "flat", "prior", "halving")
DEFAULT_PILOT_SHARE = 0.10
PRM_AGGREGATIONS = ("min", "product", "last", "mean")   # race.tasks.rewards.prm.AGGREGATIONS
LR_SCHEDULES = ("constant", "linear", "cosine", "wsd")   # race.flops.grid.lr_factor

# Upper bounds a grid may not pass, each with its reason (a typo such as seeds: 1000000 would
# otherwise go on writing the study for hours before anything fails)
MAX_SEEDS = 64            # the rule's seeds-needed advice tops out far below this
MAX_FIRST_SEED = 2**31 - 1 - MAX_SEEDS - 20_011   # a pilot's generators seed at 20_011 + seed (race.engine.loop)
MAX_GRID_POINTS = 32      # an IsoFLOP grid is 3–8 points; race pilot --extend adds a few
MAX_MODELS = 16           # a grid over policies runs one full grid per model
# the planner (race.flops.grid) tries every rollout count and every μ up to these bounds at every batch size up
# to 2 × B_p, so its time grows with their product (about 3 s for a grid at all three bounds)
MAX_PROMPTS_PER_STEP = 16_384
MAX_ROLLOUTS = 1_024      # rollouts per prompt: n_train, n_gen, max_n_gen, min_n_train (GRPO runs use 4–64)
MAX_MU = 64               # update passes over one batch: mu, max_mu (past a few passes the batch is far off-policy)
MAX_TOKENS = 1 << 20      # grpo.max_completion_len: a million new tokens per rollout
MAX_REWARD_SECONDS = 86_400.0   # reward.timeout: a day for one batch; reward.check_timeout: an hour for one answer
MAX_COUNT = 1 << 30       # any other count (lora.rank, batch sizes, eval prompts): past it, a typo
_PLANNER = "the planner tries every value up to it"
# field → (its upper bound, what the field holds): validate_config checks them, docs/reference/config.md lists them
UPPER_BOUNDS: dict[str, tuple[float, str]] = {
    "seeds": (MAX_SEEDS, "seeds per grid point"), "first_seed": (MAX_FIRST_SEED, "the first seed"),
    "prompt_len": (MAX_TOKENS, "expected prompt tokens"), "completion_len": (MAX_TOKENS, "expected completion tokens"),
    "reward.batch_size": (MAX_COUNT, "sequences per reward-model forward"),
    "reward.num_labels": (MAX_COUNT, "the reward model's head size"),
    "reward.timeout": (MAX_REWARD_SECONDS, "seconds a batch of custom rewards may take"),
    "reward.check_timeout": (MAX_REWARD_SECONDS / 24, "seconds one answer check may take"),
    "grpo.max_completion_len": (MAX_TOKENS, "new tokens per rollout"),
    "grpo.micro_batch": (MAX_COUNT, "sequences per update forward"),
    "schedule.prompts_per_step": (MAX_PROMPTS_PER_STEP, f"prompts per step; {_PLANNER}"),
    **{f"schedule.{k}": (MAX_ROLLOUTS, f"rollouts per prompt; {_PLANNER}")
       for k in ("n_train", "max_n_gen", "n_gen", "min_n_train")},
    **{f"schedule.{k}": (MAX_MU, f"update passes per batch; {_PLANNER}") for k in ("max_mu", "mu")},
    "lora.rank": (MAX_COUNT, "a LoRA rank"), "learning_rate.ref_batch": (MAX_COUNT, "sequences per gradient step"),
    "eval.prompts": (MAX_COUNT, "held-out prompts"), "eval.samples": (MAX_ROLLOUTS, "samples per held-out prompt"),
}

# a grid's name and an eval.tasks entry's: it names a folder (runs/NAME) and a study
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


def parse_models(value: Any) -> tuple[str, ...]:
    """Policies of a grid over models, from a list or a comma-separated string: at least two
    distinct non-empty names (HF ids, folders, ``race/<name>``)."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"models {quote(value)} is not valid: expected a list of at least 2 policies, "
                          "e.g. [race/tiny-arith-s, race/tiny-arith]")
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"models entry {quote(item)} is not valid: expected a Hugging Face id, a folder or "
                              "race/<shipped model>")
    if len(items) < 2:
        raise ConfigError(f"models {quote(list(items))} names {len(items)} policy: a grid over models needs at least 2 "
                          "(for one, use model:)")
    dup = next((m for i, m in enumerate(items) if m in items[:i]), None)
    if dup is not None:
        raise ConfigError(f"models {quote(list(items))} repeats {quote(dup, 80)}: expected distinct policies")
    return tuple(items)


def _positive_int(name: str, v: Any) -> None:
    whole(name, v, ge=1, error=ConfigError, expected="a positive integer", floats=False)


def bound_text(cap: float) -> str:
    """An upper bound as a message and docs/reference/config.md write it: 16,384 (a whole number), else 0.5."""
    return f"{cap:,.0f}" if float(cap).is_integer() else f"{cap:g}"


def _at_most(name: str, v: Any) -> None:
    """``v`` (already checked as a number, or None: unset) is at most the bound ``UPPER_BOUNDS`` gives ``name``."""
    cap, what = UPPER_BOUNDS[name]
    if v is not None and v > cap:
        raise ConfigError(f"{name} {quote(v, 60)} is more than {bound_text(cap)}: expected {what}")


def _non_negative_int(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{name} {v!r} must be a whole number ≥ 0")


def validate_config(c: Any) -> None:
    """Every rule a ``GridConfig`` keeps, section by section in a fixed order: the first one broken
    is the ``ConfigError``."""
    _check_grid(c)
    _check_reward(c.reward)
    _check_grpo(c.grpo)
    _check_schedule(c.schedule)
    _positive_int("lora.rank", c.lora.rank)
    _at_most("lora.rank", c.lora.rank)
    _check_learning_rate(c.learning_rate)
    _check_eval(c)
    _check_runtime(c)


def _check_grid(c: Any) -> None:
    """The policy (or policies), the grid's name, its seeds and size, the expected lengths."""
    if not isinstance(c.model, str) or not c.model:
        raise ConfigError(f"model {quote(c.model)} must be a Hugging Face id or a folder with a config.json")
    if c.models:
        parse_models(c.models)
        if c.model != c.models[0]:
            raise ConfigError(f"model {quote(c.model, 80)} is not models[0] {quote(c.models[0], 80)}: a grid over "
                              "models takes its policies from models (give model or models, not both)")
    if not isinstance(c.name, str) or not NAME_PATTERN.fullmatch(c.name):
        raise ConfigError(f"name {quote(c.name, 80)} is not a grid name: expected letters, digits, '.', '_', '+', '-' "
                          "(it names the study and the folder runs/NAME, so no '/' or leading '.')")
    _positive_int("seeds", c.seeds)
    _non_negative_int("first_seed", c.first_seed)
    if c.first_seed > MAX_FIRST_SEED:
        raise ConfigError(f"first_seed {c.first_seed} is more than {MAX_FIRST_SEED}: a pilot seeds its "
                          "generators with up to 20_011 + its seed, which must stay below 2³¹")
    if c.seeds > MAX_SEEDS:
        raise ConfigError(f"seeds {c.seeds} is more than {MAX_SEEDS}: the rule's seeds-needed advice stays far below "
                          f"it, and {c.seeds} × {len(c.grid)} pilots would run for days")
    if len(c.grid) > MAX_GRID_POINTS:
        raise ConfigError(f"grid has {len(c.grid)} points, more than {MAX_GRID_POINTS}: an IsoFLOP grid needs 3–8")
    if c.models and len(c.models) > MAX_MODELS:
        raise ConfigError(f"models lists {len(c.models)} policies, more than {MAX_MODELS}: each runs a whole grid")
    for name in ("prompt_len", "completion_len"):
        v = getattr(c, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ConfigError(f"{name} {v!r} must be a positive number of tokens")
        _at_most(name, v)


def _check_reward(r: Any) -> None:
    """``reward``: its kind and what that kind needs, the PRM settings, the time limits, the mix."""
    if r.kind not in REWARD_KINDS:
        raise ConfigError(f"reward.kind {r.kind!r} is unknown: expected one of {', '.join(REWARD_KINDS)}")
    if r.kind == "custom" and not r.function:
        raise ConfigError("reward.kind 'custom' needs reward.function ('module:function')")
    if r.kind in ("prm", "proxy-prm") and not r.model:
        raise ConfigError(f"reward.kind {r.kind!r} needs reward.model (a reward-model id or folder)")
    if r.aggregation not in PRM_AGGREGATIONS:
        raise ConfigError(f"reward.aggregation {r.aggregation!r} is unknown: expected one of "
                          f"{', '.join(PRM_AGGREGATIONS)}")
    if r.step_separator is not None and (not isinstance(r.step_separator, str) or not r.step_separator):
        raise ConfigError(f"reward.step_separator {r.step_separator!r} must be a non-empty string")
    _positive_int("reward.batch_size", r.batch_size)
    _at_most("reward.batch_size", r.batch_size)
    _at_most("reward.num_labels", r.num_labels)
    for name in ("timeout", "check_timeout"):
        t = getattr(r, name)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ConfigError(f"reward.{name} {t!r} must be a positive number of seconds")
        _at_most(f"reward.{name}", t)
    _validate_mix(r)


def _check_grpo(g: Any) -> None:
    """``grpo``: the loss and advantage forms, the clip, KL and temperature, the lengths and micro-batch."""
    if g.loss_agg not in LOSS_AGGREGATIONS:
        raise ConfigError(f"grpo.loss_agg {g.loss_agg!r} is unknown: expected one of {', '.join(LOSS_AGGREGATIONS)}")
    if g.advantage not in ADVANTAGES:
        raise ConfigError(f"grpo.advantage {g.advantage!r} is unknown: expected one of {', '.join(ADVANTAGES)}")
    if g.beta < 0 or g.clip_eps <= 0 or g.temperature <= 0:
        raise ConfigError(f"grpo: beta ({g.beta}) must be ≥ 0, clip_eps ({g.clip_eps}) and "
                          f"temperature ({g.temperature}) > 0")
    if g.clip_eps_high is not None and g.clip_eps_high < g.clip_eps:
        raise ConfigError(f"grpo.clip_eps_high ({g.clip_eps_high}) must be ≥ grpo.clip_eps ({g.clip_eps}): "
                          "it widens the upper clip bound (clip-higher), it never narrows it")
    _positive_int("grpo.max_completion_len", g.max_completion_len)
    _at_most("grpo.max_completion_len", g.max_completion_len)
    if g.micro_batch is not None:
        _positive_int("grpo.micro_batch", g.micro_batch)
        _at_most("grpo.micro_batch", g.micro_batch)


def _check_schedule(s: Any) -> None:
    """``schedule``: the planner's knobs and how ρ goes below on-policy."""
    for name in ("prompts_per_step", "n_train", "max_n_gen", "max_mu"):
        _positive_int(f"schedule.{name}", getattr(s, name))
    for name in ("prompts_per_step", "n_train", "max_n_gen", "n_gen", "min_n_train", "max_mu", "mu"):
        _at_most(f"schedule.{name}", getattr(s, name))
    if s.n_train > s.max_n_gen:
        raise ConfigError(f"schedule.n_train ({s.n_train}) must be ≤ schedule.max_n_gen ({s.max_n_gen})")
    if s.lower_rho_by not in ("generate", "keep"):
        raise ConfigError(f"schedule.lower_rho_by must be 'generate' or 'keep', got {s.lower_rho_by!r}")
    _positive_int("schedule.min_n_train", s.min_n_train)
    if s.lower_rho_by == "keep" and s.min_n_train > (s.n_gen or s.n_train):
        raise ConfigError(f"schedule.min_n_train ({s.min_n_train}) must be ≤ the group size "
                          f"n_gen ({s.n_gen or s.n_train}) when lower_rho_by is 'keep'")
    if s.n_gen is not None and (s.n_gen < s.n_train):
        raise ConfigError(f"schedule.n_gen ({s.n_gen}) must be ≥ schedule.n_train ({s.n_train})")
    if s.mu is not None:
        _positive_int("schedule.mu", s.mu)


def _check_learning_rate(lr: Any) -> None:
    """``learning_rate``: η_ref and its batch, the schedule, warm-up and decay shares."""
    if lr.ref <= 0:
        raise ConfigError(f"learning_rate.ref {lr.ref!r} must be > 0")
    _positive_int("learning_rate.ref_batch", lr.ref_batch)
    _at_most("learning_rate.ref_batch", lr.ref_batch)
    if lr.schedule not in LR_SCHEDULES:
        raise ConfigError(f"learning_rate.schedule {lr.schedule!r} is unknown: expected one of "
                          f"{', '.join(LR_SCHEDULES)}")
    w = lr.warmup
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0.0 <= w < 1.0:
        raise ConfigError(f"learning_rate.warmup {w!r} must be a share of the run's optimizer steps in [0, 1)")
    d = lr.decay
    if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 < d <= 1.0 or w + d > 1.0:
        raise ConfigError(f"learning_rate.decay {d!r} must be a share of the run's optimizer steps in (0, 1] "
                          f"that fits beside the warm-up ({w!r})")


def _check_eval(c: Any) -> None:
    """``eval``: held-out prompts and samples, checkpoints, the judge, the checker, downstream sets."""
    _positive_int("eval.prompts", c.eval.prompts)
    _positive_int("eval.samples", c.eval.samples)
    _at_most("eval.prompts", c.eval.prompts)
    _at_most("eval.samples", c.eval.samples)
    _validate_checkpoints(c.eval)
    if c.eval.judge_model is not None and (not isinstance(c.eval.judge_model, str) or not c.eval.judge_model):
        raise ConfigError(f"eval.judge_model {c.eval.judge_model!r} must be a model id or folder")
    if c.eval.judge_aggregation not in PRM_AGGREGATIONS:
        raise ConfigError(f"eval.judge_aggregation {c.eval.judge_aggregation!r} is unknown: expected one of "
                          f"{', '.join(PRM_AGGREGATIONS)}")
    if c.eval.checker not in CHECKERS:
        raise ConfigError(f"eval.checker {c.eval.checker!r} is unknown: expected one of {', '.join(CHECKERS)}")
    _validate_eval_tasks(c)


def _check_runtime(c: Any) -> None:
    """How the pilots run: the chat template, system prompt, backend, approximate FLOPs, vLLM sleep, GPU memory,
    and how they are sized from the full run."""
    if c.chat_template not in CHAT_TEMPLATE:
        raise ConfigError(f"chat_template {c.chat_template!r} is unknown: expected one of {', '.join(CHAT_TEMPLATE)}")
    if c.system_prompt is not None and not isinstance(c.system_prompt, str):
        raise ConfigError(f"system_prompt {c.system_prompt!r} must be a string")
    if c.backend not in BACKENDS:
        raise ConfigError(f"backend {c.backend!r} is unknown: expected one of {', '.join(BACKENDS)}")
    if not isinstance(c.allow_approximate_flops, bool):
        raise ConfigError(f"allow_approximate_flops {c.allow_approximate_flops!r} must be true or false")
    if c.vllm_sleep not in VLLM_SLEEP:
        raise ConfigError(f"vllm_sleep {c.vllm_sleep!r} is unknown: expected one of {', '.join(VLLM_SLEEP)}")
    _check_sizing(c)
    if c.gpu_memory is not None and (isinstance(c.gpu_memory, bool) or not isinstance(c.gpu_memory, (int, float))
                                     or c.gpu_memory <= 0):
        raise ConfigError(f"gpu_memory {c.gpu_memory!r} must be a positive number of bytes (in YAML: e.g. 80GiB)")


def _check_sizing(c: Any) -> None:
    """pilot_design is a known design; pilot_share a fraction in (0, 1)."""
    if c.pilot_design not in PILOT_DESIGNS:
        raise ConfigError(f"pilot_design {c.pilot_design!r} is unknown: expected one of {', '.join(PILOT_DESIGNS)}")
    check_share(c.pilot_share)


def check_share(share: Any, what: str = "pilot_share") -> float:
    """The share of the full run pilots spend (``pilot_share``, ``race init --share``): a number in (0, 1)
    (1 leaves nothing for the full run); ``ConfigError`` naming ``what`` otherwise."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
        raise ConfigError(f"{what} {share!r} is outside (0, 1): expected the fraction of the full run the pilots "
                          "spend, e.g. 0.1")
    return float(share)


def _validate_mix(r: Any) -> None:
    """``reward.mix`` is given iff ``reward.kind`` is ``mix``: rule rewards → finite weights > 0."""
    if r.kind != "mix":
        if r.mix is not None:
            raise ConfigError(f"reward.mix is given but reward.kind is {r.kind!r}: set reward.kind: mix "
                              "(or remove reward.mix)")
        return
    if r.mix is None:
        raise ConfigError("reward.kind 'mix' needs reward.mix: rule rewards and their weights, "
                          "e.g. {math: 0.9, format: 0.1}")
    if not isinstance(r.mix, Mapping) or not r.mix:
        raise ConfigError(f"reward.mix {r.mix!r} is not valid: expected at least one rule reward and its weight, "
                          "e.g. {math: 0.9, format: 0.1}")
    for name, w in r.mix.items():
        if name not in RULE_REWARDS:
            raise ConfigError(f"reward.mix component {name!r} is unknown: expected one of {', '.join(RULE_REWARDS)}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ConfigError(f"reward.mix weight {w!r} of {name!r} is not valid: expected a finite number > 0")


def _validate_checkpoints(e: Any) -> None:
    """``eval.checkpoints``: a count up to MAX_CHECKPOINTS, or distinct budget fractions in (0, 1]; the
    checkpoint prompts a subset of the held-out ones."""
    cp = e.checkpoints
    if isinstance(cp, bool) or not isinstance(cp, (int, tuple)):
        raise ConfigError(f"eval.checkpoints {cp!r} must be a count (0: off) or a list of budget fractions in (0, 1]")
    if isinstance(cp, int) and not 0 <= cp <= MAX_CHECKPOINTS:
        raise ConfigError(f"eval.checkpoints {cp!r} must be a count from 0 (off) to {MAX_CHECKPOINTS}, "
                          "or a list of budget fractions in (0, 1]")
    if isinstance(cp, tuple):
        if not cp or len(cp) > MAX_CHECKPOINTS:
            raise ConfigError(f"eval.checkpoints {list(cp)!r} must list 1 to {MAX_CHECKPOINTS} budget fractions "
                              "in (0, 1] (or be a count; 0: off)")
        for f in cp:
            if isinstance(f, bool) or not isinstance(f, float) or not 0.0 < f <= 1.0:
                raise ConfigError(f"eval.checkpoints value {f!r} is not a budget fraction: expected numbers in (0, 1]")
        if len(set(cp)) < len(cp):
            raise ConfigError(f"eval.checkpoints {list(cp)!r} repeats a fraction: expected distinct values in (0, 1]")
    if e.checkpoint_prompts is not None:
        _positive_int("eval.checkpoint_prompts", e.checkpoint_prompts)
        if e.checkpoint_prompts > e.prompts:
            raise ConfigError(f"eval.checkpoint_prompts ({e.checkpoint_prompts}) must be ≤ eval.prompts ({e.prompts}): "
                              "checkpoints evaluate a subset of the held-out prompts")


def _validate_eval_tasks(c: Any) -> None:
    """``eval.tasks``: none is the training task, and no two share a name."""
    labels = [t.label for t in c.eval.tasks]
    for t in c.eval.tasks:
        if t.path == c.task:
            raise ConfigError(f"eval.tasks entry {t.path!r} is the training task: its held-out split is already the "
                              "`reward` and `pass@1` targets; expected another dataset")
    dup = next((x for x in labels if labels.count(x) > 1), None)
    if dup is not None:
        raise ConfigError(f"eval.tasks names {dup!r} twice: give each entry its own name")
