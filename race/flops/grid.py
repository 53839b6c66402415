"""The IsoFLOP grid planner: turn ρ targets into GRPO schedules. Pure.

Every pilot of a grid gets the same FLOP budget. A schedule's ρ is set by how
one optimizer step spends its FLOPs (per prompt of the batch):

    C_search   = search_flops(n_gen rollouts)             prefill + decode, KV cache
    C_learning = learning_flops(n_train sequences, μ)      μ × (fwd + bwd) [+ old/ref log-probs]
    C_reward   = reward_flops(n_gen sequences)             every generated rollout is scored

so ρ = C_learning / (C_search + C_learning + C_reward) depends only on
(n_gen, n_train, μ) and the expected token lengths, not on B_p or the step
count. Two knobs move it (docs/flops.md):

- lower ρ: generate ``n_gen > n_train`` rollouts and train on the
  max-reward-variance ``n_train`` of them (PODS-style down-sampling);
- higher ρ: reuse each rollout batch for ``μ > 1`` clipped update iterations.

The planner first tries one knob at a time (``μ = 1`` with ``n_gen`` varied, or
``n_gen = n_train`` with μ varied), because that keeps the comparison between
grid points interpretable; it mixes both only when no single-knob schedule
lands within ``RHO_TOLERANCE`` (see ``choose_knobs``). Then it picks the number of prompts per step
``B_p`` (at most twice the configured one, down to 1) and the number of steps so
the pilot spends the budget, never more: ``steps · B_p · C_prompt ≤ budget``.

The learning rate: η from the √B rule (``learning_rate``), and, within a run, the factor of
``learning_rate.schedule`` over that run's own optimizer steps (``lr_factor``,
``optimizer_steps``): a run twice as long decays twice as slowly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from race.flops import formulas as F
from race.config.configfile import ConfigError, GridConfig
from race.core.records import FlopBreakdown, Schedule
from race.flops.specs import (flop_warnings, lora_spec, policy_arch, policy_reading, reward_spec,  # noqa: F401
                        shares_prefix)

RHO_TOLERANCE = 0.02        # achieved ρ must be within this of the target
BUDGET_TOLERANCE = 0.02     # planned FLOPs within this fraction below the budget
SINGLE_KNOB_SLACK = 0.01    # a mixed (μ and n_gen) schedule must land this close
# How RACE's own update runs (race.engine.grpo): old log-probs are iteration 1's, detached (no
# extra forward when μ > 1), and logits are computed for completion positions only.
ENGINE_LEARNING_KW = {"old_logprob_forward": False, "completion_logits_only": True}


def grouped_learning(seq_costs, prefix_costs, group, *, shared_prefix: bool) -> float:
    """Update FLOPs of sequences ``prompt_lens[group[i]] + completion_lens[i]``, from their costs.

    ``seq_costs[i]`` is sequence i's learning FLOPs, prompt and completion (``flops.learning_flops``);
    ``prefix_costs[g]`` is prompt g's alone (the same function at completion length 0). With a shared
    prefix each prompt runs once: its prefix cost, plus ``seq_costs[i] − prefix_costs[group[i]]`` per
    sequence — the completion's tokens, their attention over the prompt, and their logits. Exact,
    because every term of ``learning_flops`` is a sum over tokens or over (query, key) pairs.
    """
    if not shared_prefix:
        return sum(seq_costs)
    return sum(prefix_costs) + sum(c - prefix_costs[g] for g, c in zip(group, seq_costs))


@dataclass(frozen=True)
class Plan:
    """The planner's output: one schedule per ρ target, with the context that made them."""

    config: GridConfig
    schedules: tuple[Schedule, ...]
    prompt_len: float
    completion_len: float
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()         # FLOP-count assumptions (grid.flop_warnings): never silent
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def grid_flops(self) -> float:
        """FLOPs of the whole grid: every point × every seed."""
        return sum(s.flops.total for s in self.schedules) * self.config.seeds

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        d: dict[str, Any] = {
            "model": c.model, "reward": c.reward.kind, "budget_per_pilot": c.budget,
            "seeds": c.seeds, "pilots": len(self.schedules) * c.seeds, "grid_flops": self.grid_flops,
            "prompt_len": self.prompt_len, "completion_len": self.completion_len,
            "schedules": [s.to_dict() for s in self.schedules], "notes": list(self.notes),
            "flop_warnings": list(self.warnings),
        }
        if c.full_run_budget:
            d["full_run_budget"] = c.full_run_budget
            d["grid_cost_fraction"] = self.grid_flops / c.full_run_budget
            d["full_run_steps"] = {f"{s.rho_target:g}": int(c.full_run_budget // s.flops_per_step.total)
                                   for s in self.schedules}
        d.update(self.extra)
        return d


@dataclass(frozen=True)
class StepCost:
    """FLOPs of one prompt's share of a step for given (n_gen, n_train, μ)."""

    n_gen: int
    n_train: int
    mu: int
    per_prompt: FlopBreakdown


class CostModel:
    """Per-prompt step cost for a config, cached over (n_gen, n_train, μ)."""

    def __init__(self, config: GridConfig, arch: F.ArchSpec, reward: F.RewardModelSpec | None,
                 prompt_len: float, completion_len: float):
        self.c, self.arch, self.reward = config, arch, reward
        self.P, self.C = prompt_len, completion_len
        self.lora = lora_spec(config, arch)
        self.shared_prefix = shares_prefix(config)
        self._cache: dict[tuple[int, int, int], StepCost] = {}
        self._seq_cache: dict[tuple[float, float, int], float] = {}

    def _sequence_learning(self, prompt_len: float, completion_len: float, mu: int) -> float:
        """One sequence's update FLOPs, memoised: the candidates of a plan ask for the same few
        (length, μ) triples thousands of times, and each costs a walk over the layers."""
        key = (prompt_len, completion_len, mu)
        if key not in self._seq_cache:
            c = self.c
            self._seq_cache[key] = F.learning_flops(
                self.arch, prompt_len=prompt_len, completion_len=completion_len, sequences=1, lora=self.lora,
                mu=mu, ref_logprobs=c.grpo.beta > 0, grad_checkpointing=c.grpo.grad_checkpointing,
                **ENGINE_LEARNING_KW)
        return self._seq_cache[key]

    def cost(self, n_gen: int, mu: int, n_train: int | None = None) -> StepCost:
        n_train = self.c.schedule.n_train if n_train is None else n_train
        key = (n_gen, n_train, mu)
        if key not in self._cache:
            c = self.c
            search = F.search_flops(self.arch, prompt_len=self.P, completion_len=self.C, n=n_gen,
                                    prefix_shared=c.schedule.prefix_shared, lora=self.lora)
            prefix = [self._sequence_learning(self.P, 0, mu)] if self.shared_prefix else []
            learning = grouped_learning([self._sequence_learning(self.P, self.C, mu)] * n_train, prefix,
                                        [0] * n_train, shared_prefix=self.shared_prefix)
            reward = F.reward_flops(self.reward, prompt_len=self.P, completion_len=self.C, sequences=n_gen)
            self._cache[key] = StepCost(n_gen, n_train, mu, FlopBreakdown(search, learning, reward))
        return self._cache[key]


def _candidates(cm: CostModel) -> tuple[list[StepCost], list[StepCost]]:
    """(single-knob candidates, mixed candidates) allowed by the config's knobs.

    The knob that lowers ρ is ``schedule.lower_rho_by``: "generate" varies n_gen upwards
    from n_train (n_train fixed); "keep" varies n_train downwards from a fixed group of
    n_gen (more distinct prompts per FLOP, as in the REFERENCES grid). μ raises ρ.
    """
    s = cm.c.schedule
    if s.lower_rho_by == "keep":
        group = s.n_gen or s.n_train
        # (n_gen, n_train), on-policy first; below the smallest subset, generate more for it
        pairs = [(group, k) for k in range(group, s.min_n_train - 1, -1)]
        pairs += [(g, s.min_n_train) for g in range(group + 1, s.max_n_gen + 1)]
    else:
        n_gens = [s.n_gen] if s.n_gen is not None else list(range(s.n_train, s.max_n_gen + 1))
        pairs = [(g, s.n_train) for g in n_gens]
    mus = [s.mu] if s.mu is not None else list(range(1, s.max_mu + 1))
    single, mixed = [], []
    for n_gen, n_train in pairs:
        for mu in mus:
            sc = cm.cost(n_gen, mu, n_train)
            one_knob = mu == mus[0] or (n_gen, n_train) == pairs[0]
            (single if one_knob else mixed).append(sc)
    return single, mixed


def _closest(cands: list[StepCost], rho: float) -> StepCost | None:
    # ties: fewer update iterations, then fewer generations (cheaper steps, more of them)
    return min(cands, key=lambda sc: (abs(sc.per_prompt.rho - rho), sc.mu, sc.n_gen, -sc.n_train), default=None)


def choose_knobs(cm: CostModel, rho: float) -> StepCost:
    """The (n_gen, n_train, μ) for ``rho``; ConfigError when unreachable.

    1. the closest single-knob schedule (μ = 1 with n_gen varied, or n_gen = n_train with
       μ varied), if within ``RHO_TOLERANCE``: one knob keeps grid points comparable;
    2. else the cheapest mixed schedule within ``SINGLE_KNOB_SLACK``;
    3. else the closest of all (an error below if it misses ``RHO_TOLERANCE``).
    """
    single, mixed = _candidates(cm)
    best = _closest(single, rho)
    if best is None or abs(best.per_prompt.rho - rho) > RHO_TOLERANCE:
        near = [sc for sc in mixed if abs(sc.per_prompt.rho - rho) <= SINGLE_KNOB_SLACK]
        best = (min(near, key=lambda sc: (sc.per_prompt.total, sc.mu, sc.n_gen)) if near
                else _closest(single + mixed, rho))
    all_rhos = [sc.per_prompt.rho for sc in single + mixed]
    if best is None or abs(best.per_prompt.rho - rho) > RHO_TOLERANCE:
        lo, hi = min(all_rhos), max(all_rhos)
        s = cm.c.schedule
        if s.n_gen is not None or s.mu is not None:
            why = (f"the nearest reachable is {best.per_prompt.rho:.3f} with the fixed knobs "
                   f"(n_gen={s.n_gen}, mu={s.mu}); free one of them")
        elif rho < lo and s.lower_rho_by == "keep":
            why = (f"the lowest reachable is {lo:.3f} keeping {s.min_n_train} of n_gen ≤ {s.max_n_gen} "
                   f"rollouts per prompt (raise schedule.max_n_gen or lower min_n_train)")
        elif rho < lo:
            why = (f"the lowest reachable is {lo:.3f} with n_gen ≤ {s.max_n_gen} per n_train={s.n_train} "
                   f"(raise schedule.max_n_gen or lower n_train)")
        elif rho > hi:
            why = f"the highest reachable is {hi:.3f} with μ ≤ {s.max_mu} (raise schedule.max_mu)"
        else:
            why = f"the nearest reachable is {best.per_prompt.rho:.3f} (raise schedule.max_mu or max_n_gen)"
        raise ConfigError(f"ρ={rho:g} is unreachable: {why}")
    return best


def choose_batch(budget: float, cost_per_prompt: float, prompts_per_step: int,
                 rho: float) -> tuple[int, int]:
    """(B_p, steps) with ``steps · B_p · cost ≤ budget`` and the shortfall ≤ BUDGET_TOLERANCE.

    B_p may rise to twice the configured value or fall as low as 1; among the B_p
    that meet the tolerance the one closest to the configured value wins, so grid points
    keep the configured B_p whenever they can (B_p is not a knob of ρ).
    """
    one_step = cost_per_prompt * prompts_per_step
    if budget < cost_per_prompt:
        raise ConfigError(f"budget {budget:.3g} FLOPs is too small for one step at ρ={rho:g}: "
                          f"one prompt of one step costs {cost_per_prompt:.3g} "
                          f"(a step of {prompts_per_step} prompts {one_step:.3g})")
    lo, hi = 1, prompts_per_step * 2
    options = []
    for bp in range(lo, hi + 1):
        steps = int(budget // (bp * cost_per_prompt))
        if steps < 1:
            continue
        shortfall = 1.0 - steps * bp * cost_per_prompt / budget
        options.append((shortfall > BUDGET_TOLERANCE, abs(bp - prompts_per_step), shortfall, bp, steps))
    if not options:
        bp = max(1, int(budget // cost_per_prompt))
        return bp, 1
    options.sort()
    _, _, shortfall, bp, steps = options[0]
    if shortfall > BUDGET_TOLERANCE:
        best = min(options, key=lambda o: o[2])
        _, _, shortfall, bp, steps = best
        if shortfall > BUDGET_TOLERANCE:
            raise ConfigError(f"budget {budget:.3g} FLOPs cannot be met within {BUDGET_TOLERANCE:.0%} at "
                              f"ρ={rho:g}: a step of {prompts_per_step} prompts costs {one_step:.3g} "
                              f"(raise the budget or lower schedule.prompts_per_step)")
    return bp, steps


def learning_rate(config: GridConfig, batch_size: int) -> float:
    """√B rule: η = η_ref · √(B / B_ref), B = B_p · n_train; or η_ref when held fixed."""
    lr = config.learning_rate
    return lr.ref if lr.fixed else lr.ref * math.sqrt(batch_size / lr.ref_batch)


def lr_factor(step: int, *, total: int, schedule: str = "constant", warmup: float = 0.0,
              decay: float = 0.2) -> float:
    """η multiplier at optimizer step ``step`` (0-based) of a run of ``total`` optimizer steps.

    transformers' schedules (``get_{constant,linear,cosine}_schedule_with_warmup``, and
    ``get_wsd_schedule`` with a linear decay), with the warm-up given as a share of the run:
    W = round(warmup · total) steps rising as step / W, then ``constant`` 1, ``linear``
    (total − step) / (total − W), ``cosine`` ½(1 + cos(π·p)), p = (step − W) / (total − W); both
    decay to 0 at ``total``. ``wsd`` (warm-up–stable–decay, Hägele et al., "Scaling Laws and
    Compute-Optimal Training Beyond Fixed Training Durations", arXiv 2405.18392) holds 1 until the
    last D = max(1, round(decay · total)) steps, then falls linearly, (total − step) / D. A pilot
    stops on FLOPs, not on ``total``, and may run a few steps past the plan: those keep the last
    planned step's factor.
    """
    total = max(1, int(total))
    step = min(int(step), total - 1)
    w = int(round(warmup * total))
    if step < w:
        return step / max(1, w)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - step) / max(1, total - w))
    if schedule == "cosine":
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((step - w) / max(1, total - w)))))
    if schedule == "wsd":
        d = max(1, int(round(decay * total)))
        return 1.0 if step < total - d else max(0.0, (total - step) / d)
    raise ConfigError(f"learning_rate.schedule {schedule!r} is unknown: expected constant, linear, cosine or wsd")


def optimizer_steps(schedule: Schedule) -> int:
    """Optimizer steps a pilot's plan makes: μ per GRPO step (race.engine.grpo.update; micro-batches
    accumulate into one), over ``steps`` steps: the horizon of its learning-rate schedule."""
    return schedule.steps * schedule.mu


def plan_schedule(cm: CostModel, rho: float) -> Schedule:
    c = cm.c
    knobs = choose_knobs(cm, rho)
    bp, steps = choose_batch(c.budget, knobs.per_prompt.total, c.schedule.prompts_per_step, rho)
    per_step = knobs.per_prompt.scaled(bp)
    return Schedule(rho_target=rho, prompts_per_step=bp, n_gen=knobs.n_gen, n_train=knobs.n_train,
                    mu=knobs.mu, steps=steps, learning_rate=learning_rate(c, bp * knobs.n_train),
                    lora_rank=c.lora.rank, flops_per_step=per_step, flops=per_step.scaled(steps))


EVAL_SHARE_WARN = 0.10      # plan_grid warns when held-out evaluation costs more than this share of a pilot


def _eval_runs(config: GridConfig) -> int:
    """Checkpoint evaluations before the final one: the base and each fraction < 1 (race.stats.instability)."""
    from race.config.checkpoints import checkpoint_fractions, checkpoints_on

    spec = config.eval.checkpoints
    return 1 + len(checkpoint_fractions(spec)) if checkpoints_on(spec) else 0


def _checkpoint_prompts(config: GridConfig) -> int:
    from race.config.checkpoints import checkpoint_prompts

    return checkpoint_prompts(config.eval.prompts, config.eval.checkpoint_prompts)


def eval_flops(config: GridConfig, arch: F.ArchSpec, prompt_len: float, completion_len: float) -> float:
    """Estimated FLOPs of one pilot's held-out evaluations (the checkpoints and the final one, each prompt
    sampled ``eval.samples`` times at the expected lengths; downstream sets not counted). The same whatever
    the pilot's budget: the checkpoints are fractions of it, their count and prompts are fixed."""
    per_prompt = F.search_flops(arch, prompt_len=prompt_len, completion_len=completion_len, n=config.eval.samples,
                                prefix_shared=config.schedule.prefix_shared, lora=lora_spec(config, arch))
    prompts = _eval_runs(config) * _checkpoint_prompts(config) + config.eval.prompts
    return per_prompt * prompts


def eval_share(config: GridConfig, arch: F.ArchSpec, prompt_len: float, completion_len: float) -> float:
    """``eval_flops`` over the config's budget per pilot. An estimate for the warning: the evaluations are
    metered and reported apart."""
    return eval_flops(config, arch, prompt_len, completion_len) / config.budget


def plan_grid(config: GridConfig, *, prompt_len: float | None = None,
              completion_len: float | None = None, arch: F.ArchSpec | None = None) -> Plan:
    """One schedule per ρ target of ``config.grid``.

    ``prompt_len`` / ``completion_len`` override the config's expected lengths
    (the pilot runner passes the calibrated ones). Raises ``ConfigError`` naming
    the first unreachable ρ.
    """
    from race.core import arguments as A

    A.instance("config", config, GridConfig, error=ConfigError,
               expected="a race.GridConfig (race.load_config reads a file; race.config.configfile.config_from_dict a mapping)")
    P = A.number("prompt_len", prompt_len if prompt_len is not None else config.prompt_len, gt=0, error=ConfigError)
    C = A.number("completion_len", completion_len if completion_len is not None else config.completion_len, gt=0,
                 error=ConfigError)
    if arch is not None:
        A.instance("arch", arch, F.ArchSpec, error=ConfigError, expected="a race.flops.formulas.ArchSpec (or None: "
                   "the config's model)")
    arch = arch or policy_arch(config)
    cm = CostModel(config, arch, reward_spec(config), P, C)
    schedules = tuple(plan_schedule(cm, rho) for rho in config.grid)
    from race.flops.memory import check_fits, schedule_memory

    memory = [schedule_memory(config, s, prompt_len=P, arch=arch) for s in schedules]
    if config.gpu_memory:
        for s, est in zip(schedules, memory):
            check_fits(s.rho_target, est, config.gpu_memory)
    notes = []
    share = eval_share(config, arch, P, C)
    eval_warning = [] if share <= EVAL_SHARE_WARN else [
        f"held-out evaluation costs about {share:.0%} of a pilot's budget (outside it: wall time, not ρ): "
        f"{_eval_runs(config)} checkpoint evaluations of {_checkpoint_prompts(config)} prompts and the final one of "
        f"{config.eval.prompts}, × {config.eval.samples} samples; lower eval.checkpoint_prompts, eval.checkpoints "
        "or eval.samples"]
    if not config.learning_rate.fixed and len({s.learning_rate for s in schedules}) > 1:
        notes.append("learning rate follows the √B rule per point (set learning_rate.fixed to hold it)")
    return Plan(config=config, schedules=schedules, prompt_len=P, completion_len=C, notes=tuple(notes),
                warnings=flop_warnings(config, prompt_len=P) + tuple(eval_warning),
                extra={"memory": [{"rho_target": s.rho_target, **est.to_dict()} for s, est in zip(schedules, memory)]})
