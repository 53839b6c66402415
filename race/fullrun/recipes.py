"""From a RACE verdict to a full-run trainer configuration: TRL, verl or OpenRLHF. Pure (no torch);
``race.recipe`` is ``recipe`` below.

``recipe(source, trainer=…)`` takes a results file (its diagnosis: the recommended ρ range's centre,
unless ``rho``) or a pilot-grid config (then ``rho`` is required), plans the schedule RACE would run
at that ρ (race.flops.grid: prompts per step B_p, rollouts generated n_gen and trained n_train per prompt,
update iterations μ, the √B learning rate, with the results' calibrated lengths), and writes it in
the trainer's own parameter names (``docs/recipes.md`` names the version each was read from).

Invariants:

- **μ optimizer steps per rollout batch, as RACE planned.** One rollout batch is B_p prompts × n
  generations; every trainer below is set so that each pass over it is ONE optimizer step
  (TRL: ``gradient_accumulation_steps = steps_per_generation``; verl: ``ppo_mini_batch_size =
  train_batch_size``; OpenRLHF: ``train.batch_size = rollout.batch_size × n``) and there are μ
  passes (``num_iterations`` / ``ppo_epochs`` / ``train.max_epochs``).
- **The full run spends at most F FLOPs as the trainer runs it.** Steps = ⌊F / C_step⌋ with C_step
  the trainer's own per-step cost (``TrainerRun``: whether rollouts share a prompt's prefill, whether
  the sampler runs the unmerged adapter, when an old-policy log-prob forward runs, where the LM head
  runs, whether its backward recomputes the logits). The recipe states that accounting (ρ, C_search
  / C_learning / C_reward per step and in total) next to the ρ RACE's pilots counted for the same
  knobs: the ρ the user will actually get.
- **Nothing inexpressible is written silently.** A RACE knob the trainer has no setting for (training
  on a subset of a prompt's rollouts, ``lower_rho_by: keep`` or ``generate``; a loss aggregation or
  learning-rate schedule it lacks; the per-dataset healthy recipe) is one line in ``notes``; for the
  subset the recipe is the nearest expressible one (every generated rollout trained, the (n, μ) whose
  ρ as RACE's pilots count it is nearest the target), with both ρ stated.
- **The stability line at F** is one note (``race.stats.instability.stability_at``, as the forecast and
  ``race init`` give it): stable, at risk with the pilots that fell back, or not tested (a run too
  long for the pilots to vouch for, measured in docs/validation.md). The settings still carry the
  configured schedule.
- Bad input (unknown trainer, ρ outside (0, 1), no full-run budget, a results file without a
  diagnosis, a budget below one step) raises ``RaceError`` with one line naming the value.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from race.flops import formulas as F
from race.stats.instability import stability, stability_at
from race.config.configfile import GridConfig, config_from_dict, parse_flops
from race.core.errors import RaceError
from race.core.safeio import one_line
from race.stats.results import probe_for
from race.stats.rate import apply_rate, full_run_rate
from race.core.records import FlopBreakdown, Schedule

TRAINERS = ("trl", "verl", "openrlhf")
FORMATS = ("text", "yaml", "json")
# where each trainer's parameter names and behaviour were read (docs/recipes.md)
VERSIONS = {"trl": "TRL 1.16.0", "verl": "verl 0.9.1",
            "openrlhf": "OpenRLHF 0.11.2"}
DEFAULT_MICRO_BATCH = 8     # sequences per forward/backward when the config sets no grpo.micro_batch


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


RUNS = {
    # TRL 1.16 GRPOTrainer, use_vllm=False: unwrapped PeftModel.generate on B_p·n repeated prompts
    # (RepeatSampler), old log-probs only when generation and optimizer steps are misaligned (μ > 1),
    # the fused LM head scores only the completion tokens on CUDA and recomputes them in backward,
    # the model's default SDPA attention recomputes its scores in backward (measured: bench/trl_split.py)
    "trl": TrainerRun("trl", "transformers generate (use_vllm=False)", prefix_shared=False,
                      adapter_in_sampler=True, old_logprob="mu>1", completion_logits_only=True,
                      head_recompute=True, head_on_tokens=True, attention_recompute=True),
    # verl: vLLM rollout with enable_prefix_caching (default true) and the adapter loaded as a LoRA
    # request; compute_log_prob recomputes old log-probs every step; logits over all positions
    "verl": TrainerRun("verl", "vLLM, prefix caching, LoRA adapter", prefix_shared=True,
                       adapter_in_sampler=True, old_logprob="always", completion_logits_only=False),
    # OpenRLHF: vLLM engines (prefix caching switched on by the recipe), weights broadcast as tensors;
    # the actor forward of make_experience gives old log-probs every step; logits over all positions
    "openrlhf": TrainerRun("openrlhf", "vLLM, --vllm.enable_prefix_caching", prefix_shared=True,
                           adapter_in_sampler=False, old_logprob="always", completion_logits_only=False),
}


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


# ----------------------------------------------------------------------------- the trainer's FLOPs


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

def trainer_step_cost(run: TrainerRun, arch: F.ArchSpec, lora: F.LoRASpec, reward: F.RewardModelSpec | None, *,
                      prompt_len: float, completion_len: float, n: int, mu: int, beta: float,
                      grad_checkpointing: bool, causal: bool = True,
                      head_positions: float | None = None) -> FlopBreakdown:
    """One prompt's share of a step as ``run`` runs it: n rollouts generated, all n trained μ times,
    each scored once. The learning term is race.flops.formulas.learning_flops with the trainer's settings,
    plus its old-policy forward (per ``run.old_logprob``), the LM-head recompute of a fused
    log-prob backward (μ × scored positions × 2·V·h) and the score recompute of a fused attention
    backward (μ × score entries × 2·L·H·d).

    For a batch whose lengths vary, pass the padded lengths: TRL 1.16 (``use_vllm=False``) runs one
    ``generate`` over the whole generation batch, left-padded to its longest prompt, for (longest
    completion − 1) decode steps on every row, and every training, old-log-prob and backward pass at
    that batch-wide width (tests/test_recipe.py measures it phase by phase, bench/trl_split.py).

    ``causal``: attention over T(T+1)/2 score entries (RACE's count, docs/flops.md), or over T²
    (``False``: what torch's FlopCounterMode counts for SDPA and eager attention, masked or not).
    ``head_positions``: LM-head positions per sequence in each forward and backward (default: C with
    ``run.head_on_tokens``, C + 1 with ``run.completion_logits_only``, else T). TRL 1.16's fused head
    scores only the real completion tokens on Triton devices (CUDA, XPU: the mean real completion length
    of a padded batch) and every position but the last (T − 1) elsewhere, CPU included."""
    P, C = float(prompt_len), float(completion_len)
    search = F.search_flops(arch, prompt_len=P, completion_len=C, n=n, prefix_shared=run.prefix_shared,
                            lora=lora if run.adapter_in_sampler else None, causal=causal)
    T = P + C
    planned = min(C + 1.0, T) if run.completion_logits_only else T       # what learning_flops counts
    if head_positions is None:
        head_positions = C if run.head_on_tokens else planned
    logits = min(float(head_positions), T)
    head = 2.0 * arch.vocab_size * arch.hidden_size
    per_seq = F.learning_flops(arch, prompt_len=P, completion_len=C, sequences=1, lora=lora, mu=mu,
                               ref_logprobs=beta > 0, grad_checkpointing=grad_checkpointing, causal=causal,
                               old_logprob_forward=False, completion_logits_only=run.completion_logits_only)
    if logits != planned:       # the head on ``logits`` positions, not the ``planned`` learning_flops counts
        _, head_back, _ = F.backward_costs(arch, lora, train_base=lora is None,
                                            embed_rg=lora is None or grad_checkpointing)
        per_seq += (logits - planned) * (mu * (head + head_back) + (beta > 0) * head)
    if run.old_logprob == "always" or (run.old_logprob == "mu>1" and mu > 1):
        per_seq += F.forward_flops(arch, T, lora=lora, causal=causal) - (T - logits) * head
    if run.head_recompute:
        per_seq += mu * logits * head
    if run.attention_recompute:       # QKᵀ again: half of race.flops.formulas' forward attention per score entry
        per_seq += mu * F.attention_flops(arch, T, causal=causal) / 2.0
    reward_cost = F.reward_flops(reward, prompt_len=P, completion_len=C, sequences=n)
    return FlopBreakdown(search, n * per_seq, reward_cost)


# ----------------------------------------------------------------------------- inputs

def _load_source(source: Any, rho: float | None) -> tuple[GridConfig, float, float, float, str, Any]:
    """(config, ρ, prompt_len, completion_len, source label, results or None)."""
    from race.stats.results import Results, load_results

    if isinstance(source, GridConfig):
        cfg, results, label = source, None, "config"
    elif isinstance(source, Results):
        results, label = source, "results"
    elif isinstance(source, Mapping):
        cfg, results, label = config_from_dict(source), None, "config"
    elif isinstance(source, str):
        if os.path.isdir(source) or source.lower().endswith((".json", ".json.gz")):
            results, label = load_results(source), source
        elif source.lower().endswith((".yaml", ".yml")):
            from race.config.configfile import load_config

            cfg, results, label = load_config(source), None, source
        else:
            raise RaceError(f"source {source!r} is neither a results file (.json, .json.gz or its folder) nor a "
                            "config (.yaml): expected RESULTS.json, RESULTS.json.gz, DIR or CONFIG.yaml")
    else:
        raise RaceError(f"source {type(source).__name__} is not a results file, folder or config")
    if results is None:
        if rho is None:
            raise RaceError(f"a config has no verdict: give --rho R (the ρ to run {label} at, in (0, 1))")
        return cfg, _check_rho(rho), float(cfg.prompt_len), float(cfg.completion_len), label, None
    if results.diagnosis is None:
        raise RaceError(f"results {label!r} hold no diagnosis (no pilot finished): run `race report --refit` "
                        "on them, or give a CONFIG with --rho")
    if not results.config:
        raise RaceError(f"results {label!r} hold no config: expected a results file written by race pilot")
    cfg = config_from_dict(results.config)
    r = _check_rho(rho) if rho is not None else round(results.diagnosis.recommended_rho, 4)
    plan = results.plan or {}
    P = float(plan.get("prompt_len") or cfg.prompt_len)
    C = float(plan.get("completion_len") or cfg.completion_len)
    return cfg, r, P, C, label, results


def _range_at_f(results: Any, cfg: GridConfig, full: float) -> dict[str, Any] | None:
    """The budget-drift model's range at ``full`` for these results (race.stats.drift), {"refused": why}, or
    None when the pilots' budget is unknown."""
    from race.stats.drift import range_record

    pilot_budget = float(cfg.budget or 0.0)
    if not pilot_budget > 0:
        return None
    return range_record(results.pilots, results.diagnosis, pilot_budget=pilot_budget, full_run_budget=full,
                        constant_rate=cfg.learning_rate.schedule == "constant")


def _check_rho(rho: Any) -> float:
    try:
        if isinstance(rho, bool):
            raise TypeError
        r = float(rho)
    except (TypeError, ValueError):
        raise RaceError(f"ρ {rho!r} is not a number: expected a value in (0, 1)") from None
    if not 0.0 < r < 1.0:
        raise RaceError(f"ρ={r:g} is outside (0, 1): ρ = C_learning / C_total")
    return r


# ----------------------------------------------------------------------------- planning

def _divisor_at_most(total: int, cap: int) -> int:
    return max(d for d in range(1, min(total, cap) + 1) if total % d == 0)


def _nearest_expressible(cm: Any, rho: float, sched: Schedule, min_n: int) -> tuple[int, int]:
    """(n, μ) with n generated = n trained, n between n_train and n_gen (≥ ``min_n``), μ ≤ max_mu,
    whose ρ as RACE's pilots count it is nearest ``rho``; ties: fewer μ, then n nearer n_train."""
    lo_n = max(min_n, sched.n_train)
    hi_n = max(lo_n, sched.n_gen)
    cands = [(abs(cm.cost(n, mu, n).per_prompt.rho - rho), mu, n - sched.n_train, n, mu)
             for n in range(lo_n, hi_n + 1) for mu in range(1, cm.c.schedule.max_mu + 1)]
    _, _, _, n, mu = min(cands)
    return n, mu


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


def _fit_prompts(bp: int, n: int, world: int) -> int:
    """The smallest B_p' ≥ B_p whose B_p'·n sequences split evenly over ``world`` GPUs (B_p is not a
    knob of ρ: the step count absorbs it, the FLOPs stay the budget's)."""
    k = bp
    while (k * n) % world:
        k += 1
    return k


def recipe(source: Any, *, trainer: str, full_run_budget: float | str | None = None,
           rho: float | None = None, gpus: int | None = None, nodes: int = 1, emit_dir: str | None = None,
           force: bool = False) -> Recipe:
    """The full-run configuration of ``trainer`` (trl | verl | openrlhf) at ρ.

    ``source``: a results file or its folder (ρ: the diagnosis' recommended range centre unless
    ``rho``), or a pilot-grid config (path, mapping or GridConfig; ``rho`` required).
    ``full_run_budget``: FLOPs of the full run (default: the config's ``full_run_budget``).
    ``gpus`` per node × ``nodes``: the hardware it is sized for (``Shape``; default gpus: 8 for verl
    and OpenRLHF, whose own default is 8, and 1 process for TRL). ``emit_dir``: write the task's
    splits and RACE's reward module there for the trainer (race.fullrun.emit), and point the recipe at them
    (a folder that holds anything is refused unless ``force``, which replaces RACE's own files only);
    without it the recipe names placeholders the trainer refuses.
    """
    from race.flops.grid import CostModel, choose_knobs, learning_rate
    from race.flops.specs import lora_spec, policy_arch, reward_spec

    key = str(trainer).lower() if trainer is not None else ""
    if key not in TRAINERS:
        raise RaceError(f"trainer {trainer!r} is unknown: expected one of {', '.join(TRAINERS)}")
    key_ = str(trainer).lower() if trainer is not None else ""
    shape = Shape(gpus if gpus is not None else (1 if key_ == "trl" else 8), nodes).check()
    cfg, r, P, C, label, results = _load_source(source, rho)
    raw_full = full_run_budget if full_run_budget is not None else cfg.full_run_budget
    if raw_full is None:
        raise RaceError("no full-run budget: give --full-run F (FLOPs of the full run, e.g. 1e20) or "
                        "full_run_budget in the config")
    full = parse_flops(raw_full, "--full-run" if full_run_budget is not None else "full_run_budget")
    # which ρ: the user's, else the range at F (race.stats.drift) where the drift model gives one, else the
    # verdict's at B; the recipe says which
    rho_source, at_f = ("given", None) if results is None or rho is not None else ("range at B", None)
    if rho_source == "range at B":
        at_f = _range_at_f(results, cfg, full)
        if at_f is not None and "refused" not in at_f:
            r, rho_source = round(float(at_f["recommended_rho"]), 4), "range at F"
    arch = policy_arch(cfg)
    lora = lora_spec(cfg, arch)
    reward = reward_spec(cfg)
    cm = CostModel(cfg, arch, reward, P, C)
    knobs = choose_knobs(cm, r)                         # one-line ConfigError when unreachable
    bp = cfg.schedule.prompts_per_step
    asked = Schedule(rho_target=r, prompts_per_step=bp, n_gen=knobs.n_gen, n_train=knobs.n_train, mu=knobs.mu,
                     steps=0, learning_rate=learning_rate(cfg, bp * knobs.n_train), lora_rank=cfg.lora.rank,
                     flops_per_step=knobs.per_prompt.scaled(bp), flops=FlopBreakdown())
    notes: list[str] = []
    n, mu = knobs.n_gen, knobs.mu
    name = VERSIONS[key].split(" ")[0]
    if knobs.n_train < knobs.n_gen or knobs.n_gen < 2:
        n, mu = _nearest_expressible(cm, r, asked, 2)
        near = cm.cost(n, mu, n).per_prompt.rho
        how = ("the max-reward-variance subset" if cfg.schedule.lower_rho_by == "keep"
               else "a max-reward-variance subset")
        notes.append(f"RACE's schedule at ρ={r:g} trains {knobs.n_train} of {knobs.n_gen} rollouts per prompt "
                     f"({how}, lower_rho_by: {cfg.schedule.lower_rho_by}) and {name} trains every generated "
                     f"rollout: the recipe is the nearest expressible one, {n} generated and trained per prompt "
                     f"with μ={mu} (ρ={near:.3f} as RACE's pilots count it, {knobs.per_prompt.rho:.3f} asked)")
    run = RUNS[key]
    fitted = _fit_prompts(bp, n, shape.world)
    if fitted != bp:
        notes.append(f"prompts per step {bp} → {fitted}: {fitted} × {n} sequences split evenly over "
                     f"{shape.world} GPUs ({shape.gpus} × {shape.nodes}); B_p is not a knob of ρ, the step count "
                     "absorbs it")
        bp = fitted
    per_prompt = trainer_step_cost(run, arch, lora, reward, prompt_len=P, completion_len=C, n=n, mu=mu,
                                   beta=cfg.grpo.beta, grad_checkpointing=cfg.grpo.grad_checkpointing)
    per_step = per_prompt.scaled(bp)
    steps = int(full // per_step.total)
    if steps < 1:
        raise RaceError(f"full-run budget {full:.3g} FLOPs is below one {name} step at ρ={r:g}: a step of "
                        f"{bp} prompts × {n} rollouts costs {per_step.total:.3g} FLOPs")
    # the rate for F (race.stats.rate): the stability line at F (with a stored length probe) decides it
    st = stability(results.pilots, results.diagnosis.primary_target) if results is not None else None
    probe = probe_for(results, full) if results is not None else None
    at_risk = stability_at(st, full_run_budget=full, pilot_budget=float(cfg.budget), ran=results is not None,
                           probe=probe)
    rate = full_run_rate(cfg.learning_rate, status=at_risk["status"], factor=full / float(cfg.budget),
                         full_lr=learning_rate(cfg, bp * n), probe=probe, cause=at_risk.get("cause"))
    if rate["rule"] != 4:
        cfg = replace(cfg, learning_rate=apply_rate(cfg.learning_rate, rate))
    lr = learning_rate(cfg, bp * n)
    planned = cm.cost(n, mu, n).per_prompt.scaled(bp)
    from race.fullrun.emit import data_settings, emit, model_location, openrlhf_passes

    rows = emit(cfg, key, emit_dir, force=force)["rows"] if emit_dir else None
    if key == "openrlhf" and rows is not None:     # whole batches, episodes × batches ≤ steps (race.fullrun.emit)
        episodes, samples = openrlhf_passes(steps, bp, rows)
        drawn = episodes * samples // bp if samples >= bp else steps
        if drawn < steps:
            notes.append(f"steps {steps} → {drawn}: OpenRLHF walks its whole dataset every episode, and "
                         f"{episodes} episode(s) of {samples // bp} whole batches of the {rows:,}-prompt split is "
                         "the most that does not exceed F")
            steps = drawn
    schedule = Schedule(rho_target=r, prompts_per_step=bp, n_gen=n, n_train=n, mu=mu, steps=steps,
                        learning_rate=lr, lora_rank=cfg.lora.rank, flops_per_step=planned,
                        flops=planned.scaled(steps))
    settings, model, more = _SETTINGS[key](replace(cfg, model=model_location(cfg.model, emit_dir)), schedule, P,
                                           shape)
    notes += more
    data, more = data_settings(key, emit_dir, steps=steps, prompts_per_step=bp, rows=rows)
    if key == "trl":                    # `trl grpo`'s script arguments, outside GRPOConfig
        model = {**model, **data}
    else:
        settings = {**settings, **data}
    notes += more
    notes.append(at_risk["line"])
    if rate["rule"] != 4:
        notes.append(rate["line"] + "; the recipe uses it")
    if cfg.grpo.healthy_recipe:
        notes.append(f"grpo.healthy_recipe switches KL and entropy by the data's base pass rate; {name} has no "
                     f"such switch: the recipe sets β={cfg.grpo.beta:g} and entropy {cfg.grpo.entropy_coef:g} as "
                     "configured")
    if rho_source != "given":
        notes.insert(0, f"ρ={r:g} is the recommended ρ of the {rho_source}"
                     + (f": {at_f['line']}" if rho_source == "range at F" else
                        f" ({results.diagnosis.primary.range_text()}); no range at F: {at_f['refused']}"
                        if at_f and "refused" in at_f else ""))
    rec = Recipe(trainer=key, version=VERSIONS[key], source=label, rho=r, full_run_budget=full, schedule=schedule,
                 settings=settings, model=model, flops_per_step=per_step, flops=per_step.scaled(steps),
                 planned=planned, run=run, prompt_len=P, completion_len=C, notes=tuple(notes),
                 asked=asked if (n, mu) != (knobs.n_gen, knobs.mu) or knobs.n_train != n else None,
                 extra={"gpus": shape.gpus, "nodes": shape.nodes})
    if emit_dir:
        from race.fullrun.emit import write_recipe

        write_recipe(rec, emit_dir)
    return rec


# ----------------------------------------------------------------------------- the trainers' names

def _micro(cfg: GridConfig, total: int) -> int:
    return _divisor_at_most(total, cfg.grpo.micro_batch or DEFAULT_MICRO_BATCH)


def _warmup_steps(cfg: GridConfig, optimizer_steps: int) -> int:
    return int(round(cfg.learning_rate.warmup * optimizer_steps))


WATCH_EVALS = 20        # validations over a full run that the recipe asks verl / OpenRLHF for (race.fullrun.watch)


def _watch_every(steps: int) -> int:
    """Steps between validations: WATCH_EVALS over the run (at least every step)."""
    return max(1, round(steps / WATCH_EVALS))


def _alpha(cfg: GridConfig) -> int | float:
    a = cfg.lora.alpha
    return int(a) if float(a).is_integer() else a


def _trl(cfg: GridConfig, s: Schedule, P: float, shape: Shape) -> tuple[dict, dict, list[str]]:
    g, total = cfg.grpo, s.prompts_per_step * s.n_gen
    micro = _micro(cfg, total // shape.world)          # per process: the batch splits over the processes
    opt_steps = s.steps * s.mu
    lr = cfg.learning_rate
    sched = {"constant": "constant_with_warmup" if lr.warmup else "constant",
             "wsd": "warmup_stable_decay"}.get(lr.schedule, lr.schedule)
    settings = {
        "num_generations": s.n_gen,
        "per_device_train_batch_size": micro,            # completions, not prompts
        "gradient_accumulation_steps": total // (micro * shape.world),
        "steps_per_generation": total // (micro * shape.world),   # generation batch = B_p · n_gen completions
        "num_iterations": s.mu,
        "max_steps": opt_steps,                          # optimizer steps: μ per generation batch
        "learning_rate": s.learning_rate,
        "lr_scheduler_type": sched,
        "warmup_steps": _warmup_steps(cfg, opt_steps),
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
        settings["lr_scheduler_kwargs"] = {"num_decay_steps": max(1, int(round(lr.decay * opt_steps))),
                                           "decay_type": "linear"}
    model = {"model_name_or_path": cfg.model, "use_peft": True, "lora_r": cfg.lora.rank,
             "lora_alpha": _alpha(cfg), "lora_target_modules": list(cfg.lora.targets)}
    notes = ["the watch: pass race.fullrun.watch.trl_callback(held-out prompts, your checker) in "
             "GRPOTrainer(callbacks=[…]): it stops a collapsing run and restores its best adapter (docs/stability.md)"]
    if shape.world > 1:
        notes.append(f"launch on {shape.world} processes (accelerate launch --num_processes {shape.world}"
                     + (f" --num_machines {shape.nodes}" if shape.nodes > 1 else "") + "): the per-device batch and "
                     "accumulation above assume it")
    return settings, model, notes


def _verl(cfg: GridConfig, s: Schedule, P: float, shape: Shape) -> tuple[dict, dict, list[str]]:
    g, lr = cfg.grpo, cfg.learning_rate
    # verl splits a mini-batch of B_p · n sequences over the data-parallel GPUs, then into micro-batches
    micro = _micro(cfg, s.prompts_per_step * s.n_gen // shape.world)
    notes = []
    sched = lr.schedule
    if sched in ("linear", "wsd"):
        sched = "cosine"
        notes.append(f"learning_rate.schedule {lr.schedule}: verl's actor optimizer has constant and cosine only; "
                     "the recipe uses cosine (also to 0), ρ unchanged")
    agg = {"dapo": "token-mean", "grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm"}[g.loss_agg]
    ov: dict[str, Any] = {
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": g.advantage == "grpo",
        "algorithm.use_kl_in_reward": False,
        "data.train_batch_size": s.prompts_per_step,
        "data.max_prompt_length": _max_prompt(P),
        "data.max_response_length": g.max_completion_len,
        "actor_rollout_ref.rollout.n": s.n_gen,
        # mandatory in verl's ppo_trainer.yaml (`???`); vLLM and safetensors as its LoRA page requires
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.load_format": "safetensors",
        "actor_rollout_ref.rollout.temperature": g.temperature,
        "actor_rollout_ref.rollout.top_p": g.top_p,
        "actor_rollout_ref.rollout.enable_prefix_caching": True,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.ppo_mini_batch_size": s.prompts_per_step,   # prompts: one optimizer step per epoch
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.actor.ppo_epochs": s.mu,
        "actor_rollout_ref.actor.optim.lr": s.learning_rate,
        "actor_rollout_ref.actor.optim.lr_scheduler_type": sched,
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": lr.warmup,
        "actor_rollout_ref.actor.clip_ratio": g.clip_eps,
        **({"actor_rollout_ref.actor.clip_ratio_low": g.clip_eps, "actor_rollout_ref.actor.clip_ratio_high": g.clip_eps_high}
           if g.clip_eps_high is not None else {}),
        "actor_rollout_ref.actor.loss_agg_mode": agg,
        "actor_rollout_ref.actor.entropy_coeff": g.entropy_coef,
        "actor_rollout_ref.actor.use_kl_loss": g.beta > 0,
        "actor_rollout_ref.actor.kl_loss_coef": g.beta,
        "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.model.path": cfg.model,
        "actor_rollout_ref.model.lora_rank": cfg.lora.rank,
        "actor_rollout_ref.model.lora_alpha": _alpha(cfg),
        "actor_rollout_ref.model.target_modules": list(cfg.lora.targets),
        "actor_rollout_ref.model.enable_gradient_checkpointing": g.grad_checkpointing,
        "trainer.total_training_steps": s.steps,
        # total_training_steps ends the run; enough epochs that a dataset of ≥ B_p prompts never ends it first
        "trainer.total_epochs": s.steps,
        "trainer.n_gpus_per_node": shape.gpus,
        "trainer.nnodes": shape.nodes,
        # the watch (race.fullrun.watch): the base policy, then every test_freq steps, samples dumped per step
        "trainer.val_before_train": True,
        "trainer.test_freq": _watch_every(s.steps),
        "trainer.validation_data_dir": "race_watch_val",
    }
    notes.append("the watch: with a fixed held-out set as data.val_files, verl validates every "
                 f"{_watch_every(s.steps)} steps and dumps each sample's score to race_watch_val/STEP.jsonl; "
                 "race.fullrun.watch.check_scores(race.fullrun.watch.verl_history('race_watch_val')) applies the pilots' "
                 "instability rule (docs/stability.md); validation FLOPs are outside this recipe's count")
    if g.loss_agg == "dr_grpo":
        ov["actor_rollout_ref.actor.loss_scale_factor"] = g.max_completion_len
    if lr.schedule != "constant" or lr.warmup:
        notes.append(f"verl steps its learning-rate schedule once per rollout batch ({s.steps} steps), RACE once "
                     f"per optimizer step ({s.steps * s.mu}): the same shape, μ={s.mu} optimizer steps share a rate")
    return ov, {}, notes


def _openrlhf(cfg: GridConfig, s: Schedule, P: float, shape: Shape) -> tuple[dict, dict, list[str]]:
    g, lr = cfg.grpo, cfg.learning_rate
    total = s.prompts_per_step * s.n_gen
    micro = _micro(cfg, total // shape.world)          # per GPU; accumulation = total / (micro · GPUs)
    notes = []
    alpha = _alpha(cfg)
    if not float(alpha).is_integer():                  # OpenRLHF parses --ds.lora.alpha as an int
        notes.append(f"lora.alpha {alpha:g}: OpenRLHF 0.11 takes a whole number; the recipe uses "
                     f"{round(alpha)} (LoRA scale {round(alpha) / cfg.lora.rank:g} instead of {alpha / cfg.lora.rank:g})")
        alpha = int(round(alpha))
    notes.append("OpenRLHF 0.11.0 sends LoRA weights to vLLM under their adapter-wrapped names, unmerged: its open "
                 "issue #1349 reports LoRA + vLLM weight sync failing at this version. Until it is fixed the nearest "
                 "working recipe is race recipe --for verl (LoRA through vLLM), or this one with --ds.lora.rank 0 "
                 "(full fine-tuning: another FLOP count)")
    if g.loss_agg != "dapo":
        notes.append(f"grpo.loss_agg {g.loss_agg}: OpenRLHF 0.11's PPO loss is token-level (token sum / token "
                     "count of the optimizer step: RACE's dapo) and has no switch for it; the recipe uses that, "
                     "ρ unchanged")
    sched = {"constant": "constant_with_warmup" if lr.warmup else "constant"}.get(lr.schedule, lr.schedule)
    if lr.schedule == "wsd":
        sched = "cosine"
        notes.append("learning_rate.schedule wsd: OpenRLHF 0.11 passes no decay length to transformers' "
                     "warm-up–stable–decay schedule; the recipe uses cosine (also to 0), ρ unchanged")
    flags: dict[str, Any] = {
        "--actor.model_name_or_path": cfg.model,
        "--algo.advantage.estimator": "group_norm" if g.advantage == "grpo" else "dr_grpo",
        "--rollout.batch_size": s.prompts_per_step,
        "--rollout.n_samples_per_prompt": s.n_gen,
        "--rollout.micro_batch_size": micro,
        "--train.batch_size": total,                    # one optimizer step per pass over the rollout batch
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
        "--data.max_len": _max_prompt(P) + g.max_completion_len,
        "--rollout.temperature": g.temperature,
        "--rollout.top_p": g.top_p,
        "--actor.eps_clip": g.clip_eps,
        **({"--actor.eps_clip_low_high": [g.clip_eps, g.clip_eps_high]} if g.clip_eps_high is not None else {}),
        "--actor.entropy_coef": g.entropy_coef,
        "--algo.kl.init_coef": g.beta,
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
    flags["--eval.steps"] = _watch_every(s.steps)       # the watch (race.fullrun.watch): a validation every K steps
    notes.append(f"the watch: add --eval.dataset HELD_OUT (a fixed held-out set); OpenRLHF validates every "
                 f"{_watch_every(s.steps)} steps and logs the mean (eval_*_pass1), and "
                 "race.fullrun.watch.check_means([(0, base mean), (step, mean), …], prompts=N) applies the pilots' "
                 "instability rule to those means (docs/stability.md); validation FLOPs are outside this "
                 "recipe's count")
    return flags, {}, notes


def _max_prompt(P: float) -> int:
    """A prompt-length cap twice the expected prompt, in multiples of 64 (set it to the data's longest)."""
    return int(64 * math.ceil(2.0 * P / 64.0))


_SETTINGS = {"trl": _trl, "verl": _verl, "openrlhf": _openrlhf}


# ----------------------------------------------------------------------------- rendering

def _fmt_flops(x: float) -> str:
    return f"{x:.3e}"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v) if isinstance(v, str) else str(v)


def trainer_lines(rec: Recipe) -> list[str]:
    """The configuration alone, as the trainer takes it: TRL Python, verl / OpenRLHF command lines."""
    s = rec.settings
    if rec.trainer == "trl":      # a script that runs as printed (python - < it), on the --emit folder's files
        m = rec.model
        d = os.path.dirname(str(m.get("dataset_name", os.path.join("RACE_EMIT_DIR", "data"))))
        lines = ["import sys", "", "import torch", "from datasets import load_dataset", "from peft import LoraConfig",
                 "from trl import GRPOConfig, GRPOTrainer", "",
                 f"sys.path.insert(0, {d!r})            # race_reward.py, written by --emit",
                 "from race_reward import reward  # noqa: E402", "",
                 "cpu = not torch.cuda.is_available()",
                 "args = GRPOConfig("]
        lines += [f"    {k}={_value(v)}," for k, v in s.items()]
        lines += [f"    output_dir={os.path.join(d, 'out')!r}, report_to='none', save_strategy='no',",
                  "    use_cpu=cpu, bf16=not cpu,",
                  ")", f"peft_config = LoraConfig(r={m['lora_r']}, lora_alpha={m['lora_alpha']}, "
                       f"target_modules={m['lora_target_modules']!r}, task_type='CAUSAL_LM')",
                  f"data = load_dataset('json', data_files={os.path.join(d, 'data', 'train.jsonl')!r}, split='train')",
                  f"trainer = GRPOTrainer(model={m['model_name_or_path']!r}, reward_funcs=reward, args=args, "
                  "train_dataset=data, peft_config=peft_config)",
                  "trainer.train()"]
        return lines
    if rec.trainer == "verl":
        def ov(k: str, v: Any) -> str:
            if isinstance(v, list):
                return f"{k}='[{','.join(map(str, v))}]'"
            return f"{k}={str(v).lower() if isinstance(v, bool) else _value(v).strip(chr(39))}"
        return ["python3 -m verl.trainer.main_ppo \\"] + [f"    {ov(k, v)} \\" for k, v in s.items()][:-1] + \
            [f"    {ov(*list(s.items())[-1])}"]
    out = []
    for k, v in s.items():
        if v is True:
            out.append(k)
        elif isinstance(v, list):
            out.append(f"{k} {' '.join(map(str, v))}")
        else:
            out.append(f"{k} {_value(v).strip(chr(39))}")
    return ["python3 -m openrlhf.cli.train_ppo_ray \\"] + [f"    {x} \\" for x in out[:-1]] + [f"    {out[-1]}"]


def flop_lines(rec: Recipe) -> list[str]:
    s, ps, t = rec.schedule, rec.flops_per_step, rec.flops
    run = rec.run
    how = (f"{run.sampler}: {'one prefill per prompt' if run.prefix_shared else 'a prefill per rollout'}, "
           f"{'unmerged adapter' if run.adapter_in_sampler else 'base weights'} in the sampler; old log-prob "
           f"forward {'every step' if run.old_logprob == 'always' else 'when μ > 1'}; LM head on "
           f"{'completion' if run.completion_logits_only else 'all'} positions"
           + ("; logits recomputed in backward" if run.head_recompute else "")
           + ("; attention scores recomputed in backward" if run.attention_recompute else ""))
    return [f"FLOPs as {rec.version.split(' (')[0]} runs it ({how}), P={rec.prompt_len:g} C={rec.completion_len:g} "
            "expected tokens:",
            f"  per step: search {_fmt_flops(ps.search)}  learning {_fmt_flops(ps.learning)}  reward "
            f"{_fmt_flops(ps.reward)}  total {_fmt_flops(ps.total)}",
            f"  {s.steps} steps: search {_fmt_flops(t.search)}  learning {_fmt_flops(t.learning)}  reward "
            f"{_fmt_flops(t.reward)}  total {_fmt_flops(t.total)} of {rec.full_run_budget:.3g}",
            f"  ρ = {t.rho:.3f} as run (RACE's pilots count these knobs at ρ = {rec.planned.rho:.3f})"]


def render_recipe(rec: Recipe, fmt: str = "text") -> str:
    """``text`` (header, configuration, FLOP statement, notes), ``yaml`` (the trainer's configuration:
    for TRL a file for ``trl grpo --config``, for verl the overrides nested; the accounting as
    comments; refused for OpenRLHF, whose trainer reads flags only) or ``json`` (everything)."""
    if fmt not in FORMATS:
        raise RaceError(f"format {fmt!r} is unknown: expected one of {', '.join(FORMATS)}")
    if fmt == "json":
        import json

        return json.dumps(rec.to_dict(), indent=2) + "\n"
    s = rec.schedule
    # the source and the notes may carry text from a results file: one line each (race.core.safeio.one_line),
    # so a newline in a file cannot forge a line of the recipe or break out of a YAML comment
    head = [f"RACE recipe for {rec.version} at ρ={rec.rho:g} (from {one_line(rec.source)}), full run {rec.full_run_budget:.3g} "
            "FLOPs",
            f"  {s.steps} steps × {s.prompts_per_step} prompts × {s.n_gen} rollouts, μ={s.mu} optimizer steps per "
            f"rollout batch ({s.steps * s.mu} in all), lr {s.learning_rate:.4g} (√B rule, B={s.batch_size})"]
    notes = [f"note: {one_line(n)}" for n in rec.notes]
    if fmt == "yaml":
        import yaml

        body = {**rec.model, **rec.settings} if rec.trainer == "trl" else dict(rec.settings)
        if rec.trainer == "verl":
            body = _nest(rec.settings)
        elif rec.trainer == "openrlhf":
            raise RaceError("OpenRLHF 0.11's train_ppo_ray.py takes command-line flags only (it has no --config): "
                            "use --format text for the command, or --format json")
        comments = head + flop_lines(rec) + notes
        if rec.trainer == "trl":
            placeholder = str(rec.model.get("dataset_name", "")).startswith("RACE_EMIT_DIR")
            comments.append("for `trl grpo --config FILE --output_dir OUT`, run from the --emit folder (race_reward.py "
                            "is imported from there)" + ("; dataset_name and reward_funcs are placeholders until "
                                                         "race recipe … --emit DIR" if placeholder else "")
                            + "; on a machine without a GPU add --use_cpu true --bf16 false")
        text = yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
        return "".join(f"# {c}\n" for c in comments) + text
    # everything but the configuration is a comment (# in Python and in a shell), so the text runs as printed
    return "\n".join([f"# {x}" for x in head] + [""] + trainer_lines(rec) + [""]
                      + [f"# {x}" for x in flop_lines(rec) + notes]) + "\n"


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        node = out
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return out


__all__ = ["TRAINERS", "VERSIONS", "Recipe", "TrainerRun", "RUNS", "recipe", "render_recipe", "trainer_step_cost"]
