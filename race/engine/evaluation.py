"""Held-out evaluation of a policy: ``evaluate`` / ``evaluate_with_cost`` (per-prompt targets:
reward, pass@1, best@k, worst@k, judges), the checkpoints during a pilot (``HeldOutCheckpoints``;
the schedule is race.config.checkpoints', the instability rule race.stats.instability's), judge models, and closing a reward.

Invariants: every evaluation samples from a generator of its own, so training is untouched;
evaluation FLOPs are returned apart and never count towards a pilot's budget or ρ.
"""
from __future__ import annotations

import time
from typing import Any

from race.config.configfile import GridConfig
from race.flops.meter import FlopMeter
from race.core.records import Checkpoint, FlopBreakdown


def evaluate(backend, problems, reward_fn, *, samples: int, temperature: float, max_new_tokens: int,
             seed: int, batch_prompts: int = 256, judges: dict | None = None,
             check=None) -> dict[str, tuple[float, ...]]:
    """Per-prompt targets on held-out problems, ``samples`` samples each.

    ``reward``: mean native reward; ``pass@1``: fraction of samples right by ``check``
    (``fn(prompt, completion, reference)``, the task's answer checker: ``answer_check``; default
    exact match of the text before EOS);
    ``best@k``: 1 if any sample is right; ``worst@k``: 1 if all are. ``judges`` adds
    one target per entry, ``name → fn(prompt, completion, reference)``, averaged over the
    samples (the step task's ``process`` and ``final-answer``: ``race.tasks.judges``), or a
    judge model with ``score_batch`` (``eval.judge_model``: ``model_judges``), one batched
    call per chunk. Samples come from a generator seeded with ``10_007 + seed``.
    """
    import torch

    gen = torch.Generator(device=backend.device).manual_seed(10_007 + seed)
    return evaluate_with_cost(backend, problems, reward_fn, samples=samples, temperature=temperature,
                              max_new_tokens=max_new_tokens, generator=gen, batch_prompts=batch_prompts,
                              judges=judges, check=check)[0]


def evaluate_with_cost(backend, problems, reward_fn, *, samples: int, temperature: float, max_new_tokens: int,
                       generator, batch_prompts: int = 256, judges: dict | None = None,
                       meter: FlopMeter | None = None, errors: dict | None = None,
                       check=None) -> tuple[dict[str, tuple[float, ...]], FlopBreakdown]:
    """``evaluate`` with the sampling generator given, and what the evaluation cost in FLOPs (with
    ``meter``: the rollouts' search FLOPs by the meter's formulas, as a step's; the reward and
    judge models' FLOPs as ``reward``; zero without a meter). ``errors``, when given, collects per
    target the samples whose reward or judge failed: ``{target: {"count": n, "first": message}}``.
    ``reward_fn=None`` scores the answers only (``pass@1``, ``best@k``, ``worst@k``: a downstream set)."""
    from race.tasks.rewards import score_completions
    from race.tasks.rewards.rules import sparse

    check = check or sparse
    judges = judges or {}
    cost = FlopBreakdown()
    out: dict[str, list[float]] = {**({"reward": []} if reward_fn is not None else {}), "pass@1": [],
                                   f"best@{samples}": [], f"worst@{samples}": [], **{name: [] for name in judges}}
    for start in range(0, len(problems), batch_prompts):
        chunk = problems[start:start + batch_prompts]
        batch = backend.generate([p.prompt for p in chunk], n=samples, max_new_tokens=max_new_tokens,
                                 temperature=temperature, generator=generator)
        # one scoring call per chunk: a model-based reward (or judge) batches its forwards
        flat = ([p.prompt for p in chunk for _ in range(samples)], [t for texts in batch.texts for t in texts],
                [p.answer for p in chunk for _ in range(samples)])
        scored = score_completions(reward_fn, *flat) if reward_fn is not None else None
        judged = {name: judge.score_batch(*flat) for name, judge in judges.items() if hasattr(judge, "score_batch")}
        if errors is not None:
            for name, got in ((("reward", scored),) if scored is not None else ()) + tuple(judged.items()):
                if got.errors:
                    e = errors.setdefault(name, {"count": 0, "first": got.first_error})
                    e["count"] += got.errors
        if meter is not None:
            lengths = [(len(p), len(c)) for p, grp in zip(batch.prompt_ids, batch.completion_ids) for c in grp]
            feedback = (0.0 if scored is None else scored.flops if hasattr(reward_fn, "score_batch")
                        else meter.reward_flops(lengths))
            cost = cost + FlopBreakdown(meter.search([len(p) for p in batch.prompt_ids],
                                                     [[len(c) for c in grp] for grp in batch.completion_ids]),
                                        0.0, feedback + sum(j.flops for j in judged.values()))
        for k, (prob, texts) in enumerate(zip(chunk, batch.texts)):
            correct = [float(check(prob.prompt, t, prob.answer)) == 1.0 for t in texts]
            if scored is not None:
                out["reward"].append(sum(scored.scores[k * samples:(k + 1) * samples]) / samples)
            out["pass@1"].append(sum(correct) / samples)
            out[f"best@{samples}"].append(float(any(correct)))
            out[f"worst@{samples}"].append(float(all(correct)))
            for name, judge in judges.items():
                values = (judged[name].scores[k * samples:(k + 1) * samples] if name in judged
                          else [judge(prob.prompt, t, prob.answer) for t in texts])
                out[name].append(sum(values) / samples)
    return {k: tuple(v) for k, v in out.items()}, cost


class HeldOutCheckpoints:
    """Held-out evaluations during a pilot (race.config.checkpoints has the schedule, race.stats.instability the rule).

    ``due(spent)`` says whether the FLOPs spent have reached the next budget fraction (and skips
    every fraction they passed: one evaluation for all); ``run(...)`` evaluates the policy as it
    is on the checkpoint prompts with the checkpoint's own generator, so the training
    generator, the policy and the optimizer are untouched (``tests/test_checkpoints.py``
    checks that a pilot is bit-identical with and without checkpoints).
    """

    def __init__(self, engine: Any, problems: list, judges: dict, seed: int):   # a race.engine.seed_axis.SeedAxisEngine view
        from race.config.checkpoints import checkpoint_fractions, checkpoint_prompts, checkpoints_on

        e = engine.config.eval
        self.engine, self.judges, self.seed = engine, judges, seed
        self.on = checkpoints_on(e.checkpoints)
        self.fractions = checkpoint_fractions(e.checkpoints) if self.on else ()
        self.problems = problems[:checkpoint_prompts(len(problems), e.checkpoint_prompts)]
        self.records: list[Checkpoint] = []
        self._next = 0

    def due(self, spent: float) -> float | None:
        budget, hit = self.engine.config.budget, None
        while self._next < len(self.fractions) and spent >= self.fractions[self._next] * budget:
            hit, self._next = self.fractions[self._next], self._next + 1
        return hit

    def run(self, fraction: float, step: int, spent: FlopBreakdown) -> None:
        import torch

        from race.config.checkpoints import checkpoint_seed

        eng, e = self.engine, self.engine.config.eval
        t = time.perf_counter()
        gen = torch.Generator(device=eng.backend.device).manual_seed(checkpoint_seed(self.seed, len(self.records)))
        scores, cost = evaluate_with_cost(eng.backend, self.problems, eng.reward_fn, samples=e.samples,
                                          temperature=e.temperature, max_new_tokens=eng.config.grpo.max_completion_len,
                                          generator=gen, judges=self.judges, meter=eng.meter, check=eng.check)
        seconds = time.perf_counter() - t
        self.records.append(Checkpoint(fraction, step, spent, scores, cost, seconds))

    def state(self) -> dict:
        """The records so far and the next fraction due, as plain values (a pilot's state file:
        race.engine.continuation); ``load_state`` puts them back."""
        return {"records": [c.to_dict() for c in self.records], "next": self._next}

    def load_state(self, state: dict) -> None:
        self.records, self._next = [Checkpoint.from_dict(c) for c in state["records"]], int(state["next"])

    def end(self, step: int, spent: FlopBreakdown, final: dict[str, tuple[float, ...]]) -> tuple[Checkpoint, ...]:
        """The records, closed by the end checkpoint: the final evaluation on the checkpoint prompts."""
        if not self.on:
            return ()
        k = len(self.problems)
        return tuple(self.records) + (Checkpoint(1.0, step, spent, {t: v[:k] for t, v in final.items()}),)


def model_judges(config: GridConfig, *, device: str = "cpu") -> dict:
    """``{"judge": model}`` when ``eval.judge_model`` names a judge model: any model the PRM
    loader reads (race.tasks.rewards.prm: step classification as Qwen2.5-Math-PRM, a value head, or
    a sequence classifier scoring the whole completion — an outcome judge), its step scores
    aggregated by ``eval.judge_aggregation``; it scores the evaluation samples only, so its
    FLOPs are not part of the pilot's budget. Empty without one."""
    if not config.eval.judge_model:
        return {}
    from race.flops.catalog import check_loadable
    from race.tasks.rewards.prm import ProcessRewardModel, default_step_separator

    check_loadable(config.eval.judge_model, "eval.judge_model")

    sep = config.reward.step_separator or default_step_separator(config.task)
    return {"judge": ProcessRewardModel(config.eval.judge_model, aggregation=config.eval.judge_aggregation,
                                        step_separator=sep, trust_remote_code=config.eval.judge_trust_remote_code,
                                        device=device, batch_size=config.reward.batch_size,
                                        trust_setting="eval.judge_trust_remote_code")}


def close_reward(reward) -> None:
    """Stop a reward's own process (custom rewards: race.tasks.rewards.isolated); others have none."""
    from race.tasks.rewards.isolated import IsolatedReward

    if isinstance(reward, IsolatedReward):
        reward.close()
