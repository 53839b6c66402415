"""Calibration before a grid: the base policy sampled on training prompts for its token lengths
and pass rate, the healthy recipe it selects, and the configured reward checked on those samples.

Invariants: it runs before any pilot and before the study is written; a reward that fails on more
than ``REWARD_FAIL_SHARE`` of the samples stops the grid here, in one line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from race.config.configfile import GridConfig
from race.engine.evaluation import close_reward
from race.engine.loading import load_rollout, seed_everything
from race.tasks.taskdata import answer_check, context_report, task_problems


# The healthy recipe of the IsoCompute playbook: KL + entropy losses on easy sets (base
# pass rate in [0.3, 0.6]), neither on hard sets (≤ 0.0625). The coefficients are RACE's
# choice (the playbook gives none); between the two bands the config stands.
HEALTHY_EASY = {"beta": 1e-3, "entropy_coef": 1e-3}


HEALTHY_HARD = {"beta": 0.0, "entropy_coef": 0.0}


@dataclass(frozen=True)
class Calibration:
    """Token lengths and pass rate of the base policy on training prompts."""

    prompt_len: float
    completion_len: float
    pass_rate: float
    samples: int
    seconds: float
    healthy: dict | None = None
    reward_check: dict | None = None     # the configured reward on these samples (rule / custom rewards)
    dropped: dict | None = None          # problems too long for the context (context_report)

    def to_dict(self) -> dict:
        return {"prompt_len": self.prompt_len, "completion_len": self.completion_len, "pass_rate": self.pass_rate,
                "samples": self.samples, "seconds": self.seconds, "healthy": self.healthy,
                "reward_check": self.reward_check, "dropped": self.dropped}

    def data_warning(self) -> str | None:
        """One line when prompts too long for the model's context were dropped."""
        d = self.dropped
        if not d:
            return None
        return (f"{d['count']} problem(s) of the task have prompts longer than the model's context allows "
                f"({d['limit']} tokens), and were dropped (first: row {d['first_row']})")

    def reward_warning(self) -> str | None:
        """One line when the configured reward gave every calibration sample the same score:
        GRPO would get no signal (a group whose rollouts all score alike has zero advantages)."""
        rc = self.reward_check
        if not rc or not rc["constant"]:
            return None
        ex = rc["example"]
        if rc.get("errors"):
            return (f"the reward failed on {rc['errors']} of {rc['samples']} calibration samples of the base policy "
                    f"(each scored 0: GRPO gets no signal from it); first: {rc.get('first_error')}")
        return (f"the reward gave {ex['reward']:g} to all {rc['samples']} calibration samples of the base policy: "
                f"GRPO gets no signal from a reward that never varies. Rewards see completions decoded with "
                f"special tokens, e.g. prompt {ex['prompt']!r} → completion {ex['completion']!r}, reference "
                f"{ex['reference']!r}; check the reward on such text")


# a reward that fails (raises, or gives no finite number within ±1e6) on more than this share of the
# calibration samples stops the grid before any pilot runs
REWARD_FAIL_SHARE = 0.5


def healthy_recipe(pass_rate: float) -> dict | None:
    if pass_rate <= 0.0625:
        return dict(HEALTHY_HARD)
    if 0.3 <= pass_rate <= 0.6:
        return dict(HEALTHY_EASY)
    return None


def calibrate(config: GridConfig, *, prompts: int = 64, samples: int = 4, seed: int = 0,
              device: str = "cpu") -> Calibration:
    """Sample the base policy on ``prompts`` training prompts to measure lengths and pass rate."""
    import torch

    t0 = time.perf_counter()
    seed_everything(seed)
    _, backend = load_rollout(config, device=device)
    problems = task_problems(config, backend.tok, split="train", n=prompts, seed=10_000 + seed)
    dropped = context_report(config, backend.tok)
    gen = torch.Generator(device=device).manual_seed(seed)
    batch = backend.generate([p.prompt for p in problems], n=samples, max_new_tokens=config.grpo.max_completion_len,
                             temperature=config.grpo.temperature, top_p=config.grpo.top_p, generator=gen)
    prompt_len = sum(map(len, batch.prompt_ids)) / len(problems)
    lens = [len(c) for grp in batch.completion_ids for c in grp]
    check = answer_check(config, problems)
    correct = [float(check(p.prompt, t, p.answer)) == 1.0 for p, grp in zip(problems, batch.texts) for t in grp]
    pass_rate = sum(correct) / len(correct)
    backend.close()
    rc = reward_check(config, problems, batch.texts)
    if rc and rc.get("errors", 0) > REWARD_FAIL_SHARE * rc["samples"]:
        from race.tasks.rewards.base import RewardError

        raise RewardError(f"the reward failed on {rc['errors']} of {rc['samples']} calibration samples of the base "
                          f"policy (more than {REWARD_FAIL_SHARE:.0%}; first: {str(rc.get('first_error'))[:200]}): "
                          "fix it before any pilot budget is spent")
    return Calibration(prompt_len, sum(lens) / len(lens), pass_rate, len(lens), time.perf_counter() - t0,
                       healthy_recipe(pass_rate) if config.grpo.healthy_recipe else None, rc, dropped)


def reward_check(config: GridConfig, problems: list, texts: list[list[str]]) -> dict | None:
    """The configured reward on the calibration samples: its mean, whether it was the same for
    all, and the first sample. None for model rewards (a PRM is loaded only in the pilots)."""
    if config.reward.kind in ("prm", "proxy-prm"):
        return None
    from race.tasks.rewards import build_reward, score_completions

    flat = [(p, t) for p, group in zip(problems, texts) for t in group]
    reward = build_reward(config)
    try:
        batch = score_completions(reward, [p.prompt for p, _ in flat], [t for _, t in flat],
                                  [p.answer for p, _ in flat])
    finally:
        close_reward(reward)
    p, t = flat[0]
    return {"mean": batch.mean, "constant": max(batch.scores) == min(batch.scores), "samples": len(flat),
            "errors": batch.errors, "first_error": batch.first_error, "example": {"prompt": p.prompt, "completion": t, "reference": p.answer,
                                                "reward": batch.scores[0]}}
