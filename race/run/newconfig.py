"""``race init``: a commented pilot-grid config for your model, task and reward, sized from the
full run you are planning.

The budget per pilot is the share of the full run you will spend on pilots, split evenly over
grid points × seeds. The header comments carry RACE's own arithmetic for the model (parameters,
FLOPs per token, the split of one on-policy step per prompt) and the plan (steps per pilot and
per full run at each ρ). The config is planned before it is written, so ``race plan FILE`` and
``race pilot FILE`` work as written, and a budget too small for one step is refused here.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from race.config.configfile import ConfigError, GridConfig, config_from_dict, parse_flops, parse_grid
from race.config.rules import RULE_REWARDS, check_share

DEFAULT_SHARE = 0.10                       # share of the full run spent on the pilot grid
DEFAULT_GRID = (0.3, 0.45, 0.6, 0.72, 0.85)
MODEL_REWARDS = ("prm", "proxy-prm")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
EVAL_PROMPTS = 500                         # held-out prompts per evaluation, when the task has them

# Expected lengths before calibration measures them. A shipped tiny policy writes the format it was
# trained on (race/assets; the configs under pilots/ and race.config.presets use the same numbers): its
# expected completion tokens and cap on new tokens come from this table, and its prompt length is
# measured with its own tokenizer on the task's training prompts. Any other model gets LLM_LENGTHS:
# a chat prompt and a reasoning completion.
SHIPPED_COMPLETIONS = {
    "race/tiny-arith": (3.5, 6), "race/tiny-arith-s": (3.5, 6), "race/tiny-arith-l": (3.5, 6),
    "race/tiny-arith-steps": (21.0, 24), "race/tiny-reasoner": (60.0, 160),
}
LLM_LENGTHS = (256.0, 512.0, 1024)         # prompt, completion, cap
LENGTH_PROMPTS = 256                       # training prompts a shipped policy's prompt length is measured on


def _reward_section(reward: str, reward_model: str | None) -> dict[str, Any]:
    if reward in RULE_REWARDS:
        return {"kind": reward}
    if reward in MODEL_REWARDS:
        if not reward_model:
            raise ConfigError(f"reward {reward!r} needs --reward-model (a PRM id or folder)")
        return {"kind": reward, "model": reward_model}
    if ":" in reward:
        from race.tasks.rewards.isolated import IsolatedReward

        IsolatedReward(reward).start().close()    # importable now, from here, or refused with the reason
        return {"kind": "custom", "function": reward}
    raise ConfigError(f"reward {reward!r} is unknown: expected one of {', '.join(RULE_REWARDS + MODEL_REWARDS)} "
                      "or 'module:function'")


def _reward_label(reward: str) -> str:
    """``sparse`` → ``sparse``; ``path/myreward.py:score`` or ``myreward:score`` → ``myreward``."""
    module = reward.rpartition(":")[0] or reward
    if module.endswith(".py"):
        return os.path.basename(module)[:-3]
    return module.split(".")[-1]


RESOLVE_AT = 0.10          # the held-out set should resolve this difference in mean reward between two grid points


def resolvable(prompts: int) -> float:
    """The smallest difference in mean held-out reward between two grid points that ``prompts``
    prompts resolve at 2 SEs, in the worst case (per-prompt scores in [0, 1], variance ≤ 1/4):
    2 · √2 · ½ / √prompts = √(2 / prompts). 200 prompts resolve 0.10."""
    return (2.0 / prompts) ** 0.5


def set_warnings(raw: dict[str, Any] | GridConfig, *, train: int | None, held: int | None) -> list[str]:
    """Warnings on a local dataset too small for the grid: a held-out set that cannot resolve
    RESOLVE_AT between grid points, and training problems each pilot would repeat more than 4 times."""
    out = []
    if held is not None:
        need = int(-(-2.0 // RESOLVE_AT ** 2))                # √(2/P) ≤ 0.1 → P ≥ 200
        if held < need:
            out.append(f"the held-out set has {held} problems: it resolves only differences of "
                       f"{resolvable(max(held, 1)):.2f} in mean reward between grid points (2 SEs, worst case); "
                       f"{need} resolve {RESOLVE_AT:.2f}: add held-out problems")
    if train is not None:
        from race.flops.grid import plan_grid

        try:
            cfg = raw if isinstance(raw, GridConfig) else config_from_dict(raw)
            use = max(s.steps * s.prompts_per_step for s in plan_grid(cfg).schedules)
        except ConfigError:
            use = 0
        if train < 1 or use > 4 * train:
            out.append(f"the training set has {train} problems and a pilot draws {use} prompts: each is seen about "
                       f"{use / max(train, 1):.0f} times; add training problems")
    return out


def check_task(task: str) -> tuple[str, int | None]:
    """(a note on the task for the header, held-out problems of a local dataset or None); a
    dataset file that does not exist is an error."""
    note, held, _ = task_sizes(task)
    return note, held


def task_sizes(task: str) -> tuple[str, int | None, int | None]:
    """``check_task``, with the training problems too (None for a built-in or hub task)."""
    if not task.endswith(DATA_SUFFIXES):
        return f"task {task}", None, None
    if not os.path.isfile(task):
        raise ConfigError(f"task file {task!r} does not exist: expected a .jsonl / .parquet file with "
                          "prompt and answer fields, a built-in task or a Hugging Face dataset name")
    from race.tasks import load_task

    train, held = (len(load_task(task, split=s)) for s in ("train", "eval"))
    return f"task {task}: {train:,} training problems, {held:,} held out for evaluation", held, train


def expected_lengths(model: str, task: str, *, prompt_len: float | None = None, completion_len: float | None = None,
                     max_completion_len: int | None = None) -> tuple[float, float, int, str]:
    """(prompt tokens, completion tokens, cap on new tokens, a note saying where they came from) for
    ``race init``: each given value as it is; for a shipped tiny policy, its table entry and its
    prompts measured as the policy reads them (chat template included); else LLM_LENGTHS."""
    key = model.lower().rstrip("/")
    shipped = SHIPPED_COMPLETIONS.get(key)
    if shipped is None:
        return (LLM_LENGTHS[0] if prompt_len is None else prompt_len,
                LLM_LENGTHS[1] if completion_len is None else completion_len,
                LLM_LENGTHS[2] if max_completion_len is None else max_completion_len, "")
    told = []
    if prompt_len is None:
        from transformers import AutoTokenizer

        from race.flops.catalog import resolve_model_path
        from race.tasks.taskdata import policy_prompts, within_context
        from race.tasks import load_task

        cfg = config_from_dict({"model": model, "task": task, "budget": 1e12})
        tok = AutoTokenizer.from_pretrained(resolve_model_path(model))
        first = load_task(task, split="train")[:LENGTH_PROMPTS]
        problems = within_context(cfg, policy_prompts(cfg, first, tok), tok)[0]
        if problems:
            prompt_len = round(sum(len(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in problems)
                               / len(problems), 1)
            told.append(f"prompt measured on {len(problems)} training prompts")
        else:
            prompt_len = LLM_LENGTHS[0]
    if completion_len is None:
        completion_len = shipped[0]
        told.append(f"completion {completion_len:g}")
    if max_completion_len is None:
        max_completion_len = shipped[1]
        told.append(f"cap {max_completion_len}")
    note = f"Lengths: {model}'s own ({', '.join(told)})." if told else ""
    return float(prompt_len), float(completion_len), int(max_completion_len), note


def init_raw(*, model: str, task: str, full_run: float | str, reward: str = "sparse",
             reward_model: str | None = None, share: float = DEFAULT_SHARE,
             grid: Sequence[float] | str | None = None, seeds: int = 2, prompt_len: float = 256,
             completion_len: float = 512, max_completion_len: int = 1024, gpu_memory: str | None = None,
             lora_rank: int = 8, name: str | None = None, eval_prompts: int = EVAL_PROMPTS,
             allow_approximate: bool = False) -> dict[str, Any]:
    """The config mapping ``race init`` writes (see the module docstring for the sizing);
    ``eval_prompts``: held-out prompts per pilot evaluation (at most what the dataset holds);
    ``allow_approximate``: count a model type outside the architecture table anyway (warned)."""
    full = parse_flops(full_run, "full run budget")
    check_share(share, "share")
    rhos = parse_grid(grid) if grid is not None else DEFAULT_GRID
    tiny = model.startswith("race/")
    return {
        "name": name or f"{os.path.basename(model.rstrip('/')).lower()}-{_reward_label(reward)}",
        "model": model, "task": task, "reward": _reward_section(reward, reward_model),
        "budget": float(f"{share * full / (len(rhos) * seeds):.3g}"), "full_run_budget": full,
        "pilot_design": "fit", "pilot_share": share,
        "grid": list(rhos), "seeds": seeds,
        "lengths": {"prompt": prompt_len, "completion": completion_len},
        "lora": {"rank": lora_rank},
        "schedule": {"prompts_per_step": 8, "n_train": 8, "max_n_gen": 64, "max_mu": 8},
        "grpo": {"temperature": 1.0 if tiny else 0.6, "max_completion_len": max_completion_len},
        "learning_rate": {"ref": 1e-3 if tiny else 1e-5, "ref_batch": 64},
        "eval": {"prompts": eval_prompts, "samples": 4},
        "backend": "auto",
        **({"gpu_memory": gpu_memory} if gpu_memory else {}),
        **({"allow_approximate_flops": True} if allow_approximate else {}),
    }


def fit_memory(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the largest update micro-batch (whole prompt groups) whose planned peak fits
    ``gpu_memory``, trying gradient checkpointing only when no micro-batch fits without it;
    unchanged without ``gpu_memory``. When nothing fits, the planner's own error for the
    smallest setting is raised."""
    if not raw.get("gpu_memory"):
        _plan_or_hint(raw)
        return raw
    group = raw["schedule"]["n_train"]
    error: ConfigError | None = None
    for checkpointing in (False, True):
        for micro in (None, 8 * group, 4 * group, 2 * group, group):
            grpo = {**raw["grpo"], **({"micro_batch": micro} if micro else {}),
                    **({"grad_checkpointing": True} if checkpointing else {})}
            candidate = {**raw, "grpo": grpo}
            try:
                _plan_or_hint(candidate)
                return candidate
            except ConfigError as e:
                if "GPU memory" not in str(e):
                    if checkpointing:
                        raise ConfigError(f"{e} (with the gradient checkpointing that gpu_memory "
                                          f"{raw['gpu_memory']} needs, which adds recomputation to C_learning)") from None
                    raise
                error = e
    raise error


MIN_FIT_POINTS = 3        # fit_grid drops low-ρ points down to this many, never fewer


def _unfit(e: ConfigError) -> bool:
    """Whether a planning error is the budget being too small for a grid point's steps."""
    return "too small" in str(e) or "cannot be met" in str(e)


def _sized(raw: dict[str, Any], grid: list[float], share: float, full: float) -> dict[str, Any]:
    return {**raw, "grid": grid, "budget": float(f"{share * full / (len(grid) * raw['seeds']):.3g}")}


def fit_grid(raw: dict[str, Any], *, share: float) -> tuple[dict[str, Any], str]:
    """``raw`` planned as it is, or fitted to its budget: when some ρ point's steps do not fit a
    pilot's budget (its prompts cost more than the budget, or whole steps cannot meet it within the
    planner's tolerance), drop grid points from the low end (the most rollouts per prompt: the
    costliest steps), keeping at least MIN_FIT_POINTS, each pilot then getting a larger share. Returns
    (the config, a one-line note naming what changed and the smallest full run that keeps the
    grid whole); when nothing fits, a one-line error naming that full run."""
    try:
        return fit_memory(raw), ""
    except ConfigError as e:
        if not _unfit(e):
            raise
        first = e
    full = float(raw["full_run_budget"])
    whole = smallest_full_run(raw, share=share)
    keep = f"--full-run {whole:.2g} keeps all {len(raw['grid'])} points" if whole else ""
    grid = list(raw["grid"])
    while len(grid) > MIN_FIT_POINTS:
        grid = grid[1:]
        cand = _sized(raw, grid, share, full)
        try:
            fitted = fit_memory(cand)
        except ConfigError as e:
            if not _unfit(e):
                raise
            continue
        dropped = ", ".join(f"{r:g}" for r in raw["grid"][:len(raw["grid"]) - len(grid)])
        return fitted, (f"Fitted to the budget: ρ {dropped} dropped (their steps do not fit a pilot's "
                        f"{raw['budget']:.3g} FLOPs within the planner's 2% tolerance); {len(grid)} points × "
                        f"{raw['seeds']} seeds at {fitted['budget']:.3g} FLOPs each" + (f"; {keep}" if keep else ""))
    raise ConfigError(f"{first}; no grid of {MIN_FIT_POINTS} or more points fits this full run"
                      + (f": the smallest that fits is about --full-run {whole:.2g}" if whole else "")
                      + ", or raise --share")


def design_budget(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``raw`` with the budget per pilot ``race pilot`` will give it: its pilot design (``fit``) within its
    share of the full run, held-out evaluation counted (race.run.sizing, the function race pilot calls), and
    the design's one line. Refused in one line when the share buys no pilot."""
    import math

    from race.run.sizing import SizingError, size_pilots

    cfg = config_from_dict(raw)
    try:
        _, d = size_pilots(cfg, full_run=cfg.full_run_budget)
    except SizingError as e:
        raise ConfigError(f"{e}; raise --share or --full-run") from None
    from race.stats.pilotdesign import DesignPlan

    scale = 10 ** (math.floor(math.log10(d["budget"])) - 5)         # 6 digits, rounded down: never over the share
    plan = DesignPlan.from_dict(d)
    return {**raw, "budget": float(f"{math.floor(d['budget'] / scale) * scale:.6g}")}, plan.line()


def smallest_full_run(raw: dict[str, Any], *, share: float, steps: int = 40) -> float | None:
    """The smallest full run (×1.25 steps, up to 1.25^steps × the given one) whose pilots plan the
    whole grid; None when none up to there does."""
    full = float(raw["full_run_budget"])
    for k in range(1, steps + 1):
        f = float(f"{full * 1.25 ** k:.2g}")          # the value the message names is the one checked
        if f <= full:
            continue
        try:
            _plan_or_hint({**_sized(raw, list(raw["grid"]), share, f), "full_run_budget": f})
            return f
        except ConfigError as e:
            if not _unfit(e) and "GPU memory" not in str(e):
                raise
    return None


def _plan_or_hint(raw: dict[str, Any]) -> None:
    """Plan ``raw``; a budget too small for one step says which init settings raise it."""
    from race.flops.grid import plan_grid

    try:
        plan_grid(config_from_dict(raw))
    except ConfigError as e:
        if "too small" not in str(e):
            raise
        raise ConfigError(f"{e}; raise --share or --full-run, or use fewer grid points or seeds "
                          f"(now {len(raw['grid'])} × {raw['seeds']})") from None


def render_init(raw: dict[str, Any], *, share: float, task_note: str = "", design: str = "") -> str:
    """The YAML text: the arithmetic as comments, then the settings (each one ``race plan`` reads)."""
    from race.core.version import __version__
    from race.flops import formulas as F
    from race.stats.report import fmt_flops
    from race.stats.instability import stability_at
    from race.stats.drift import init_line
    from race.flops.grid import CostModel, lora_spec, plan_grid, policy_arch, reward_spec

    cfg = config_from_dict(raw)
    arch = policy_arch(cfg)
    plan = plan_grid(cfg, arch=arch)
    lora = lora_spec(cfg, arch)
    per_token = F.forward_flops_per_token(arch, cfg.prompt_len + cfg.completion_len / 2)
    on_policy = CostModel(cfg, arch, reward_spec(cfg), cfg.prompt_len, cfg.completion_len).cost(
        cfg.schedule.n_train, 1).per_prompt          # the planner's own cost of one on-policy prompt
    head = [
        f"RACE pilot grid for {cfg.model} · {cfg.task} · {cfg.reward.kind} reward (race init, RACE {__version__})",
        "",
        f"Sizing: pilots get {share:.0%} of the {fmt_flops(cfg.full_run_budget)}-FLOP full run, held-out evaluation "
        f"counted (race pilot sizes them the same way: pilot_design, pilot_share below):",
        f"  {design or f'{cfg.pilots} pilots × {fmt_flops(cfg.budget)} FLOPs'}",
        f"Model: {F.param_count(arch) / 1e6:,.1f} M parameters → {fmt_flops(per_token)} forward FLOPs per "
        f"token at mid-completion; LoRA r={cfg.lora.rank}: {F.lora_param_count(arch, lora) / 1e6:,.2f} M trainable.",
        f"One prompt, {cfg.schedule.n_train} rollouts, on-policy ({cfg.prompt_len:g} prompt + "
        f"{cfg.completion_len:g} completion tokens expected; calibration measures them):",
        f"  search {fmt_flops(on_policy.search)} + learning {fmt_flops(on_policy.learning)} + reward "
        f"{fmt_flops(on_policy.reward)} FLOPs → ρ = {on_policy.rho:.2f}",
        *task_note.splitlines(),
        "The plan (`race plan FILE` prints it in full, with estimated GPU memory):",
    ]
    for sch in plan.schedules:
        full_steps = int(cfg.full_run_budget // sch.flops_per_step.total)
        head.append(f"  ρ {sch.rho_target:.2f} (achieved {sch.rho:.3f}): {sch.prompts_per_step} prompts × "
                    f"{sch.n_gen} rollouts → {sch.n_train} trained, μ {sch.mu}: {sch.steps} steps a pilot, "
                    f"{full_steps:,} in the full run")
    head.append(f"  grid: {fmt_flops(plan.grid_flops)} FLOPs = {plan.grid_flops / cfg.full_run_budget:.1%} of the "
                "full run")
    head.append(init_line(cfg.budget, cfg.full_run_budget))
    head.append(stability_at(None, full_run_budget=cfg.full_run_budget, pilot_budget=cfg.budget, ran=False)["line"]
                .replace("stability at F", "Stability at F", 1))
    from race.flops.grid import learning_rate
    from race.stats.rate import full_run_rate

    bp = cfg.schedule.prompts_per_step
    head.append(full_run_rate(cfg.learning_rate, status="not tested", factor=cfg.full_run_budget / cfg.budget,
                              full_lr=learning_rate(cfg, bp * cfg.schedule.n_train))["line"]
                .replace("rate for F", "Rate for F", 1))
    head += [f"WARNING: {w}" for w in plan.warnings]
    return "\n".join(f"# {line}".rstrip() for line in head) + "\n" + _yaml(raw)


_COMMENTS = {
    "full_run_budget": "the run these pilots plan for",
    "pilot_design": "race pilot sizes the pilots within pilot_share of full_run_budget (grid: as written)",
    "budget": "FLOPs per pilot (race pilot recomputes it from pilot_design)",
    "grid": "ρ targets = C_learning / C_total",
    "lengths": "expected tokens: calibration replaces them with measured means",
    "temperature": "rollout sampling (0.6 as in the IsoCompute recipe; 1.0 for the tiny models)",
    "ref": "η at ref_batch sequences, scaled by √B (LoRA wants ~10× a full fine-tune's η)",
    "max_completion_len": "hard cap on new tokens per rollout",
    "backend": "auto: vLLM when installed and a GPU is present, else Transformers",
    "gpu_memory": "`race plan` refuses schedules estimated above it",
    "allow_approximate_flops": "the model type is outside RACE's architecture table: FLOPs are approximate",
    "micro_batch": "sequences per update forward/backward: the largest that fits gpu_memory",
    "grad_checkpointing": "needed to fit gpu_memory (its recomputation is counted in C_learning)",
}


def _yaml(raw: dict[str, Any]) -> str:
    """Block YAML of ``raw`` with the comments above; flow style for the grid."""
    import yaml

    out = []
    for key, value in raw.items():
        if isinstance(value, dict):
            out.append(f"{key}:" + (f"      # {_COMMENTS[key]}" if key in _COMMENTS else ""))
            for k, v in value.items():
                note = f"      # {_COMMENTS[k]}" if k in _COMMENTS else ""
                out.append(f"  {k}: {_scalar(yaml, v)}{note}")
        else:
            text = f"[{', '.join(f'{x:g}' for x in value)}]" if isinstance(value, list) else _scalar(yaml, value)
            out.append(f"{key}: {text}" + (f"      # {_COMMENTS[key]}" if key in _COMMENTS else ""))
    return "\n".join(out) + "\n"


def _scalar(yaml: Any, value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("\n...").strip()
