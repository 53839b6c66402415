"""A task's problems as the policy reads them: the chat template, the context limit, the
downstream held-out sets, and the answer checker pass@k uses.

Invariants: the same problems in the same order for every pilot and for calibration (dropping
over-long prompts is deterministic); a prompt already in the chat template is left as it is.
"""
from __future__ import annotations

from race.config.configfile import GridConfig


def policy_prompts(config: GridConfig, problems: list, tok) -> list:
    """The problems as the policy reads them: each prompt a user turn of the tokenizer's chat
    template (with ``config.system_prompt``), when ``config.chat_template`` is ``on``, or ``auto``
    and the tokenizer has a template and the prompt holds none of its special tokens (a prompt
    already in the template is left as it is); unchanged otherwise. The prompt before the template
    is kept in ``meta["raw_prompt"]``."""
    from race.core.errors import ConfigError
    from race.tasks import apply_chat_template

    mode = config.chat_template
    has = bool(getattr(tok, "chat_template", None))
    if mode == "on" and not has:
        raise ConfigError(f"chat_template 'on' but the tokenizer of {config.model!r} has no chat template: "
                          "expected 'auto' or 'off' for this model")
    if mode == "off" or not has:
        return list(problems)
    specials = [t for t in getattr(tok, "all_special_tokens", []) if len(t) > 1]
    plain = [mode == "on" or not any(t in p.prompt for t in specials) for p in problems]
    wrapped = iter(apply_chat_template([p for p, w in zip(problems, plain) if w], tok, system=config.system_prompt))
    return [next(wrapped) if w else p for p, w in zip(problems, plain)]


def task_problems(config: GridConfig, tok, *, split: str, n: int | None = None, seed: int = 0) -> list:
    """One split of ``config.task`` as the policy reads it (``policy_prompts``), without the
    problems too long for its context (``within_context``)."""
    from race.tasks import load_task

    problems = policy_prompts(config, load_task(config.task, split=split, n=n, seed=seed), tok)
    return within_context(config, problems, tok)[0]


def downstream_sets(config: GridConfig, tok) -> dict:
    """``eval.tasks`` loaded: label → (EvalTask, problems as the policy reads them). A built-in
    task gives its held-out split; a file or HF dataset every row (none is trained on). The first
    ``prompts`` (default ``eval.prompts``) rows that fit the context are evaluated."""
    from race.core.errors import ConfigError
    from race.tasks import TaskError, load_heldout_set

    out = {}
    for task in config.eval.tasks:
        try:
            rows = load_heldout_set(task.path)
        except TaskError as e:
            raise ConfigError(f"eval.tasks {task.label!r}: {e}") from None
        need, kept = task.prompts or config.eval.prompts, []
        for i in range(0, len(rows), need):      # template and measure only as many rows as it takes
            kept += within_context(config, policy_prompts(config, rows[i:i + need], tok), tok)[0]
            if len(kept) >= need:
                break
        if not kept:
            raise ConfigError(f"eval.tasks {task.label!r} ({task.path}) has no problem that fits the policy's context")
        out[task.label] = (task, kept[:need])
    return out


def answer_check_name(config: GridConfig, problems: list) -> str:
    """Which answer checker pass@k uses (``eval.checker``): ``exact`` (the text before EOS equals the
    reference) or ``math`` (the final answer — ``\\boxed{}``, ``#### N``, "the answer is N" —
    equivalent to the reference by math-verify: race.tasks.rewards.answers). ``auto`` picks ``math`` when
    the reward checks answers that way (``math``, ``format`` or a ``mix`` holding one:
    race.tasks.rewards.answers.checker_for) or the problems come from a reasoning dataset (GSM8K or MATH
    rows, ``meta["format"]``), else ``exact``."""
    from race.tasks.rewards.answers import checker_for

    if config.eval.checker != "auto":
        return config.eval.checker
    if checker_for(config.reward.kind, config.reward.mix) == "math":
        return "math"
    if any((p.meta or {}).get("format") in ("gsm8k", "math") for p in problems[:1]):
        return "math"
    return "exact"


def answer_check(config: GridConfig, problems: list):
    """The checker ``answer_check_name`` names, ``fn(prompt, completion, reference) -> bool``, with
    ``reward.check_timeout`` per math check."""
    from race.tasks.rewards.answers import answer_checker

    return answer_checker(answer_check_name(config, problems), timeout=config.reward.check_timeout)


def context_tokens(config: GridConfig) -> int | None:
    """The longest prompt that leaves the policy's context room for one new token (None when its
    config states no ``max_position_embeddings``). ``grpo.max_completion_len`` is a cap that
    generation rarely reaches, so it does not shorten this."""
    from race.flops.catalog import load_hf_config

    cfg = load_hf_config(config.model)
    ctx = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return int(ctx) - 1 if ctx else None


def within_context(config: GridConfig, problems: list, tok) -> tuple[list, list]:
    """(problems whose prompt fits ``context_tokens``, those dropped); deterministic, so every
    pilot and calibration drop the same ones."""
    from race.tasks.datasets import drop_overlong

    limit = context_tokens(config)
    if limit is None:
        return problems, []
    lengths = [len(tok(p.prompt, add_special_tokens=False, verbose=False)["input_ids"]) for p in problems]
    return drop_overlong(problems, lengths, limit)


def context_report(config: GridConfig, tok) -> dict | None:
    """How many problems of the task (both splits) are too long for the context, and the first one."""
    from race.tasks import load_task

    dropped = []
    for split in ("train", "eval"):
        dropped += within_context(config, policy_prompts(config, load_task(config.task, split=split), tok), tok)[1]
    if not dropped:
        return None
    first = min(dropped, key=lambda p: p.id)
    return {"count": len(dropped), "first_row": first.id + 1, "limit": context_tokens(config)}


def check_vocabulary(config: GridConfig, tok, rows: int) -> None:
    """Every prompt of the task, as the policy reads it (both splits), tokenizes to ids below ``rows``,
    the model's embedding rows. Only a tokenizer longer than the model can fail: the shipped tiny
    arithmetic policies carry a newline token one past their 23 rows (verl's rollout set-up asks for
    one), which their prompts never hold. A prompt that holds a token past the rows is refused in one
    line (``ConfigError``) naming the row, the token and what was expected, before any compute."""
    from race.core.errors import ConfigError
    from race.tasks import load_task

    if len(tok) <= rows:
        return
    beyond = {i: getattr(t, "content", str(t)) for i, t in getattr(tok, "added_tokens_decoder", {}).items() if i >= rows}
    added_only = len(beyond) == len(tok) - rows        # every id past the rows is an added token: a substring test

    def outside(prompt: str) -> str | None:
        if added_only:
            return next((s for s in beyond.values() if s and s in prompt), None)
        ids = tok(prompt, add_special_tokens=False, verbose=False)["input_ids"]
        return next((tok.convert_ids_to_tokens(i) for i in ids if i >= rows), None)

    for split in ("train", "eval"):
        for p in policy_prompts(config, load_task(config.task, split=split), tok):
            token = outside(p.prompt)
            if token is not None:
                raise ConfigError(f"task {config.task!r} ({split} row {p.id + 1}): its prompt holds the token "
                                  f"{token!r}, which {config.model!r} has no embedding for ({rows} rows): expected "
                                  "prompts in the model's vocabulary (remove the character, or use another model)")
