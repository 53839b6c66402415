"""Rewards: the feedback a pilot trains on, and what it costs.

A reward function maps ``(prompt, completion, reference)`` to a float (``RewardFn``).
``get_reward`` normalises what users pass (a built-in name, a ``"module:function"``
string, or a callable); ``score_completions`` scores a batch without ever letting a
faulty reward kill a pilot, and reports the batch's CPU time and FLOPs (0 for the
rule-based rewards here; model-based rewards — process reward models, ``race.tasks.rewards.prm`` —
score a batch at once through their ``score_batch`` and count the tokens they read).
``build_reward`` builds the reward a config names. The rules: ``sparse``, ``structured``,
``dense`` (exact answers, ``race.tasks.rewards.rules``), ``math`` and ``format`` (final answers of
worked solutions, ``race.tasks.rewards.answers``), and ``mix``, their weighted sum (``race.tasks.rewards.mix``).

No torch here: model-based rewards import it when they are built.
"""
from __future__ import annotations

import math
import time
from typing import Sequence, Union

from race.tasks.rewards.answers import (CHECK_TIMEOUT, answer_checker, answer_format, answers_equal, check_stats,
                                  checker_for, extract_answer, math_answer)
from race.tasks.rewards.base import REWARDS, RewardBatch, RewardError, RewardFn, get_reward, score_each
from race.tasks.rewards.mix import RULE_REWARDS, mix_reward, rule_reward
from race.tasks.rewards.rules import EOS_MARKERS, dense, final_answer, sparse, structured, well_formed

__all__ = [
    "CHECK_TIMEOUT", "EOS_MARKERS", "REWARDS", "RULE_REWARDS", "RewardBatch", "RewardError", "RewardFn",
    "answer_checker", "answer_format", "answers_equal", "build_reward", "check_stats", "checker_for", "dense",
    "extract_answer", "final_answer", "get_reward", "math_answer", "mix_reward", "rule_reward",
    "score_completions", "score_each", "sparse", "structured", "well_formed",
]


def score_completions(fn: Union[str, RewardFn], prompts: Sequence[str], completions: Sequence[str],
                      references: Sequence[str]) -> RewardBatch:
    """Score ``completions[i]`` for ``prompts[i]`` against ``references[i]``.

    A sample whose reward raises an ``Exception`` or returns something that is not a
    finite number scores 0.0 and is counted in ``errors``; the batch goes on.
    """
    reward = get_reward(fn)
    if not len(prompts) == len(completions) == len(references):
        raise RewardError(f"prompts ({len(prompts)}), completions ({len(completions)}) and references "
                          f"({len(references)}) must have the same length")
    if hasattr(reward, "score_batch"):      # a model-based or isolated reward: one batched call
        return _score_batched(reward, prompts, completions, references)
    return score_each(reward, prompts, completions, references)


def _score_batched(reward, prompts, completions, references) -> RewardBatch:
    """``reward.score_batch``; if it raises, the whole batch scores 0 and counts as errors."""
    from race.tasks.rewards.isolated import RewardFailed

    start = time.process_time()
    try:
        batch = reward.score_batch(prompts, completions, references)
    except RewardFailed:                    # a custom reward that hung or exited: the pilot stops, in one line
        raise
    except Exception as e:  # a reward must never kill a pilot
        return RewardBatch(scores=[0.0] * len(prompts), errors=len(prompts),
                           cpu_seconds=time.process_time() - start, first_error=f"{type(e).__name__}: {e}")
    bad = [i for i, v in enumerate(batch.scores) if not math.isfinite(v)]
    if not bad:
        return batch
    scores = [0.0 if i in set(bad) else v for i, v in enumerate(batch.scores)]
    return RewardBatch(scores=scores, errors=batch.errors + len(bad), cpu_seconds=batch.cpu_seconds,
                       flops=batch.flops, first_error=batch.first_error or f"ValueError: non-finite reward "
                       f"{batch.scores[bad[0]]}")


def build_reward(config, *, device: str = "cpu") -> RewardFn:
    """The reward a ``GridConfig`` names: a rule (``math`` and ``format`` with ``reward.check_timeout``
    seconds a check), a weighted ``mix`` of rules (``reward.mix``: ``race.tasks.rewards.mix``), a custom
    function (run in a child process with ``reward.timeout`` per batch: ``race.tasks.rewards.isolated``;
    ``close()`` it when done), or a PRM (kinds ``prm``, ``proxy-prm``: ``race.tasks.rewards.prm``, loaded on
    ``device``)."""
    kind = config.reward.kind
    check_timeout = getattr(config.reward, "check_timeout", CHECK_TIMEOUT)
    if kind == "mix":
        return mix_reward(config.reward.mix or {}, check_timeout=check_timeout)
    if kind in RULE_REWARDS:
        return rule_reward(kind, check_timeout=check_timeout)
    if kind in ("prm", "proxy-prm"):
        from race.tasks.rewards.prm import build_prm

        return build_prm(config.reward, task=config.task, device=device)
    if kind == "custom":        # untrusted code: its own process, a time limit per batch (race.tasks.rewards.isolated)
        from race.tasks.rewards.isolated import IsolatedReward

        return IsolatedReward(config.reward.function, timeout=config.reward.timeout).start()
    return get_reward(kind)
