"""``race.diagnose()``: plan → run → fit → classify, orchestration only."""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Mapping, Sequence

from race.config.configfile import GridConfig, config_from_dict, load_config
from race.core.records import Diagnosis


def build_config(config: str | Mapping[str, Any] | GridConfig | None = None, **overrides: Any) -> GridConfig:
    """A validated config from a YAML path, a mapping, a GridConfig or the embedded default,
    with top-level overrides (``None`` values ignored)."""
    from race.config import presets

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

        from race.core.errors import ConfigError

        if callable(reward):
            raise ConfigError("reward: pass a name (sparse, structured, dense, math, format) or 'module:function'; "
                             "a callable cannot cross into pilot processes")
        from race.config.rules import RULE_REWARDS

        if not isinstance(reward, str) or not reward:
            from race.core.safeio import quote

            raise ConfigError(f"reward {quote(reward, 80)} must be a name ({', '.join(RULE_REWARDS)}) or a "
                              "'module:function' string")
        kind = reward if reward in RULE_REWARDS else "custom"
        cfg = replace(cfg, reward=replace(cfg.reward, kind=kind, function=None if kind != "custom" else reward,
                                          mix=None))
    return cfg.with_overrides(**overrides)


def diagnose(*, model: str | None = None, reward: str | None = None, budget: float | str | None = None,
             dataset: str | None = None, grid: Sequence[float] | str | None = None, seeds: int | None = None,
             config: str | Mapping[str, Any] | GridConfig | None = None, out_dir: str | None = None,
             workers: int | None = None, device: str = "cpu", quiet: bool = True,
             adaptive: bool | str = False, adaptive_share: float | None = None,
             allow_approximate: bool = False, full_run_budget: float | str | None = None,
             force_forecast: bool = False, engine: str = "auto", extend: int = 0, probe: bool = False,
             design: str | None = None, share: float | None = None,
             halving_ladder: Mapping[str, Any] | None = None) -> Diagnosis:
    """Run a pilot grid and return its ``Diagnosis``.

    Args:
        model: policy (HF id, folder, or ``race/tiny-arith``); default: the config's.
        reward: ``sparse`` | ``structured`` | ``dense`` | ``math`` | ``format`` or ``"module:function"``.
        budget: FLOPs per pilot (``2e17`` or ``"2e17"``).
        dataset: built-in task name or a JSONL / Parquet / HF dataset.
        grid: ρ targets (a sequence or ``"0.3,0.5,0.7"``).
        seeds: seeds per grid point.
        config: a YAML path / mapping / GridConfig to start from (default: the embedded tiny grid).
        out_dir: where ``results.json`` goes (default: a temporary folder).
        adaptive: run half the pilots (True: the ``informative`` policy; or ``"halving"``;
            race.run.adaptive.POLICIES); ``"budget-halving"``: every ρ to B/11, the best half continued
            from its saved state to B (docs/pilot.md, "Budget halving").
        adaptive_share: the share of the full grid's pilots an adaptive grid runs (default 0.5;
            implies ``adaptive``).
        halving_ladder: with ``"budget-halving"``, its ladder: a mapping of ``eta`` (each rung η × the last),
            ``rungs`` (below B) and ``keep`` (``"ci"``, ``"top-half"`` or a whole number k), each optional,
            default ``{"eta": 11, "rungs": 1, "keep": "top-half"}``; ``{"eta": 3, "rungs": 2, "keep": "ci"}``
            is the ladder before issue 49's live check (B/9, B/3, then B).
        allow_approximate: count a model type outside RACE's architecture table anyway (as a
            Llama-style decoder); the diagnosis then carries the warning. Without it such a model
            raises ``race.flops.architectures.UnsupportedArchitecture`` (a ``ValueError``) before any pilot.
        full_run_budget: FLOPs of one full run (default: the config's ``full_run_budget``): the
            diagnosis then carries ``forecast``, the held-out reward per ρ predicted there from the
            pilots' checkpoints, or its one-line refusal (race.stats.forecast, docs/forecast.md).
        force_forecast: predict even past the extrapolation factor the backtests support (marked forced).
        engine: ``auto`` (lockstep on CPU where it runs), ``lockstep`` (a grid point's seeds as one
            batch in one process: race.engine.lean_engine) or ``solo`` (one pilot per process).
        extend: up to this many rounds that add the next ρ past the edge where the best point lies,
            running only the new point's seeds (race.run.extend; 0: the grid as given).
        probe: with a full-run budget, then run the length probe (race.fullrun.probe: η for the full run's
            step count at 1 prompt per step, ≤ 25 % of the grid's compute); the stability line at F
            and the rate for F read it.
        design: how the pilots are sized (default: the config's ``pilot_design``, else ``grid``, the config
            as written); ``fit``, ``flat`` or ``prior`` spend ``share`` of the full run (default: the config's
            ``pilot_share``, 0.1), held-out evaluation counted, as ``race plan --full-run F`` states
            (race.run.sizing; a design with no pilots within the share raises ``SizingError``).
        share: with a design, the share of the full run the pilots spend.

    Raises ``race.RaceError`` (a ``ValueError``; ``ConfigError``, ``PilotsFailed``, …) with
    the one-line message the CLI prints where it exits 2; it never returns None.
    """
    cfg, full, options = _checked_run(**locals())          # every argument checked before any compute
    from race.run.extend import run_extended

    out = out_dir or tempfile.mkdtemp(prefix="race-")     # a folder named is made by the grid, once its checks pass
    results = run_extended(cfg, options.with_(out_dir=out))                                  # extend 0: run_grid
    return _diagnosis(results, out, full=full, force=force_forecast, probe=probe, device=device)


def _checked_run(*, config: Any, model: Any, reward: Any, budget: Any, dataset: Any, grid: Any, seeds: Any,
                 out_dir: str | None, workers: int | None, device: str, quiet: Any, adaptive: Any,
                 adaptive_share: Any, allow_approximate: Any, full_run_budget: Any, force_forecast: Any,
                 engine: str, extend: int, probe: Any, design: str | None, share: float | None,
                 halving_ladder: Mapping[str, Any] | None) -> tuple[GridConfig, float | None, Any]:
    """diagnose's arguments checked, before any compute: its config (built, pilots sized), the full
    run's FLOPs (or None) and its RunOptions."""
    from race.core import arguments as A

    for name, value in (("probe", probe), ("force_forecast", force_forecast), ("quiet", quiet),
                        ("allow_approximate", allow_approximate)):
        A.flag(name, value)                 # 'yes' or 'false' is not a boolean: refused before any compute
    cfg = build_config(config, model=model, reward=reward, budget=budget, task=dataset, grid=grid, seeds=seeds,
                       allow_approximate_flops=allow_approximate or None)
    if cfg.models:
        from race.core.errors import RaceError

        raise RaceError(f"config names models {list(cfg.models)}: a grid over policies returns a joint view, "
                        "not one diagnosis: call race.run.api.run_models (or give one model)")
    from race.run.sizing import size_pilots

    full = _checked_full_run(cfg, full_run_budget, force=force_forecast, probe=probe)
    cfg, sized = size_pilots(cfg, full_run=full, design=design, share=share)       # before calibration
    from race.run.options import RunOptions

    # checked once, before a folder is made (race.run.options.RunOptions.check)
    options = RunOptions(out_dir=out_dir or "(a temporary folder)", extend=extend or 0, workers=workers, device=device,
                         quiet=quiet, adaptive=adaptive, adaptive_share=adaptive_share, engine=engine,
                         design=sized, halving_ladder=halving_ladder).check()
    if probe:
        from race.fullrun.probe import check_probe_config

        # F ≤ B, past MAX_FACTOR, or a probe that cannot cover its share of the run: refused before any compute,
        # against the most pilots this grid can run (a design's, an adaptive policy's, extension rounds')
        check_probe_config(cfg, full, pilots=options.most_pilots(cfg))
    return cfg, full, options


def _checked_full_run(cfg: GridConfig, full_run_budget: float | str | None, *, force: bool,
                      probe: bool) -> float | None:
    """The full-run budget (the argument over the config's), with force / probe refused without one, before
    calibration (the probe's own checks follow once the run options are known: ``diagnose``)."""
    from race.config.configfile import parse_flops
    from race.core.errors import RaceError

    full = parse_flops(full_run_budget, "full_run_budget") if full_run_budget is not None else cfg.full_run_budget
    if force and full is None:
        raise RaceError("force_forecast needs full_run_budget (FLOPs of one full run), here or in the config")
    if probe and full is None:
        raise RaceError("probe tests η at the full run's length: give full_run_budget, here or in the config")
    return full


def _diagnosis(results: Any, out: str, *, full: float | None, force: bool, probe: bool, device: str) -> Diagnosis:
    """The grid's diagnosis (with the forecast at ``full`` and the length probe when asked), or the one
    line its failure is."""
    import race.stats.report  # noqa: F401  (registers the renderer: print(diagnosis) is the text report)
    from race.core.errors import PilotsFailed, RaceError
    from race.stats.results import failure_message

    failed = failure_message(results)
    if failed:                          # the CLI exits 2 with this line; the API raises it
        raise PilotsFailed(failed)
    if results.diagnosis is None:
        raise RaceError(f"the grid in {out} ended without a diagnosis: no pilot finished "
                        f"(results.json there lists what ran)")
    if full:
        results = save_forecast(results, out, full_run_budget=full, force=force)
        if probe:
            results = run_probe(results, full_run_budget=full, device=device, out=out, force=force)
    return results.diagnosis


def save_forecast(results: Any, out_dir: str, *, full_run_budget: float, force: bool = False) -> Any:
    """``results`` with the forecast at ``full_run_budget`` in its diagnosis, written back to
    ``out_dir``/results.json (race.stats.forecast; a refusal is stored too)."""
    from dataclasses import replace

    from race.stats.forecast import with_forecast
    from race.stats.results import load_results, results_file, results_lock, save_results

    with results_lock(out_dir):          # one writer: a probe's record stored meanwhile is kept
        if os.path.isfile(results_file(out_dir)):
            results = replace(results, meta=load_results(out_dir).meta)
        out = replace(results, diagnosis=with_forecast(results, full_run_budget=full_run_budget, force=force))
        save_results(out_dir, out)
    return out


def run_probe(results: Any, *, full_run_budget: float, rho: float | None = None, lr: float | None = None,
              device: str = "cpu", out: str | None = None, announce: Any = None, force: bool = False,
              progress: Any = None) -> Any:
    """Run the length probe (race.fullrun.probe) for ``results`` (race.stats.results.Results, or a results path)
    at ``full_run_budget`` and return the results with its record stored under ``probes`` and the
    forecast at F redone (so the stability line and the rate read it); written to ``out``
    (a folder or a .json file) when given. ``announce(plan_line)`` is called before it runs, and
    ``progress(line)`` at each tenth of the probe's budget (race.fullrun.probe.ProgressLines)."""
    from dataclasses import replace

    from race.stats.forecast import with_forecast
    from race.engine.loading import check_device
    from race.engine.pilot import run_pilot
    from race.fullrun.probe import ProgressLines, plan_probe, probe_record
    from race.stats.results import with_probe
    from race.stats.results import load_results, results_file, results_lock, save_results

    import time

    from race.core import arguments as A
    from race.stats.results import Results

    if isinstance(results, (str, os.PathLike)):
        results = load_results(results)
    A.instance("results", results, Results, expected="a race Results (race.load_results) or a results path")
    A.flag("force", force)
    for name, fn in (("announce", announce), ("progress", progress)):
        if fn is not None:
            A.function(name, fn)
    if out is not None and not isinstance(out, (str, os.PathLike)):
        from race.core.errors import RaceError

        raise RaceError(f"out {A.shown(out)} must be a folder or a .json path (a string or a path), or None")
    device = check_device(device)
    plan = plan_probe(results, full_run_budget, rho=rho, lr=lr)     # one line before any compute
    if out:
        _check_writable(out)             # a record that cannot be stored is refused before the probe runs
    if announce:
        announce(plan.line())
    target = results.diagnosis.primary_target if results.diagnosis is not None else "reward"
    t0 = time.time()
    lines = ProgressLines(plan.budget, plan.schedule.steps, say=progress) if progress else None
    pilot = run_pilot(plan.config, plan.schedule, 0, device=device, progress=lines)
    record = probe_record(plan, pilot, target=target, wall_seconds=time.time() - t0)

    def stored(base: Any) -> Any:
        res = with_probe(base, record)
        return replace(res, diagnosis=with_forecast(res, full_run_budget=plan.full_run_budget, force=force))

    if not out:
        return stored(results)
    with results_lock(out):               # one writer: another probe's record, stored meanwhile, is kept
        if os.path.isfile(results_file(out)):
            results = load_results(out)
        out_results = stored(results)
        save_results(out, out_results)
    return out_results


def _check_writable(out: str) -> None:
    """``out`` (a folder, or a .json file in one) can take the probe's record: the folder exists or can
    be made, and it and an existing results file are writable by this user; else one line, before the
    probe runs."""
    from race.core.errors import RaceError

    path = out if out.endswith(".json") else os.path.join(out, "results.json")
    if os.path.islink(path):              # the writer (race.core.safeio.write_inside) would refuse it after the probe
        raise RaceError(f"cannot store the probe's record: results file {path!r} is a symbolic link, and RACE never "
                        "writes through a link nor replaces one; nothing was run (remove the link, or give the "
                        "file it points to)")
    folder = os.path.dirname(os.path.abspath(path))
    probe = folder
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)):
        where = path if os.path.exists(path) and os.path.isdir(probe) and os.access(probe, os.W_OK) else probe
        raise RaceError(f"cannot store the probe's record: {where!r} is not writable by this user; nothing was run "
                        "(give a results file in a folder you can write, or copy it there)")


def run_models(config: GridConfig, *, out_dir: str, storage: str | None = None, study: str | None = None,
               workers: int | None = None, device: str = "cpu", quiet: bool = False, adaptive: bool | str = False,
               adaptive_share: float | None = None, retries: int = 1, heartbeat: int | None = None,
               target: str | None = None, engine: str = "auto") -> Any:
    """Run (or resume) a grid over policies (``config.models``): one ρ grid per policy at the same
    budget per pilot, each an ordinary part in ``out_dir/LABEL`` (its own race.db unless ``storage``
    names one for all; study ``NAME--LABEL``), then the joint view in ``out_dir/models.json``
    (race.run.multimodel). Every policy is checked before any pilot runs. Returns the ``JointView``;
    raises ``PilotsFailed`` (after running every part) when pilots failed after their retries."""
    from race.core.errors import PilotsFailed, RaceError
    from race.flops.catalog import check_loadable, load_arch_reading
    from race.run.multimodel import joint_view, part_configs, save_joint
    from race.stats.results import failure_message
    from race.run.study import run_grid

    _checked_models(config, out_dir=out_dir, storage=storage, study=study, workers=workers, device=device, quiet=quiet,
                    adaptive=adaptive, adaptive_share=adaptive_share, retries=retries, heartbeat=heartbeat,
                    target=target, engine=engine)
    parts = part_configs(config)
    for _, part in parts:                 # before anything runs: every policy loads and is counted
        check_loadable(part.model, "models")
        load_arch_reading(part.model, allow_approximate=part.allow_approximate_flops)
    os.makedirs(out_dir, exist_ok=True)
    labels = [label for label, _ in parts]
    done: list[tuple[str, Any]] = []
    failed: list[str] = []
    for label, part in parts:
        if not quiet:
            print(f"RACE grid over models: policy {label} ({part.model}), part {len(done) + 1} of {len(parts)} "
                  f"→ {os.path.join(out_dir, label)}", file=sys.stderr, flush=True)
        res = run_grid(part, out_dir=os.path.join(out_dir, label), storage=storage,
                       study=f"{study}--{label}" if study else None, workers=workers, device=device, quiet=quiet,
                       adaptive=adaptive, adaptive_share=adaptive_share, retries=retries, heartbeat=heartbeat,
                       engine=engine)
        line = failure_message(res)
        if line:
            failed.append(f"{label}: {line}")
        if res.diagnosis is not None:
            done.append((label, res))
        view = joint_view(done, target=target) if len(done) >= 2 else None
        save_joint(out_dir, labels, view, models=config.models, config=config.to_dict())
    if failed:
        raise PilotsFailed(failed[0] + (f" (and {len(failed) - 1} more part(s))" if len(failed) > 1 else ""))
    if len(done) < len(parts):
        raise RaceError(f"the grid over models in {out_dir} ended with {len(done)} of {len(parts)} policies "
                        "diagnosed: re-run the same command to finish it")
    return view


def _checked_models(config: Any, *, out_dir: Any, storage: Any, study: Any, target: Any, quiet: Any, device: Any,
                    **options: Any) -> None:
    """run_models' arguments, checked before any policy loads or any folder is made (one RaceError line)."""
    from race.core import arguments as A
    from race.core.errors import RaceError
    from race.engine.loading import check_device
    from race.run.options import RunOptions

    A.instance("config", config, GridConfig, expected="a race.GridConfig naming models (race.load_config)")
    if not config.models:
        raise RaceError(f"config names one policy ({config.model!r}): run_models runs a grid over config.models; "
                        "race.diagnose runs one policy")
    A.flag("quiet", quiet)
    if target is not None:
        A.text("target", target)
    RunOptions(out_dir=out_dir, storage=storage, study=study, device=device, quiet=quiet, **options).check()
    if os.path.lexists(out_dir) and (os.path.islink(out_dir) or not os.path.isdir(out_dir)):
        raise RaceError(f"out_dir {A.shown(out_dir)} is {'a link' if os.path.islink(out_dir) else 'not a folder'}: "
                        "expected a folder for the policies' grids (or a path to make one)")
    check_device(device)
