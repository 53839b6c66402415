"""``race pilot`` and ``race worker``: the commands that run a grid's pilots.

``race pilot`` takes its options in the groups its help shows (``PilotCommand.grouped``): the config
and full-run budget come from the Grid and Full run groups, the run options from the Engine, Storage,
Adaptive and Output groups (race.run.options.RunOptions, checked once), then the grid runs
(race.run.extend.run_extended → race.run.study.run_grid) and the verdict is printed.
"""
from __future__ import annotations

from typing import Any

import click

from race.run.adaptive import ADAPTIVE_POLICIES
from race.run.cli_support import (ADAPTIVE_GROUP, ALLOW_APPROXIMATE, ENGINE_HELP, FORCE_HELP, FULL_RUN_HELP, PLOT_HELP,
                                  Failed, PilotCommand, draw, echo, full_run_budget, output_format)
from race.run.options import ENGINES
from race.stats.report import FORMATS


@click.command(cls=PilotCommand)
@click.argument("config_path", metavar="[CONFIG.yaml]", required=False)
@click.option("--out", "out_dir", default=None, help="Output folder for results.json (default: runs/<name>).")
@click.option("--budget", default=None, help="FLOPs per pilot, e.g. 1.5e12.")
@click.option("--seeds", type=click.IntRange(min=1), default=None, help="Seeds per grid point.")
@click.option("--grid", default=None, help="Comma-separated ρ targets.")
@click.option("--models", default=None, metavar="A,B,…",
              help="A grid over policies: one ρ grid per model at the same FLOPs per pilot, and one joint report "
                   "(overrides the config's model / models; docs/models.md).")
@click.option("--backend", type=click.Choice(["auto", "hf", "vllm"]), default=None, help="Rollout backend.")
@click.option("--workers", type=int, default=None,
              help="Pilots run at once here (default: 2 on CPU); 0 = coordinate only, race worker runs them.")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--engine", default="auto", show_default=True, metavar="[" + "|".join(ENGINES) + "]", help=ENGINE_HELP)
@click.option("--thorough", is_flag=True, help="The larger embedded grid (more seeds and budget); no CONFIG.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Deprecated: use --format json (kept for one release).")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--storage", default=None, metavar="URL",
              help="optuna storage of the study: sqlite:///FILE, postgresql://…, mysql://…, journal:FILE "
                   "(default: sqlite:///DIR/race.db).")
@click.option("--study", default=None, help="Study name (default: the config's name).")
@click.option("--adaptive", is_flag=True,
              help="Half the pilots of the full grid: seed 0 at every ρ, then the seeds that sharpen the verdict most.")
@click.option("--adaptive-policy", default=None, metavar="[" + "|".join(ADAPTIVE_POLICIES) + "]",
              help="Which adaptive grid (implies --adaptive): informative (default); halving (successive halving "
                   "over ρ, seeds as the resource); budget-halving (the budget as the resource: every ρ paused at "
                   "B/11, the best half continued from its saved state to B; the ladder below sets it; "
                   "docs/pilot.md).")
@click.option("--halving-eta", "halving_eta", default=None, metavar="N",
              help="With budget-halving: each rung's budget is η × the last's, marks B/η^R … B/η (default 11).")
@click.option("--halving-rungs", "halving_rungs", default=None, metavar="R",
              help="With budget-halving: rungs below B (default 1: B/11; 2 with --halving-eta 3: B/9 and B/3).")
@click.option("--halving-keep", "halving_keep", default=None, metavar="ci|top-half|K",
              help="With budget-halving: which ρ go on at a rung: top-half (default: the best half by mean "
                   "reading), ci (the ρ whose paired interval overlaps the best, at most ⌈n/η⌉) or the best K.")
@click.option("--adaptive-share", type=float, default=None,
              help="Share of the full grid's pilots an adaptive grid runs (implies --adaptive; default 0.5, "
                   "or the study's own on a resume; a larger share on a resume adds pilots).")
@click.option("--retries", type=int, default=1, show_default=True,
              help="Times a failed pilot (exception, out-of-memory kill) is run again.")
@click.option("--heartbeat", type=int, default=None,
              help="Seconds between heartbeats, stored with the study for all its workers; a pilot is "
                   "abandoned after 3 missed (default 20).")
@click.option("--plot", "plot_path", default=None, metavar="FILE", help=PLOT_HELP)
@click.option("--profile", is_flag=True,
              help="After the grid: where its wall time went (counted pilot work, held-out evaluation, loading, "
                   "process start, idle workers, calibration), on stderr and in results.json (profile).")
@click.option("--import-pilots", "import_pilots", default=None, metavar="RESULTS.json",
              help="Record the finished pilots of this results file (same run config, run elsewhere or in a lost "
                   "storage; a grid with fewer seeds or other ρ points is fine) in the study first, so only "
                   "the missing ones run.")
@click.option("--full-run", "full_run", default=None, metavar="F", help=FULL_RUN_HELP)
@click.option("--design", default=None, metavar="[grid|fit|flat|prior|halving]",
              help="How the pilots are sized (default: the config's pilot_design, else grid): grid runs the config "
                   "as written; fit, flat, prior and halving spend --share of --full-run F, held-out evaluation "
                   "counted, as race plan --full-run F states (halving runs budget halving, η 11, keep top-half; "
                   "docs/pilot.md).")
@click.option("--share", type=float, default=None,
              help="With --design fit|flat|prior|halving: the share of the full run the pilots spend (default: the config's "
                   "pilot_share, 0.1).")
@click.option("--force-forecast", "force_forecast", is_flag=True, help=FORCE_HELP)
@click.option("--probe", "probe_f", is_flag=True,
              help="With --full-run F: after the grid, test η at F's length (race probe; at most a quarter of the "
                   "grid's compute).")
@click.option("--extend", type=int, default=0, show_default=True, metavar="N",
              help="When the best point is the grid's lowest (highest) ρ, add the next point past that edge and run "
                   "only its seeds, up to N times (race/run/extend.py; each round is its own study, earlier rounds' "
                   "results kept as DIR/results-xK.json).")
@ALLOW_APPROXIMATE
def pilot(config_path: str | None, **given: Any) -> None:
    """Run real LoRA GRPO pilots on an IsoFLOP ρ grid and print the regime verdict.

    With no CONFIG, runs the embedded default: the shipped tiny policy on arithmetic
    with a sparse reward (about five minutes on a 2-core CPU).
    """
    from race.run.extend import run_extended
    from race.stats.results import failure_message

    g = PilotCommand.grouped(given)
    grid, out = g["Grid"], g["Output"]
    out["fmt"] = output_format(out["fmt"], out["as_json"])      # before any work: --json with --format md is refused
    if out["as_json"] and not out["quiet"]:        # a deprecated alias, kept one release (docs/reference/cli.md)
        echo("warning: --json is deprecated: use --format json", err=True)
    cfg, full, design = _pilot_config(config_path, grid, g["Engine"], g["Full run"], out)
    options = _pilot_options(cfg, g).with_(design=design).check()   # every run option checked here, once
    if g["Full run"]["probe_f"] and not cfg.models:
        from race.fullrun.probe import check_probe_config

        # F ≤ B, past MAX_FACTOR, or a probe that cannot cover its share of the run: refused before calibration,
        # against the most pilots this grid can run (a design's, an adaptive policy's, extension rounds')
        check_probe_config(cfg, full, pilots=options.most_pilots(cfg))
    if cfg.models:
        if options.extend:
            raise click.UsageError("--extend takes one policy's grid: run a grid over models without it")
        _pilot_models(cfg, options, full=full, plot_path=out["plot_path"], fmt=out["fmt"])
        return

    results = run_extended(cfg, options, banner=_banner(cfg, options))      # extend 0: run_grid itself
    if results.diagnosis is not None:
        results = _pilot_full_run(results, options, full=full, force=g["Full run"]["force_forecast"],
                                  probe=g["Full run"]["probe_f"])
        echo(_render(results.diagnosis, out["fmt"]), nl=False)
        if out["plot_path"]:
            draw(results, out["plot_path"], options.quiet)
    failed = failure_message(results)
    if failed:
        raise Failed(failed)


def _banner(cfg: Any, options: Any) -> str:
    """The line printed once the checks pass (a refusal stays one line): the grid, its budget, where it goes."""
    d = options.design
    shape = (f"{len(d['pilots'])} pilots of design {d['design']} (ρ {', '.join(f'{r:g}' for r in cfg.grid)}) "
             f"within {d['share']:.0%} of F"
             + (f", held-out evaluation thinned to {1 + len(d['eval']['checkpoints'])} checkpoint evaluations"
                if d.get("eval") else "")
             + (f", the best half continued from B/{d['halving']['eta']}" if d.get("halving") else "")
             if d else f"{len(cfg.grid)} points × {cfg.seeds} seeds")
    return f"RACE pilot grid {cfg.name}: {shape}, {cfg.budget:.3g} FLOPs per pilot → {options.out_dir}/results.json"


def _render(diagnosis: Any, fmt: str) -> str:
    from race.stats.report import render_diagnosis

    return render_diagnosis(diagnosis, fmt)


def _pilot_config(config_path: str | None, grid: dict, engine: dict, full_run: dict,
                  out: dict) -> tuple[Any, float | None, Any]:
    """``race pilot``'s config (CONFIG, or the embedded default / thorough grid, with the Grid group's
    overrides, sized from the full run by its pilot design: race.run.sizing), the full-run budget and the
    design's record, each refused in one line before anything runs."""
    from race.run.sizing import size_pilots

    from race.config import presets
    from race.run.api import build_config

    if grid["thorough"] and config_path:
        raise click.UsageError("--thorough picks the embedded grid: give either CONFIG or --thorough")
    if out["plot_path"]:
        from race.run.plot import check_plot_path

        check_plot_path(out["plot_path"])  # before any pilot runs
    cfg = build_config(config_path or (presets.THOROUGH if grid["thorough"] else None), budget=grid["budget"],
                       seeds=grid["seeds"], grid=grid["grid"], models=grid["models"], backend=engine["backend"],
                       allow_approximate_flops=grid["allow_approximate"] or None)
    full = full_run_budget(full_run["full_run"], full_run["force_forecast"], cfg.full_run_budget)     # before any pilot runs
    if full_run["probe_f"] and not full:
        raise click.UsageError("--probe tests η at the full run's length: give --full-run F (or full_run_budget)")
    cfg, design = size_pilots(cfg, full_run=full, design=full_run["design"], share=full_run["share"])
    return cfg, full, design


def _pilot_options(cfg: Any, g: dict) -> Any:
    """The run options of ``race pilot``, from its Engine, Storage, Adaptive and Output groups, checked."""
    import os

    from race.run.options import RunOptions

    engine, storage, adaptive, out = g["Engine"], g["Storage"], g[ADAPTIVE_GROUP], g["Output"]
    return RunOptions(out_dir=out["out_dir"] or os.path.join("runs", cfg.name), workers=engine["workers"],
                      device=engine["device"], quiet=out["quiet"], storage=storage["storage"], study=storage["study"],
                      adaptive=adaptive["adaptive_policy"] or adaptive["adaptive"], retries=engine["retries"],
                      heartbeat=engine["heartbeat"], adaptive_share=adaptive["adaptive_share"],
                      import_pilots=storage["import_pilots"], engine=engine["engine"],
                      extend=g["Grid"]["extend"], profile=out["profile"], halving_ladder=_ladder(adaptive)).check()


def _ladder(adaptive: dict) -> dict | None:
    """The Adaptive group's budget-halving ladder as RunOptions takes it (None when no --halving-* is given)."""
    given = {k: adaptive[f"halving_{k}"] for k in ("eta", "rungs", "keep") if adaptive[f"halving_{k}"] is not None}
    return given or None


def _pilot_full_run(results: Any, options: Any, *, full: float | None, force: bool, probe: bool) -> Any:
    """With a full-run budget: the forecast saved with the results, then (``--probe``) the length probe."""
    from race.stats.results import failure_message

    if not full or failure_message(results):
        return results
    from race.run.api import run_probe, save_forecast

    results = save_forecast(results, options.out_dir, full_run_budget=full, force=force)
    if probe:
        say = None if options.quiet else (lambda line: echo(line, err=True))
        results = run_probe(results, full_run_budget=full, device=options.device, out=options.out_dir, force=force,
                            announce=say, progress=say)
    return results


def _pilot_models(cfg: Any, options: Any, *, full: float | None, plot_path: str | None, fmt: str) -> None:
    """``race pilot`` of a grid over policies: every part, then the joint report (race.run.multimodel)."""
    from race.run.api import run_models
    from race.run.multimodel import render_joint

    if full is not None:
        raise click.UsageError("--full-run / full_run_budget forecasts one policy's grid: run the grid over models, "
                               "then race report DIR/LABEL --full-run F for each part")
    if options.import_pilots:
        raise click.UsageError("--import-pilots takes one policy's results: import into a part with "
                               "race pilot --out DIR/LABEL, then re-run the grid over models")
    if options.halving_ladder is not None:
        raise click.UsageError("--halving-eta / --halving-rungs / --halving-keep set one grid's ladder: a grid over "
                               "models runs budget-halving at its default ladder (η 11, one rung, the best half); "
                               "run a policy alone (race pilot --out DIR/LABEL) for another ladder")
    if options.profile:
        raise click.UsageError("--profile splits one grid's wall time: run a policy alone (race pilot --out DIR/LABEL "
                               "--profile) to see where its time went")
    if not options.quiet:
        echo(f"RACE grid over models {cfg.name}: {len(cfg.models)} policies × {len(cfg.grid)} points × "
              f"{cfg.seeds} seeds, {cfg.budget:.3g} FLOPs per pilot → {options.out_dir}/models.json", err=True)
    view = run_models(cfg, out_dir=options.out_dir, quiet=options.quiet, storage=options.storage, study=options.study,
                      workers=options.workers, device=options.device, adaptive=options.adaptive,
                      adaptive_share=options.adaptive_share, retries=options.retries, heartbeat=options.heartbeat,
                      engine=options.engine)
    echo(render_joint(view, fmt), nl=False)
    if plot_path:
        from race.run.plot import plot_models

        plot_models(options.out_dir, plot_path)
        if not options.quiet:
            echo(f"figure → {plot_path}", err=True)


@click.command()
@click.option("--storage", required=True, metavar="URL", help="optuna storage holding the study.")
@click.option("--study", required=True, help="Study name (the name race pilot printed).")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Pilots run at once (default: 2 on CPU, 1 on GPU).")
@click.option("--device", default="cpu", show_default=True, help="cpu or cuda[:N].")
@click.option("--retries", type=click.IntRange(min=0), default=1, show_default=True,
              help="Times a pilot that failed here is enqueued again.")
@click.option("--wait", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds an idle worker waits for new pilots (adaptive rungs) before it exits.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
@click.option("--engine", type=click.Choice(list(ENGINES)), default="auto", show_default=True, help=ENGINE_HELP)
@click.option("--trust-reward", "trust_reward", is_flag=True,
              help="Run the study's custom reward even when its file here differs from the one the coordinator "
                   "recorded (by sha256), or is missing.")
def worker(storage: str, study: str, workers: int | None, device: str, retries: int, wait: float,
           quiet: bool, engine: str, trust_reward: bool) -> None:
    """Join a study (from any machine) and run the pilots no other worker holds.

    Stops when the study needs no more pilots; a pilot whose worker died is taken over
    once its heartbeat is stale."""
    from race.run.workers import run_worker
    done = run_worker(storage, study, workers=workers, device=device, quiet=quiet, retries=retries, wait=wait,
                      engine=engine, trust_reward=trust_reward)
    echo(f"worker done: {done['ran']} pilots run here ({done['complete']} complete, {done['failed']} failed) "
               f"for study {done['study']!r} in {done['storage']}")
