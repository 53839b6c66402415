"""``race.diagnose()``: plan → run → fit → classify, orchestration only."""
from __future__ import annotations

import os
import tempfile
from typing import Any, Mapping, Sequence

from race.config import GridConfig, config_from_dict, load_config
from race.records import Diagnosis


def build_config(config: str | Mapping[str, Any] | GridConfig | None = None, **overrides: Any) -> GridConfig:
    """A validated config from a YAML path, a mapping, a GridConfig or the embedded default,
    with top-level overrides (``None`` values ignored)."""
    from race import presets

    if config is None:
        cfg = config_from_dict(presets.DEFAULT)
    elif isinstance(config, GridConfig):
        cfg = config
    elif isinstance(config, str):
        cfg = load_config(config)
    else:
        cfg = config_from_dict(config)
    reward = overrides.pop("reward", None)
    if reward is not None:
        from dataclasses import replace

        if callable(reward):
            raise ValueError("reward: pass a name (sparse, structured, dense, prm) or 'module:function'; "
                             "a callable cannot cross into pilot processes")
        kind = reward if reward in ("sparse", "structured", "dense") else "custom"
        cfg = replace(cfg, reward=replace(cfg.reward, kind=kind, function=None if kind != "custom" else reward))
    return cfg.with_overrides(**overrides)


def diagnose(*, model: str | None = None, reward: str | None = None, budget: float | str | None = None,
             dataset: str | None = None, grid: Sequence[float] | str | None = None, seeds: int | None = None,
             config: str | Mapping[str, Any] | GridConfig | None = None, out_dir: str | None = None,
             workers: int | None = None, device: str = "cpu", quiet: bool = True,
             adaptive: bool | str = False, adaptive_share: float | None = None,
             allow_approximate: bool = False) -> Diagnosis:
    """Run a pilot grid and return its ``Diagnosis``.

    Args:
        model: policy (HF id, folder, or ``race/tiny-arith``); default: the config's.
        reward: ``sparse`` | ``structured`` | ``dense`` or ``"module:function"``.
        budget: FLOPs per pilot (``2e17`` or ``"2e17"``).
        dataset: built-in task name or a JSONL / Parquet / HF dataset.
        grid: ρ targets (a sequence or ``"0.3,0.5,0.7"``).
        seeds: seeds per grid point.
        config: a YAML path / mapping / GridConfig to start from (default: the embedded tiny grid).
        out_dir: where ``results.json`` goes (default: a temporary folder).
        adaptive: run half the pilots (True: the ``informative`` policy; or ``"halving"``;
            race.scheduler.ADAPTIVE_POLICIES).
        adaptive_share: the share of the full grid's pilots an adaptive grid runs (default 0.5;
            implies ``adaptive``).
        allow_approximate: count a model type outside RACE's architecture table anyway (as a
            Llama-style decoder); the diagnosis then carries the warning. Without it such a model
            raises ``race.architectures.UnsupportedArchitecture`` (a ``ValueError``) before any pilot.

    Raises ``race.errors.RaceError`` (a ``ValueError``; ``ConfigError``, ``PilotsFailed``, …) with
    the one-line message the CLI prints where it exits 2; it never returns None.
    """
    from race.scheduler import run_grid

    cfg = build_config(config, model=model, reward=reward, budget=budget, task=dataset, grid=grid, seeds=seeds,
                       allow_approximate_flops=allow_approximate or None)
    out = out_dir or tempfile.mkdtemp(prefix="race-")
    os.makedirs(out, exist_ok=True)
    results = run_grid(cfg, out_dir=out, workers=workers, device=device, quiet=quiet, adaptive=adaptive,
                       adaptive_share=adaptive_share)
    import race.report  # noqa: F401  (registers the renderer: print(diagnosis) is the text report)
    from race.errors import PilotsFailed, RaceError
    from race.results import failure_message

    failed = failure_message(results)
    if failed:                          # the CLI exits 2 with this line; the API raises it
        raise PilotsFailed(failed)
    if results.diagnosis is None:
        raise RaceError(f"the grid in {out} ended without a diagnosis: no pilot finished "
                        f"(results.json there lists what ran)")
    return results.diagnosis
