"""One pilot run: a real LoRA GRPO run of one grid point and one seed, to its FLOP budget.

``run_pilot`` is a pure function of (config, schedule, seed, calibrated lengths)
and returns a ``PilotResult``; ``race.run.processes`` runs each call in its own process.
FLOPs are metered from the tokens actually processed in every step (not from the
plan); the pilot stops when the next step would overshoot its budget by more than
half a step, so the spent FLOPs land within half a step of the budget. With
``eval.checkpoints`` it also evaluates held-out prompts at fractions of the budget
(``HeldOutCheckpoints``, race.stats.instability) with random streams of their own: training, and
so every number a pilot reports without checkpoints, stays bit-identical. Evaluation FLOPs
and seconds are recorded apart and never count towards the budget or ρ.

One engine per path: a pilot on the lean path (``race.engine.lean_engine.lockstep_supported``) steps through
race.engine.lean_engine's seed-axis engine as a group of one seed, the engine lockstep groups run on, so a
seed's numbers do not depend on whether it ran alone or in a group; any other model steps through
``PilotEngine``'s own HF + peft step. The loop state, scoring, packing and the final evaluation
are race.engine.loop's, shared by both.

What a pilot uses lives in modules of its own: race.engine.loading (the policy, the device, memory),
race.tasks.taskdata (problems as the policy reads them, the answer checker), race.engine.evaluation (held-out
evaluation and checkpoints), race.flops.meter (FLOPs of actual tokens), race.engine.calibration (before a grid).
"""
from __future__ import annotations

import time
from typing import Callable

from race.config.configfile import GridConfig
from race.engine.evaluation import HeldOutCheckpoints, close_reward
from race.engine.loading import load_rollout, seed_everything
from race.flops.meter import FlopMeter
from race.engine.loop import (PilotData, PilotLoop, StepRecord, check_sync, finish_pilot, lr_scheduler, pack_kept,
                            rollout_search, score_rollouts)
from race.core.records import FlopBreakdown, PilotResult, Schedule
from race.tasks.taskdata import answer_check, task_problems

ProgressFn = Callable[[int, float], None]       # (steps done, FLOPs spent)


class PilotEngine:
    """A LoRA GRPO run in the making: policy, optimizer, rollout backend, reward and meter.

    ``step(problems)`` runs one GRPO step (race.engine.grpo's docstring) and returns its metered
    FLOPs; ``wall`` accumulates seconds per phase. On the lean path the engine is
    ``race.engine.lean_engine.LockstepEngine`` with one seed (``group``), whose parts it exposes under the
    same names; otherwise it steps an HF + peft policy itself.
    """

    def __init__(self, config: GridConfig, schedule: Schedule, seed: int, *, device: str = "cpu"):
        import torch

        from race.flops.grid import lora_spec, policy_arch, reward_spec
        from race.engine.lean_engine import LockstepEngine, lockstep_supported
        from race.tasks.rewards import build_reward

        self.config, self.schedule, self.device = config, schedule, device
        self.check = None           # the task's answer checker for pass@k (run_pilot sets it: answer_check)
        self.group = None
        if lockstep_supported(config) is None:
            g = self.group = LockstepEngine(config, schedule, [seed], device=device)
            self.policy, self.backend, self.meter, self.reward_fn = g.policy, g.backend.view(seed, owner=True), \
                g.meter, g.reward_fn
            self.optimizer, self.lr_scheduler = g.optimizers[0], g.lr_schedulers[0]
            self.generator, self.wall = g.generators[0], g.walls[0]
            return
        self.wall = {"setup": 0.0, "rollout": 0.0, "reward": 0.0, "update": 0.0, "sync": 0.0, "eval": 0.0}
        t0 = time.perf_counter()
        seed_everything(seed)
        self.policy, self.backend = load_rollout(config, device=device, schedule=schedule)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        # fused AdamW: one kernel for all adapter tensors (the per-tensor loop costs ms per step)
        self.optimizer = torch.optim.AdamW(params, lr=schedule.learning_rate, weight_decay=0.0, fused=True)
        self.lr_scheduler = lr_scheduler(self.optimizer, config, schedule)
        g = config.grpo
        arch = policy_arch(config)
        self.meter = FlopMeter(arch, lora_spec(config, arch),
                               reward_spec(config), self.backend.sampling_uses_adapter, g.beta > 0,
                               g.grad_checkpointing)
        self.reward_fn = build_reward(config, device=device)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.wall["setup"] = time.perf_counter() - t0

    def step(self, problems) -> StepRecord:
        from race.engine import grpo

        if self.group is not None:
            return self.group.step([0], [problems])[0]
        s, g, backend, meter = self.schedule, self.config.grpo, self.backend, self.meter
        t = time.perf_counter()
        batch = backend.generate([p.prompt for p in problems], n=s.n_gen, max_new_tokens=g.max_completion_len,
                                 temperature=g.temperature, top_p=g.top_p, generator=self.generator)
        self.wall["rollout"] += time.perf_counter() - t
        search = rollout_search(meter, batch)

        t = time.perf_counter()
        rewards, reward_cost, scored = score_rollouts(self.reward_fn, meter, problems, batch, s.n_gen)
        self.wall["reward"] += time.perf_counter() - t

        t = time.perf_counter()
        backend.pause()          # vLLM with sleep mode frees its weights and KV cache for the update
        packed, group, sample_lp = pack_kept(batch, rewards, n_train=s.n_train, advantage=g.advantage,
                                             pad_id=backend.pad_id, device=self.device)
        stats = grpo.update(self.policy, self.optimizer, packed, mu=s.mu, temperature=g.temperature,
                            clip_eps=g.clip_eps, clip_eps_high=g.clip_eps_high, loss_agg=g.loss_agg,
                            max_completion_len=g.max_completion_len,
                            beta=g.beta, entropy_coef=g.entropy_coef, micro_batch=g.micro_batch,
                            lr_scheduler=self.lr_scheduler, sample_logprobs=sample_lp)
        learning = meter.learning(packed.prompt_lens, packed.completion_lens, group, s.mu, shared_prefix=False)
        self.wall["update"] += time.perf_counter() - t

        t = time.perf_counter()
        backend.resume()
        search += backend.sync()
        self.wall["sync"] += time.perf_counter() - t
        check_sync(stats.sync, backend.name)
        return StepRecord(FlopBreakdown(search, learning, reward_cost), scored.mean, scored.errors, scored.first_error,
                          stats.sync)


def run_pilot(config: GridConfig, schedule: Schedule, seed: int, *, device: str = "cpu",
              progress: ProgressFn | None = None) -> PilotResult:
    """Run one pilot to its budget and evaluate it (see the module docstring)."""
    engine = PilotEngine(config, schedule, seed, device=device)
    tok = engine.backend.tok
    data = PilotData.load(config, tok, device=device)
    train = task_problems(config, tok, split="train", seed=seed)
    engine.check = answer_check(config, data.evals)
    loop = PilotLoop(config, schedule, seed, train)
    checkpoints = HeldOutCheckpoints(engine, data.evals, data.targets, seed)
    if checkpoints.on:
        checkpoints.run(0.0, 0, loop.spent)                  # the base policy: the curve's start
    while loop.wants_step():
        loop.record(engine.step(loop.next_problems()))
        fraction = checkpoints.due(loop.spent.total)
        if fraction is not None and loop.wants_step():      # not the last step
            checkpoints.run(fraction, loop.steps, loop.spent)
        if progress:
            progress(loop.steps, loop.spent.total)
    result = finish_pilot(engine, engine.backend, data, loop, checkpoints, seed, wall=engine.wall, device=device)
    engine.backend.close()
    close_reward(engine.reward_fn)
    return result
