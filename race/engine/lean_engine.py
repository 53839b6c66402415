"""Which pilots share a process on the lean path: whether a config runs there, and how many seeds of a
grid point the seed-axis engine (race.engine.seed_axis) carries at once.

``lockstep_supported(config)``: None when the lean path runs this config (``grpo.fast_path``, no
gradient checkpointing, an architecture race.engine.backends.lean supports), else why not in one line.
``group_size_for(config, engine, device, workers)``: the seeds per pilot process for the run option
``engine`` (``auto``, ``lockstep``, ``solo``): ``balanced_group_size`` over the measured cost of a
grouped seed against a solo pilot (``lockstep_share``, ``COMPLETION_SHARES``), cut on a GPU to the group
whose memory plan fits. Invariants: pure planning, no torch at module level; ``solo`` is always 1 and
``lockstep`` on a config the lean path cannot run is one ``ConfigError`` line.
"""
from __future__ import annotations

from race.config.configfile import GridConfig


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
