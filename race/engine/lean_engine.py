"""The seed-axis engine: every pilot on the lean path, alone or with the other seeds of its grid point.

``LockstepEngine(config, schedule, seeds)`` steps the pilots ``(schedule, seed)`` of every seed at
once on a ``race.engine.backends.lockstep.LockstepLM``: one rollout batch for all active seeds (each seed
its own prompts, generator and merged sampling weights), one reward call per seed, one
forward/backward per iteration over every seed's sequences (``race.engine.grpo.update_seeds``), and per
seed its own AdamW, learning-rate schedule, sync check, FLOP meter, curve, checkpoints and held-out
evaluation. A solo pilot is a group of one seed (race.engine.pilot's ``PilotEngine`` wraps it): there is
one engine on the lean path, so a seed's numbers do not depend on whether it ran alone or in a
group (tests/test_lockstep.py checks a group's seed against the one-seed pilot bit for bit).
``run_lockstep`` runs a group of several seeds to their budgets; a seed whose budget is spent leaves
the batch (its adapter is frozen from then on) while the others go on. The loop state and the
evaluation are race.engine.loop's ``PilotLoop`` and ``finish_pilot``.

Shared step phases (rollout, reward, update, sync) are timed once and charged to the active seeds
in equal shares, so a pilot's ``wall_seconds`` stays its own cost and sums over a grid stay right.
The engine runs where the lean training path runs (``lockstep_supported``), sampling through the
lean sampler (backend ``hf``), one vLLM engine serving every seed's adapter (backend ``vllm``,
several seeds: race.engine.backends.vllm.VLLMLockstepBackend) or the single-adapter vLLM backend (one
seed, with its sleep mode); other models run race.engine.pilot's HF + peft step. How many seeds share a
process is ``group_size_for``'s choice.
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Callable

from race.config.configfile import GridConfig
from race.engine.evaluation import HeldOutCheckpoints, close_reward
from race.engine.loading import group_backend, load_policy, seed_everything
from race.flops.meter import FlopMeter
from race.engine.loop import (PilotData, PilotLoop, StepRecord, check_sync, finish_pilot, lr_scheduler, pack_kept,
                            rollout_search, score_rollouts)
from race.tasks.taskdata import answer_check, task_problems
from race.core.records import FlopBreakdown, PilotResult, Schedule

SeedProgressFn = Callable[[int, int, float], None]       # (seed, steps done, FLOPs spent)


def lockstep_supported(config: GridConfig) -> str | None:
    """None when the seeds of this config's grid points can run in lockstep, else why not (one line):
    the lean training path (``grpo.fast_path``, no gradient checkpointing, a supported
    architecture); rollouts through the lean sampler (backend ``hf``) or vLLM's multi-LoRA."""
    from race.flops.catalog import load_hf_config

    if not config.grpo.fast_path:
        return "grpo.fast_path is off"
    if config.grpo.grad_checkpointing:
        return "gradient checkpointing is on"
    from types import SimpleNamespace as NS

    from race.engine.backends.lean import supports

    cfg = load_hf_config(config.model)
    why = supports(NS(**{"model_type": cfg.get("model_type"), "hidden_act": cfg.get("hidden_act", "silu"),
                         "use_sliding_window": cfg.get("use_sliding_window", False),
                         "mlp_bias": cfg.get("mlp_bias", False)}))
    return None if why is None else f"the lean path cannot run this model: {why}"


class LockstepEngine:
    """The policy with one adapter per seed, its rollout backend, the shared reward and FLOP meter,
    and per seed an optimizer, a learning-rate schedule and a sampling generator."""

    def __init__(self, config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str = "cpu"):
        import torch

        from race.flops.grid import lora_spec, policy_arch, reward_spec
        from race.tasks.rewards import build_reward

        self.config, self.schedule, self.seeds, self.device = config, schedule, list(seeds), device
        t0 = time.perf_counter()
        seed_everything(self.seeds[0])
        arch = policy_arch(config)
        lora = lora_spec(config, arch)
        tok, self.policy, path = load_policy(config, device=device, seeds=self.seeds)
        self.backend = group_backend(config, self.policy, tok, path, device=device, schedule=schedule)
        self.optimizers = [torch.optim.AdamW(self.policy.parameters_of(s), lr=schedule.learning_rate,
                                             weight_decay=0.0, fused=True) for s in self.seeds]
        self.lr_schedulers = [lr_scheduler(o, config, schedule) for o in self.optimizers]
        g = config.grpo
        self.meter = FlopMeter(arch, lora, reward_spec(config), self.backend.sampling_uses_adapter, g.beta > 0,
                               g.grad_checkpointing)
        self.reward_fn = build_reward(config, device=device)
        self.check = None
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in self.seeds]
        self.setup = time.perf_counter() - t0
        self.walls = [{"setup": self.setup / len(self.seeds), "rollout": 0.0, "reward": 0.0, "update": 0.0,
                       "sync": 0.0, "eval": 0.0} for _ in self.seeds]

    def view(self, seed: int) -> SimpleNamespace:
        """Seed ``seed`` as a one-pilot engine (``config``, ``backend``, ``reward_fn``, ``meter``,
        ``check``): what race.engine.pilot's checkpoints and evaluation read."""
        return SimpleNamespace(config=self.config, backend=self.backend.view(seed), reward_fn=self.reward_fn,
                               meter=self.meter, check=self.check)

    def _charge(self, active: list[int], phase: str, seconds: float) -> None:
        for k in active:
            self.walls[k][phase] += seconds / len(active)

    def step(self, active: list[int], problems: list[list]) -> list[StepRecord]:
        """One GRPO step (race.engine.grpo's docstring) for the seeds at indices ``active``, seed ``active[i]``
        on ``problems[i]``; returns each one's ``StepRecord``."""
        from race.engine import grpo

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
        self.policy.set_active(seeds)
        stats = grpo.update_seeds(self.policy, [self.optimizers[k] for k in active], packs, mu=s.mu,
                                  temperature=g.temperature, clip_eps=g.clip_eps, clip_eps_high=g.clip_eps_high,
                                  loss_agg=g.loss_agg,
                                  max_completion_len=g.max_completion_len, beta=g.beta, entropy_coef=g.entropy_coef,
                                  micro_batch=g.micro_batch, lr_schedulers=[self.lr_schedulers[k] for k in active],
                                  pad_id=backend.pad_id, sample_logprobs=sample_lps)
        learnings = [meter.learning(p.prompt_lens, p.completion_lens, grp, s.mu, shared_prefix=True)
                     for p, grp in zip(packs, groups)]
        self._charge(active, "update", time.perf_counter() - t)

        t = time.perf_counter()
        backend.resume()
        merges = backend.sync(seeds)
        self._charge(active, "sync", time.perf_counter() - t)
        out = []
        group = len(self.seeds) > 1
        for seed, search, learning, (_, cost, scored), st in zip(seeds, searches, learnings, scored_all, stats):
            check_sync(st.sync, backend.name + (", lockstep" if group else ""), who=f"seed {seed}: " if group else "")
            out.append(StepRecord(FlopBreakdown(search + merges[seed], learning, cost), scored.mean, scored.errors,
                                  scored.first_error, st.sync))
        return out


def run_lockstep(config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str = "cpu",
                 progress: SeedProgressFn | None = None,
                 on_result: Callable[[PilotResult], None] | None = None) -> list[PilotResult]:
    """Run the pilots ``(schedule, seed)`` for ``seeds`` in lockstep (module docstring); returns
    their results in ``seeds`` order (``on_result`` also sees each as it is done)."""
    engine = LockstepEngine(config, schedule, seeds, device=device)
    tok = engine.backend.tok
    data = PilotData.load(config, tok, device=device)
    engine.check = answer_check(config, data.evals)
    loops = [PilotLoop(config, schedule, s, task_problems(config, tok, split="train", seed=s)) for s in engine.seeds]
    views = [engine.view(s) for s in engine.seeds]
    checks = [HeldOutCheckpoints(v, data.evals, data.targets, s) for v, s in zip(views, engine.seeds)]
    for k, cp in enumerate(checks):
        if cp.on:
            cp.run(0.0, 0, loops[k].spent)
    active = [k for k in range(len(engine.seeds)) if loops[k].wants_step()]
    while active:
        records = engine.step(active, [loops[k].next_problems() for k in active])
        for k, record in zip(active, records):
            loop = loops[k]
            loop.record(record)
            fraction = checks[k].due(loop.spent.total)
            if fraction is not None and loop.wants_step():
                checks[k].run(fraction, loop.steps, loop.spent)
            if progress:
                progress(engine.seeds[k], loop.steps, loop.spent.total)
        active = [k for k in active if loops[k].wants_step()]
    results = []
    for k, seed in enumerate(engine.seeds):
        r = finish_pilot(views[k], views[k].backend, data, loops[k], checks[k], seed, wall=engine.walls[k],
                         device=device,
                         extra={"engine": f"lockstep ({len(engine.seeds)} seeds)"} if len(engine.seeds) > 1 else None)
        results.append(r)
        if on_result:
            on_result(r)
    engine.backend.close()
    close_reward(engine.reward_fn)
    return results


# A lockstep group of g ≥ 2 seeds costs about this share of g solo pilots on the tiny policies
# (docs/benchmarks.md, "Lockstep pilots": steps 0.82–1.04 of solo, the default grid 0.90 in wall time).
LOCKSTEP_STEP_SHARE = 0.9
# ... for completions of at most 8 tokens; longer ones were measured at parity or worse, since a decode
# step's cost grows with rows and keys whoever shares the batch (bench/lockstep.py, per step):
# completions ≤ 24 tokens (the step policy) 0.99, ≤ 160 (the reasoner, ≈ 60 typical) 1.03 and 1.04.
# (at most this many completion tokens, share); None: any
COMPLETION_SHARES = ((8, LOCKSTEP_STEP_SHARE), (32, 0.99), (None, 1.03))


def lockstep_share(config: GridConfig) -> float:
    """The measured cost of a lockstep seed against a solo pilot for this config's completion length
    (``grpo.max_completion_len``; ``COMPLETION_SHARES``). Above 1, ``balanced_group_size`` keeps
    pilots solo unless grouping fills idle cores."""
    n = config.grpo.max_completion_len
    return next(share for limit, share in COMPLETION_SHARES if limit is None or n <= limit)


def balanced_group_size(points: int, seeds: int, workers: int, share: float = LOCKSTEP_STEP_SHARE) -> int:
    """The seeds per group that finish a grid of ``points`` × ``seeds`` pilots soonest on ``workers``
    processes: groups of g run ``ceil(seeds / g)`` per point, in rounds of ``workers``, each round
    as long as its largest group (g seeds × ``share`` of a solo pilot). Ties go to the larger group.
    E.g. 4 × 3 on 2 workers → 3 (two rounds of two groups); 5 × 4 → 2 (five full rounds, rather than
    three rounds of groups of 4 with one core idle in the last)."""
    best, best_cost = 1, float("inf")
    for g in range(1, max(1, seeds) + 1):
        groups = points * -(-seeds // g)
        rounds = -(-groups // max(1, workers))
        cost = rounds * g * (share if g > 1 else 1.0)
        if cost <= best_cost + 1e-9:
            best, best_cost = g, cost
    return best


def group_size_for(config: GridConfig, engine: str, device: str, workers: int | None = None,
                   gpu_bytes: float | None = None) -> int:
    """How many seeds of a grid point one pilot process runs: up to ``config.seeds`` in lockstep, 1 solo.

    ``auto`` takes lockstep where it was measured faster (docs/benchmarks.md): on a CPU with the
    lean sampler (backend ``hf``), in groups whose measured cost (``lockstep_share``: short
    completions gain, long ones do not) finishes the grid soonest; solo with vLLM and on a GPU
    until a run there measures it.
    ``lockstep`` insists (one ``ConfigError`` line where it cannot run); ``solo`` never groups. The
    name arrives checked (race.run.options.ENGINES, the one table of engines).
    With ``workers`` (pilot processes at once), the group size is ``balanced_group_size`` of the
    grid, so the last round of groups does not leave cores idle. On a GPU a group is cut to the most
    seeds whose memory plan fits (``_group_fits``; 1 is a solo pilot): a group holds about seeds × a
    pilot's memory, and 3 seeds of Qwen2.5-1.5B ran out of an H200's 140 GiB."""
    from race.core.errors import ConfigError

    if engine == "solo" or config.seeds < 2:
        return 1
    why = lockstep_supported(config)
    if engine == "lockstep" and why:
        raise ConfigError(f"engine 'lockstep' cannot run this config: {why}; use --engine solo or auto")
    if engine == "auto":
        from race.engine.backends import resolve_backend

        measured = not str(device).startswith("cuda") and resolve_backend(config.backend) == "hf"
        if why is not None or not measured:
            return 1
    if not workers:
        size = config.seeds
    elif engine == "lockstep":
        size = max(2, balanced_group_size(len(config.grid), config.seeds, workers))
    else:
        size = balanced_group_size(len(config.grid), config.seeds, workers, share=lockstep_share(config))
    if size > 1 and str(device).startswith("cuda"):      # a group holds about seeds × a pilot's memory
        size = min(size, _group_fits(config, device, gpu_bytes))
    return size


def _group_fits(config: GridConfig, device: str, gpu_bytes: float | None) -> int:
    """The largest lockstep group whose memory plan (race.flops.memory.group_estimate, every schedule of the
    grid) fits the GPU: ``gpu_bytes``, else the config's ``gpu_memory``, else the device's memory."""
    from race.flops.grid import plan_grid
    from race.flops.memory import largest_group, schedule_memory

    if gpu_bytes is None:
        gpu_bytes = config.gpu_memory
    if gpu_bytes is None:
        try:
            import torch

            gpu_bytes = torch.cuda.get_device_properties(torch.device(device)).total_memory
        except Exception:  # noqa: BLE001 — no such device here (race.run.prechecks names it): nothing to cut by
            return config.seeds
    plan = plan_grid(config)
    estimates = [schedule_memory(config, s, prompt_len=plan.prompt_len, gpu_bytes=gpu_bytes) for s in plan.schedules]
    return largest_group(estimates, config.seeds, gpu_bytes)
