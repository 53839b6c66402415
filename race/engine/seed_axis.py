"""The pilot engine: the pilots ``(schedule, seed)`` of one grid point's seeds, stepped as one seed axis.

``SeedAxisEngine(config, schedule, seeds)`` holds the policy, its rollout backend as a group of the
seeds (``generate_seeds``, ``sync(seeds)``, ``view(seed)``), the shared reward and FLOP meter, and
per seed an AdamW, a learning-rate schedule, a sampling generator and its seconds per phase.
``step(active, problems)`` runs one GRPO step (race.engine.grpo's docstring) for the seeds at indices
``active``: one rollout batch, one reward call per seed, one update over the seed axis
(``grpo.update_seeds``), one sync. A solo pilot is a seed axis of length 1: one engine and one step
for every pilot, so a seed's numbers do not depend on whether it ran alone or in a group
(tests/test_lockstep.py checks a group's seed against the one-seed pilot bit for bit).

The policy is the engine's one parameter (``policy_for``): ``LeanPolicy`` (race.engine.backends.lockstep's
``LockstepLM``: one adapter per seed, any number of seeds, sampled by the lean sampler, vLLM's
multi-LoRA or, for one seed, the single-adapter vLLM backend with its sleep mode) where the lean path
runs (race.engine.lean_engine.lockstep_supported), else ``PeftPolicy`` (an HF model with a peft
adapter, one seed; its backend as a group of one, race.engine.backends.lockstep.OneSeedGroup).

Invariants: shared step phases (rollout, reward, update, sync) are timed once and charged to the
active seeds in equal shares, so a pilot's ``wall_seconds`` stays its own cost and sums over a grid
stay right; per seed its own optimizer, schedule, generator, sync check and FLOPs; a sync gap above
race.engine.loop.SYNC_FAIL stops the step (``SyncFailed``, naming the seed in a group).
"""
from __future__ import annotations

import time
from types import SimpleNamespace

from race.config.configfile import GridConfig
from race.core.records import FlopBreakdown, Schedule
from race.engine.evaluation import close_reward
from race.engine.lean_engine import lockstep_supported
from race.engine.loading import group_backend, load_policy, load_rollout, seed_everything
from race.engine.loop import StepRecord, check_sync, lr_scheduler, pack_kept, rollout_search, score_rollouts
from race.flops.meter import FlopMeter


class LeanPolicy:
    """The lean path's policy (``LockstepLM``, one adapter per seed) and its group backend; the
    update runs every active seed's batch in one forward/backward over the seed axis."""

    name, shared_prefix = "lean", True

    def __init__(self, config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str):
        tok, self.model, path = load_policy(config, device=device, seeds=seeds)
        self.backend = group_backend(config, self.model, tok, path, device=device, schedule=schedule)

    def parameters_of(self, seed: int) -> list:
        return self.model.parameters_of(seed)

    def update(self, seeds: list[int], optimizers: list, packs, **kw) -> list:
        from race.engine import grpo

        self.model.set_active(seeds)
        return grpo.update_seeds(self.model, optimizers, packs, **kw)


class PeftPolicy:
    """An HF model with a peft adapter (what the lean path cannot run), one seed; its rollout backend
    as a group of that seed; the update is ``grpo.update_seeds`` without a seed axis."""

    name, shared_prefix = "peft", False

    def __init__(self, config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str):
        from race.engine.backends.lockstep import OneSeedGroup

        if len(seeds) != 1:
            raise ValueError(f"the peft policy runs one seed, not {len(seeds)} (the lean path groups seeds)")
        self.model, backend = load_rollout(config, device=device, schedule=schedule, seed=seeds[0])
        self.backend = OneSeedGroup(backend, seeds[0])

    def parameters_of(self, seed: int) -> list:   # noqa: ARG002 — one seed: the adapter's tensors
        return [p for p in self.model.parameters() if p.requires_grad]

    def update(self, seeds: list[int], optimizers: list, packs, **kw) -> list:   # noqa: ARG002
        from race.engine import grpo

        return grpo.update_seeds(self.model, optimizers, packs, seed_axis=False, **kw)


def policy_for(config: GridConfig) -> type:
    """The engine's policy for ``config``: ``LeanPolicy`` where the lean path runs, else ``PeftPolicy``."""
    return LeanPolicy if lockstep_supported(config) is None else PeftPolicy


class SeedAxisEngine:
    """The policy with one adapter per seed, its rollout backend, the shared reward and FLOP meter,
    and per seed an optimizer, a learning-rate schedule and a sampling generator (module docstring)."""

    def __init__(self, config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str = "cpu"):
        import torch

        from race.flops.grid import lora_spec, policy_arch, reward_spec
        from race.tasks.rewards import build_reward

        self.config, self.schedule, self.seeds, self.device = config, schedule, list(seeds), device
        t0 = time.perf_counter()
        seed_everything(self.seeds[0])
        self.trainer = policy_for(config)(config, schedule, self.seeds, device=device)
        self.policy, self.backend = self.trainer.model, self.trainer.backend
        # fused AdamW: one kernel for all of a seed's adapter tensors (the per-tensor loop costs ms per step)
        self.optimizers = [torch.optim.AdamW(self.trainer.parameters_of(s), lr=schedule.learning_rate,
                                             weight_decay=0.0, fused=True) for s in self.seeds]
        self.lr_schedulers = [lr_scheduler(o, config, schedule) for o in self.optimizers]
        g, arch = config.grpo, policy_arch(config)
        self.meter = FlopMeter(arch, lora_spec(config, arch), reward_spec(config), self.backend.sampling_uses_adapter,
                               g.beta > 0, g.grad_checkpointing)
        self.reward_fn = build_reward(config, device=device)
        self.check = None           # the task's answer checker for pass@k (the pilot loop sets it)
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in self.seeds]
        setup = time.perf_counter() - t0
        self.walls = [{"setup": setup / len(self.seeds), "rollout": 0.0, "reward": 0.0, "update": 0.0,
                       "sync": 0.0, "eval": 0.0} for _ in self.seeds]

    def view(self, seed: int) -> SimpleNamespace:
        """Seed ``seed`` as a one-pilot engine (``config``, ``backend``, ``reward_fn``, ``meter``,
        ``check``): what held-out checkpoints and the final evaluation read."""
        return SimpleNamespace(config=self.config, backend=self.backend.view(seed), reward_fn=self.reward_fn,
                               meter=self.meter, check=self.check)

    def close(self) -> None:
        """Free the rollout backend and a reward's process."""
        self.backend.close()
        close_reward(self.reward_fn)

    def _charge(self, active: list[int], phase: str, seconds: float) -> None:
        for k in active:
            self.walls[k][phase] += seconds / len(active)

    def step(self, active: list[int], problems: list[list]) -> list[StepRecord]:
        """One GRPO step for the seeds at indices ``active``, seed ``active[i]`` on ``problems[i]``;
        returns each one's ``StepRecord``."""
        s, g, backend, meter = self.schedule, self.config.grpo, self.backend, self.meter
        seeds = [self.seeds[k] for k in active]
        t = time.perf_counter()
        batches = backend.generate_seeds(seeds, [[p.prompt for p in ps] for ps in problems], n=s.n_gen,
                                         max_new_tokens=g.max_completion_len, temperature=g.temperature,
                                         top_p=g.top_p, generators=[self.generators[k] for k in active])
        self._charge(active, "rollout", time.perf_counter() - t)
        searches = [rollout_search(meter, b) for b in batches]
        t = time.perf_counter()
        scored_all = [score_rollouts(self.reward_fn, meter, ps, b, s.n_gen) for ps, b in zip(problems, batches)]
        self._charge(active, "reward", time.perf_counter() - t)

        t = time.perf_counter()
        backend.pause()          # vLLM with sleep mode frees its weights and KV cache for the update
        packs, groups, sample_lps = zip(*(pack_kept(b, r, n_train=s.n_train, advantage=g.advantage,
                                                    pad_id=backend.pad_id, device=self.device)
                                          for b, (r, _, _) in zip(batches, scored_all)))
        stats = self.trainer.update(seeds, [self.optimizers[k] for k in active], packs, mu=s.mu,
                                    temperature=g.temperature, clip_eps=g.clip_eps, clip_eps_high=g.clip_eps_high,
                                    loss_agg=g.loss_agg, max_completion_len=g.max_completion_len, beta=g.beta,
                                    entropy_coef=g.entropy_coef, micro_batch=g.micro_batch,
                                    lr_schedulers=[self.lr_schedulers[k] for k in active], pad_id=backend.pad_id,
                                    sample_logprobs=sample_lps)
        learnings = [meter.learning(p.prompt_lens, p.completion_lens, grp, s.mu, shared_prefix=self.trainer.shared_prefix)
                     for p, grp in zip(packs, groups)]
        self._charge(active, "update", time.perf_counter() - t)

        t = time.perf_counter()
        backend.resume()
        merges = backend.sync(seeds)
        self._charge(active, "sync", time.perf_counter() - t)
        return self._records(seeds, searches, learnings, scored_all, stats, merges)

    def _records(self, seeds, searches, learnings, scored_all, stats, merges) -> list[StepRecord]:
        """Each active seed's ``StepRecord``, after its sync check."""
        out, group = [], len(self.seeds) > 1
        name = self.backend.name + (", lockstep" if group else "")
        for seed, search, learning, (_, cost, scored), st in zip(seeds, searches, learnings, scored_all, stats):
            check_sync(st.sync, name, who=f"seed {seed}: " if group else "")
            out.append(StepRecord(FlopBreakdown(search + merges[seed], learning, cost), scored.mean, scored.errors,
                                  scored.first_error, st.sync))
        return out
