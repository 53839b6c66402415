"""From a RACE verdict to a full-run trainer configuration: TRL, verl or OpenRLHF. Pure (no torch);
``race.recipe`` is ``recipe`` below.

``recipe(source, trainer=…)`` takes a results file (its diagnosis: the recommended ρ range's centre,
unless ``rho``) or a pilot-grid config (then ``rho`` is required), plans the schedule RACE would run
at that ρ (race.flops.grid: prompts per step B_p, rollouts generated n_gen and trained n_train per prompt,
update iterations μ, the √B learning rate, with the results' calibrated lengths), and writes it in
the trainer's own parameter names (``docs/recipes.md`` names the version each was read from).

This module is the dispatch: the verdict → recipe logic, the FLOP count of a step as a trainer runs
it (``trainer_step_cost``) and the rendering. Each trainer's own part (its version pin, its
``TrainerRun``, its config builder in its parameter names, its command lines) is one module below it:
race.fullrun.trl, race.fullrun.verl, race.fullrun.openrlhf (``TRAINERS`` lists them, in this order);
what they share (``Recipe``, ``TrainerRun``, ``Shape``, the micro-batch and watch rules) is
race.fullrun.recipe_base, below them.

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

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from race.config.configfile import GridConfig, config_from_dict, parse_flops
from race.core.errors import RaceError
from race.core.records import FlopBreakdown, Schedule
from race.core.safeio import one_line
from race.flops import formulas as F
from race.fullrun import openrlhf, trl, verl
from race.fullrun.recipe_base import DEFAULT_MICRO_BATCH, WATCH_EVALS  # noqa: F401  (re-exported: their old home)
from race.fullrun.recipe_base import Recipe, Shape, TrainerRun
from race.stats.instability import stability, stability_at
from race.stats.rate import apply_rate, full_run_rate
from race.stats.results import probe_for

TRAINERS = ("trl", "verl", "openrlhf")
FORMATS = ("text", "yaml", "json")
# each trainer's module: VERSION (where its parameter names and behaviour were read, docs/recipes.md), RUN
# (how it runs a step), settings (its config for a schedule), command_lines and yaml_document (its rendering)
TRAINER_MODULES = {"trl": trl, "verl": verl, "openrlhf": openrlhf}
VERSIONS = {key: TRAINER_MODULES[key].VERSION for key in TRAINERS}
RUNS = {key: TRAINER_MODULES[key].RUN for key in TRAINERS}


def _trainer_name(key: str) -> str:
    """The trainer as the notes name it (``TRL``, ``verl``, ``OpenRLHF``)."""
    return VERSIONS[key].split(" ")[0]


# ----------------------------------------------------------------------------- the trainer's FLOPs

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
    except (TypeError, ValueError, OverflowError):
        from race.core.arguments import shown

        raise RaceError(f"ρ {shown(rho)} is not a number in (0, 1): expected a value in (0, 1)") from None
    if not 0.0 < r < 1.0:
        raise RaceError(f"ρ={r:g} is outside (0, 1): ρ = C_learning / C_total")
    return r


# ----------------------------------------------------------------------------- planning

def _nearest_expressible(cm: Any, rho: float, sched: Schedule, min_n: int) -> tuple[int, int]:
    """(n, μ) with n generated = n trained, n between n_train and n_gen (≥ ``min_n``), μ ≤ max_mu,
    whose ρ as RACE's pilots count it is nearest ``rho``; ties: fewer μ, then n nearer n_train."""
    lo_n = max(min_n, sched.n_train)
    hi_n = max(lo_n, sched.n_gen)
    cands = [(abs(cm.cost(n, mu, n).per_prompt.rho - rho), mu, n - sched.n_train, n, mu)
             for n in range(lo_n, hi_n + 1) for mu in range(1, cm.c.schedule.max_mu + 1)]
    _, _, _, n, mu = min(cands)
    return n, mu


def _fit_prompts(bp: int, n: int, world: int) -> int:
    """The smallest B_p' ≥ B_p whose B_p'·n sequences split evenly over ``world`` GPUs (B_p is not a
    knob of ρ: the step count absorbs it, the FLOPs stay the budget's)."""
    k = bp
    while (k * n) % world:
        k += 1
    return k


@dataclass(frozen=True)
class _Plan:
    """One step of the recipe before its count: RACE's knobs at ρ (``asked``), the (``n``, ``mu``) the
    trainer runs (every generated rollout trained), the prompts per step fitted to the GPUs, and the
    model as race.flops sees it (``cm``: race.flops.grid.CostModel; ``arch``, ``lora``, ``reward``)."""

    cm: Any
    arch: F.ArchSpec
    lora: F.LoRASpec
    reward: F.RewardModelSpec | None
    asked: Schedule
    exact: bool                 # RACE's own (n_gen, n_train, μ) is expressible as is
    n: int
    mu: int
    prompts: int


def _trainer_key(trainer: Any) -> str:
    """The trainer's key in ``TRAINERS`` (any case); another name is refused."""
    key = str(trainer).lower() if trainer is not None else ""
    if key not in TRAINERS:
        raise RaceError(f"trainer {trainer!r} is unknown: expected one of {', '.join(TRAINERS)}")
    return key


MAX_TRAINER_STEPS = 10 ** 9     # past it a step count is an error of units, not a run (int32 holds 2.1e9)


def _full_budget(cfg: GridConfig, full_run_budget: float | str | None) -> float:
    """The full run's FLOPs: the one given, else the config's."""
    raw_full = full_run_budget if full_run_budget is not None else cfg.full_run_budget
    if raw_full is None:
        raise RaceError("no full-run budget: give --full-run F (FLOPs of the full run, e.g. 1e20) or "
                        "full_run_budget in the config")
    return parse_flops(raw_full, "--full-run" if full_run_budget is not None else "full_run_budget")


def _rho_at(results: Any, rho: float | None, cfg: GridConfig, full: float,
            r: float) -> tuple[float, str, dict[str, Any] | None]:
    """(ρ, where it comes from, the range at F or None). Which ρ: the user's, else the range at F
    (race.stats.drift) where the drift model gives one, else the verdict's at B; the recipe says which."""
    rho_source, at_f = ("given", None) if results is None or rho is not None else ("range at B", None)
    if rho_source == "range at B":
        at_f = _range_at_f(results, cfg, full)
        if at_f is not None and "refused" not in at_f:
            r, rho_source = round(float(at_f["recommended_rho"]), 4), "range at F"
    return r, rho_source, at_f


def _rho_line(r: float, rho_source: str, at_f: dict[str, Any] | None, results: Any) -> str:
    """The first note when ρ is the verdict's: which range it is the centre of."""
    return (f"ρ={r:g} is the recommended ρ of the {rho_source}"
            + (f": {at_f['line']}" if rho_source == "range at F" else
               f" ({results.diagnosis.primary.range_text()}); no range at F: {at_f['refused']}"
               if at_f and "refused" in at_f else ""))


def _plan(cfg: GridConfig, key: str, r: float, P: float, C: float, shape: Shape) -> tuple[_Plan, list[str]]:
    """RACE's knobs at ρ (race.flops.grid.choose_knobs: a one-line ConfigError when unreachable), the
    nearest the trainer can express when it cannot train a subset of a prompt's rollouts, and the
    prompts per step fitted to ``shape``; with one note per change."""
    from race.flops.grid import CostModel, choose_knobs, learning_rate
    from race.flops.architectures import lora_note
    from race.flops.specs import lora_spec, policy_arch, reward_spec

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
    if knobs.n_train < knobs.n_gen or knobs.n_gen < 2:
        n, mu = _nearest_expressible(cm, r, asked, 2)
        near = cm.cost(n, mu, n).per_prompt.rho
        how = ("the max-reward-variance subset" if cfg.schedule.lower_rho_by == "keep"
               else "a max-reward-variance subset")
        notes.append(f"RACE's schedule at ρ={r:g} trains {knobs.n_train} of {knobs.n_gen} rollouts per prompt "
                     f"({how}, lower_rho_by: {cfg.schedule.lower_rho_by}) and {_trainer_name(key)} trains every "
                     f"generated rollout: the recipe is the nearest expressible one, {n} generated and trained per "
                     f"prompt with μ={mu} (ρ={near:.3f} as RACE's pilots count it, {knobs.per_prompt.rho:.3f} asked)")
    if lora_note(arch, lora.target_modules) and arch.model_type == "qwen2_moe":   # the MoE names peft ≥ 0.22 maps
        notes.append("LoRA on qwen2_moe: this split counts adapters on attention and the shared expert only; with "
                     "peft ≥ 0.22 the target_modules names below adapt the routed experts too (peft maps gate_proj / "
                     "up_proj / down_proj onto their fused parameters), which it does not count: leave the MLP roles "
                     "out of lora.targets for the recipe to match it")
    fitted = _fit_prompts(bp, n, shape.world)
    if fitted != bp:
        notes.append(f"prompts per step {bp} → {fitted}: {fitted} × {n} sequences split evenly over "
                     f"{shape.world} GPUs ({shape.gpus} × {shape.nodes}); B_p is not a knob of ρ, the step count "
                     "absorbs it")
        bp = fitted
    exact = (n, mu) == (knobs.n_gen, knobs.mu) and knobs.n_train == n
    return _Plan(cm, arch, lora, reward, asked, exact, n, mu, bp), notes


def _trainer_steps(plan: _Plan, cfg: GridConfig, key: str, r: float, P: float, C: float,
                   full: float) -> tuple[FlopBreakdown, int]:
    """(one step's FLOPs as the trainer runs it, the steps F pays for); a budget below one step is refused."""
    per_prompt = trainer_step_cost(RUNS[key], plan.arch, plan.lora, plan.reward, prompt_len=P, completion_len=C,
                                   n=plan.n, mu=plan.mu, beta=cfg.grpo.beta,
                                   grad_checkpointing=cfg.grpo.grad_checkpointing)
    per_step = per_prompt.scaled(plan.prompts)
    steps = int(full // per_step.total)
    if steps > MAX_TRAINER_STEPS:       # no trainer holds the count (and no run of that length is planned)
        raise RaceError(f"full-run budget {full:.3g} FLOPs is {steps:.3g} {_trainer_name(key)} steps at ρ={r:g}: more "
                        f"than {MAX_TRAINER_STEPS:.0e}; check the full run's FLOPs (e.g. 1e20)")
    if steps < 1:
        raise RaceError(f"full-run budget {full:.3g} FLOPs is below one {_trainer_name(key)} step at ρ={r:g}: a "
                        f"step of {plan.prompts} prompts × {plan.n} rollouts costs {per_step.total:.3g} FLOPs")
    return per_step, steps


def _rate_at_f(cfg: GridConfig, results: Any, full: float,
               batch: int) -> tuple[GridConfig, dict[str, Any], dict[str, Any]]:
    """(the config with the rate for F, the stability line at F, the rate rule): the stability line at
    F (with a stored length probe) decides the rate (race.stats.rate); rule 4 keeps the configured one."""
    from race.flops.grid import learning_rate

    st = stability(results.pilots, results.diagnosis.primary_target) if results is not None else None
    probe = probe_for(results, full) if results is not None else None
    at_risk = stability_at(st, full_run_budget=full, pilot_budget=float(cfg.budget), ran=results is not None,
                           probe=probe)
    rate = full_run_rate(cfg.learning_rate, status=at_risk["status"], factor=full / float(cfg.budget),
                         full_lr=learning_rate(cfg, batch), probe=probe, cause=at_risk.get("cause"))
    if rate["rule"] != 4:
        cfg = replace(cfg, learning_rate=apply_rate(cfg.learning_rate, rate))
    return cfg, at_risk, rate


def _emitted_rows(cfg: GridConfig, key: str, emit_dir: str | None, force: bool, steps: int,
                  bp: int) -> tuple[int | None, int, list[str]]:
    """(training rows written to ``emit_dir`` or None, the steps, notes): with OpenRLHF, whole batches
    and episodes × batches ≤ steps (race.fullrun.emit), so the steps may drop."""
    from race.fullrun.emit import emit, openrlhf_passes

    notes: list[str] = []
    rows = emit(cfg, key, emit_dir, force=force)["rows"] if emit_dir else None
    if key == "openrlhf" and rows is not None:     # whole batches, episodes × batches ≤ steps (race.fullrun.emit)
        episodes, samples = openrlhf_passes(steps, bp, rows)
        drawn = episodes * samples // bp if samples >= bp else steps
        if drawn < steps:
            notes.append(f"steps {steps} → {drawn}: OpenRLHF walks its whole dataset every episode, and "
                         f"{episodes} episode(s) of {samples // bp} whole batches of the {rows:,}-prompt split is "
                         "the most that does not exceed F")
            steps = drawn
    return rows, steps, notes


def _trainer_settings(cfg: GridConfig, key: str, schedule: Schedule, P: float, shape: Shape,
                      emit_dir: str | None, rows: int | None, plan: _Plan) -> tuple[dict, dict, list[str]]:
    """(settings, model arguments, notes): the trainer module's config for ``schedule``, pointed at the
    emitted data and reward (race.fullrun.emit.data_settings; TRL's are script arguments, beside the model's)."""
    from race.flops.architectures import peft_target_modules
    from race.fullrun.emit import chat_format, data_settings, model_location

    # the trainer's peft gets the family's module names (qkv_proj on a Phi-3), as RACE's pilots and its split do:
    # role names would reach only the modules that share a role's name (o_proj and down_proj on a Phi-3)
    names = tuple(peft_target_modules(plan.arch, plan.lora.target_modules))
    settings, model, notes = TRAINER_MODULES[key].settings(
        replace(cfg, model=model_location(cfg.model, emit_dir), lora=replace(cfg.lora, targets=names)),
        schedule, P, shape)
    chat, chat_notes = chat_format(cfg)
    data, more = data_settings(key, emit_dir, steps=schedule.steps, prompts_per_step=schedule.prompts_per_step,
                               rows=rows, chat=chat)
    if key == "trl":                    # `trl grpo`'s script arguments, outside GRPOConfig
        model = {**model, **data}
    else:
        settings = {**settings, **data}
    return settings, model, notes + more + chat_notes


def _closing_notes(cfg: GridConfig, key: str, at_risk: dict[str, Any], rate: dict[str, Any]) -> list[str]:
    """The stability line at F, the rate for F when it is not the configured one, the healthy recipe."""
    notes = [at_risk["line"]]
    if rate["rule"] != 4:
        notes.append(rate["line"] + "; the recipe uses it")
    if cfg.grpo.healthy_recipe:
        notes.append(f"grpo.healthy_recipe switches KL and entropy by the data's base pass rate; {_trainer_name(key)} "
                     f"has no such switch: the recipe sets β={cfg.grpo.beta:g} and entropy {cfg.grpo.entropy_coef:g} "
                     "as configured")
    return notes


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
    from race.flops.grid import learning_rate

    from race.core import arguments as A

    key = _trainer_key(trainer)
    A.flag("force", force)
    if emit_dir is not None:
        A.text("emit_dir", emit_dir if not isinstance(emit_dir, str) or emit_dir.strip() else "")
    shape = Shape(gpus if gpus is not None else (1 if key == "trl" else 8), nodes).check()
    cfg, r, P, C, label, results = _load_source(source, rho)
    full = _full_budget(cfg, full_run_budget)
    r, rho_source, at_f = _rho_at(results, rho, cfg, full, r)
    plan, notes = _plan(cfg, key, r, P, C, shape)
    per_step, steps = _trainer_steps(plan, cfg, key, r, P, C, full)
    bp, n, mu = plan.prompts, plan.n, plan.mu
    cfg, at_risk, rate = _rate_at_f(cfg, results, full, bp * n)
    lr = learning_rate(cfg, bp * n)
    planned = plan.cm.cost(n, mu, n).per_prompt.scaled(bp)
    rows, steps, more = _emitted_rows(cfg, key, emit_dir, force, steps, bp)
    notes += more
    schedule = Schedule(rho_target=r, prompts_per_step=bp, n_gen=n, n_train=n, mu=mu, steps=steps,
                        learning_rate=lr, lora_rank=cfg.lora.rank, flops_per_step=planned,
                        flops=planned.scaled(steps))
    settings, model, more = _trainer_settings(cfg, key, schedule, P, shape, emit_dir, rows, plan)
    notes += more + _closing_notes(cfg, key, at_risk, rate)
    if rho_source != "given":
        notes.insert(0, _rho_line(r, rho_source, at_f, results))
    rec = Recipe(trainer=key, version=VERSIONS[key], source=label, rho=r, full_run_budget=full, schedule=schedule,
                 settings=settings, model=model, flops_per_step=per_step, flops=per_step.scaled(steps),
                 planned=planned, run=RUNS[key], prompt_len=P, completion_len=C, notes=tuple(notes),
                 asked=None if plan.exact else plan.asked, extra={"gpus": shape.gpus, "nodes": shape.nodes})
    if emit_dir:
        from race.fullrun.emit import write_recipe

        write_recipe(rec, emit_dir)
    return rec


# ----------------------------------------------------------------------------- rendering

def _fmt_flops(x: float) -> str:
    return f"{x:.3e}"


def trainer_lines(rec: Recipe) -> list[str]:
    """The configuration alone, as the trainer takes it: TRL Python, verl / OpenRLHF command lines."""
    return TRAINER_MODULES[rec.trainer].command_lines(rec)


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

        # the trainer's configuration and its own comment lines (OpenRLHF, flags only, refuses)
        body, more = TRAINER_MODULES[rec.trainer].yaml_document(rec)
        comments = head + flop_lines(rec) + notes + more
        text = yaml.safe_dump(body, sort_keys=False, default_flow_style=False)
        return "".join(f"# {c}\n" for c in comments) + text
    # everything but the configuration is a comment (# in Python and in a shell), so the text runs as printed
    return "\n".join([f"# {x}" for x in head] + [""] + trainer_lines(rec) + [""]
                      + [f"# {x}" for x in flop_lines(rec) + notes]) + "\n"


def check_format(trainer: Any, fmt: str) -> None:
    """Refuse, before anything is computed or written, a rendering the trainer has not (OpenRLHF has no YAML)."""
    refusal = getattr(TRAINER_MODULES.get(str(trainer).lower()), "YAML_REFUSAL", None)
    if fmt == "yaml" and refusal:
        raise RaceError(refusal)


__all__ = ["TRAINERS", "VERSIONS", "Recipe", "TrainerRun", "RUNS", "check_format", "recipe", "render_recipe",
           "trainer_step_cost"]
