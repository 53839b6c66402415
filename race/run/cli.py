"""The ``race`` command line.

Bad input (unknown model, ρ outside (0, 1), a non-positive budget, a missing
file, malformed YAML) ends with a one-line ``Error: ...`` and exit code 2,
never a traceback.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from race.core.signals import on_sigterm
from race.run.cli_pilot import pilot, worker
from race.run.cli_support import (ALLOW_APPROXIMATE, BAD_INPUT, FORCE_HELP, FULL_RUN_HELP, PLOT_HELP, draw, echo,
                                  exit_aborted, exit_internal, exit_one_line, output_format)
from race.stats.report import FORMATS


class OneLineGroup(click.Group):
    """The ``race`` group: every error is exactly one line on stderr. Bad input (click's usage errors,
    RACE's validation errors: race.run.cli_support.BAD_INPUT) is ``Error: …`` and exit 2, with no
    ``Usage:`` / ``Try`` lines; an internal error is one line naming it and the file its traceback was
    saved to (exit 1). Here, at the top, so the commands are called down the layers, not back up."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        on_sigterm()
        empty = next((i for i, a in enumerate(argv)
                      if not (str(a).split("=", 1)[-1] if str(a).startswith("--") else str(a)).strip()), None)
        if empty is not None:       # '' would read as "not given" (the default), silently
            named = f"{argv[empty - 1]} " if empty and str(argv[empty - 1]).startswith("-") else "argument "
            exit_one_line(f"{named}{argv[empty]!r} is empty: give a value, or leave the option out", 2)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            exit_one_line(e.format_message(), e.exit_code)
        except click.Abort as e:
            exit_aborted(e, argv)
        except BAD_INPUT as e:
            exit_one_line(str(e) or type(e).__name__, 2)
        except Exception as e:  # noqa: BLE001 — a bug, not bad input: one line, the traceback in a file
            exit_internal(e, argv)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="race-rl", prog_name="race")
def main() -> None:
    """RACE: where should the RL post-training compute go?

    Plans IsoFLOP pilot grids over the update fraction ρ = C_learning / C_total,
    runs them, and classifies the setup as search-, update- or reward-heavy.
    """


main.add_command(pilot)
main.add_command(worker)


@main.command()
@click.option("--model", "model", required=True, help="Hugging Face id (shipped configs answer offline) or a folder with config.json.")
@click.option("--lora-rank", type=click.IntRange(min=1), default=8, show_default=True, help="LoRA rank r on all linear modules.")
@click.option("--prompt-len", type=click.FloatRange(min=0, min_open=True), default=512, show_default=True, help="Expected prompt tokens.")
@click.option("--completion-len", type=click.FloatRange(min=0, min_open=True), default=1024, show_default=True, help="Expected completion tokens.")
@click.option("-n", "--rollouts", type=click.IntRange(min=1), default=8, show_default=True, help="Rollouts per prompt (all trained, μ=1).")
@click.option("--reward-model", default=None, help="A reward model / PRM id or folder (default: rule-based, 0 FLOPs).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@ALLOW_APPROXIMATE
def flops(model: str, lora_rank: int, prompt_len: float, completion_len: float, rollouts: int,
          reward_model: str | None, as_json: bool, allow_approximate: bool) -> None:
    """FLOP accounting for one model: parameters, forward FLOPs per token, and the
    search / learning / reward split of one GRPO step per prompt."""
    from race.flops import formulas as F
    from race.flops.architectures import lora_note, sliding_window_warning
    from race.flops.catalog import load_arch_reading, load_reward_model

    policy = load_arch_reading(model, allow_approximate=allow_approximate)
    arch = policy.arch
    warnings = list(policy.warnings)
    reward = None
    if reward_model:
        warnings += list(load_arch_reading(reward_model, allow_approximate=allow_approximate,
                                           what="reward model").warnings)
        reward = load_reward_model(reward_model, allow_approximate=allow_approximate)
    from race.flops.grid import ENGINE_LEARNING_KW

    lora = F.LoRASpec(rank=lora_rank)
    warnings += [w for w in (sliding_window_warning(arch, prompt_len + completion_len),
                             lora_note(arch, lora.target_modules)) if w]
    summary = F.summarize(arch, lora=lora, prompt_len=prompt_len,
                          completion_len=completion_len, n=rollouts, reward=reward, **ENGINE_LEARNING_KW)
    summary["model_type"] = arch.model_type
    summary["warnings"] = warnings
    from race.core.safeio import one_line

    for w in warnings:              # a model's config.json names parts of them: one line each
        echo(f"warning: {one_line(w)}", err=True)
    if as_json:
        echo(json.dumps(summary, indent=2))
        return
    from tabulate import tabulate

    rows = [[one_line(k), f"{v:.4g}" if isinstance(v, float) else one_line(v)] for k, v in _flatten(summary)]
    echo(tabulate(rows, headers=["quantity", "value"], tablefmt="simple", disable_numparse=True))


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            out += _flatten(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


@main.command()
@click.option("--model", required=True, help="Policy: Hugging Face id, folder with config.json, or race/<shipped tiny model>.")
@click.option("--task", required=True, help="Built-in task, .jsonl / .parquet file (prompt, answer), or HF dataset name.")
@click.option("--full-run", "full_run", required=True, help="FLOPs of the full run being planned, e.g. 5e18.")
@click.option("--reward", default="sparse", show_default=True,
              help="sparse | structured | dense | math | format | prm | proxy-prm | module:function.")
@click.option("--reward-model", default=None, help="PRM id or folder (prm, proxy-prm).")
@click.option("--share", type=float, default=0.1, show_default=True, help="Fraction of the full run spent on pilots.")
@click.option("--grid", default=None, help="Comma-separated ρ targets (default 0.3,0.45,0.6,0.72,0.85).")
@click.option("--seeds", type=click.IntRange(min=1), default=2, show_default=True, help="Seeds per grid point.")
@click.option("--prompt-len", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Expected prompt tokens, chat template included [default: 256; a shipped race/ policy: measured].")
@click.option("--completion-len", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Expected completion tokens [default: 512; a shipped race/ policy: its own].")
@click.option("--max-completion-len", type=click.IntRange(min=1), default=None,
              help="Hard cap on new tokens per rollout [default: 1024; a shipped race/ policy: its own].")
@click.option("--lora-rank", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--gpu-memory", default=None, help="Memory of one GPU, e.g. 80GiB: pick the update micro-batch that fits.")
@click.option("--name", default=None, help="Grid / study name (default: model-reward).")
@click.option("--out", "out_path", default=None, help="Write the YAML here instead of printing it.")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@ALLOW_APPROXIMATE
def init(model: str, task: str, full_run: str, reward: str, reward_model: str | None, share: float,
         grid: str | None, seeds: int, prompt_len: float | None, completion_len: float | None,
         max_completion_len: int | None,
         lora_rank: int, gpu_memory: str | None, name: str | None, out_path: str | None, force: bool,
         allow_approximate: bool) -> None:
    """Write a commented pilot-grid config for MODEL, TASK and reward, sized from the full run:
    the pilots and their held-out evaluation together spend --share of --full-run (pilot_design
    fit: the grid if it fits, else fewer pilots nearest the prior), the header shows RACE's
    arithmetic, and the config is planned before it is written."""
    import os

    from race.config.rules import check_share
    from race.run.newconfig import (EVAL_PROMPTS, design_budget, expected_lengths, fit_grid, init_raw, render_init,
                                    set_warnings, task_sizes)

    check_share(share, "--share")            # before the task and the model are read
    if out_path and os.path.exists(out_path) and not force:
        raise click.UsageError(f"{out_path!r} exists: pass --force to overwrite it, or another --out")
    note, held, train = task_sizes(task)
    prompt_len, completion_len, max_completion_len, lengths = expected_lengths(
        model, task, prompt_len=prompt_len, completion_len=completion_len, max_completion_len=max_completion_len)
    raw, fitted = fit_grid(init_raw(model=model, task=task, full_run=full_run, reward=reward,
                                    reward_model=reward_model, share=share, grid=grid, seeds=seeds,
                                    prompt_len=prompt_len, completion_len=completion_len,
                                    max_completion_len=max_completion_len, gpu_memory=gpu_memory,
                                    lora_rank=lora_rank, name=name,
                                    eval_prompts=min(EVAL_PROMPTS, held or EVAL_PROMPTS),
                                    allow_approximate=allow_approximate), share=share)
    raw, design = design_budget(raw)         # the budget race pilot gives each pilot: held-out evaluation counted
    small = [f"WARNING: {w}" for w in set_warnings(raw, train=train, held=held)]
    note = "\n".join(x for x in (note, lengths, fitted, *small) if x)
    text = render_init(raw, share=share, task_note=note, design=design)
    for line in ([fitted] if fitted else []) + small:
        echo(line, err=True)
    if not out_path:
        echo(text, nl=False)
        return
    from race.core.safeio import write_inside

    try:
        write_inside(os.path.dirname(os.path.abspath(out_path)), os.path.basename(out_path), text, what="--out")
    except OSError as e:
        raise click.UsageError(f"cannot write {out_path!r}: {e.strerror or e}: choose a writable --out") from None
    echo(f"wrote {out_path}: check it with `race plan {out_path}`, run it with `race pilot {out_path}`", err=True)


@main.command()
@click.argument("config_path", metavar="[CONFIG.yaml]", required=False)
@click.option("--budget", default=None, help="FLOPs per pilot (overrides the config), e.g. 2e17.")
@click.option("--grid", default=None, help="Comma-separated ρ targets, e.g. 0.3,0.5,0.7.")
@click.option("--seeds", type=click.IntRange(min=1), default=None, help="Seeds per grid point.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--gpu-memory", default=None, help="Memory of one GPU, e.g. 80GiB: refuse schedules whose "
              "estimated peak exceeds it (overrides the config's gpu_memory).")
@click.option("--full-run", "full_run", default=None, metavar="F",
              help="FLOPs of the full run the pilots advise, e.g. 6e12: also state what the grid costs of it, what a "
                   "share of it buys, and what pilots are worth against the prior (docs/pilot.md).")
@click.option("--share", type=float, default=None,
              help="With --full-run: the share of the full run for pilots, held-out evaluation counted "
                   "(default: the config's pilot_share, 0.1).")
@click.option("--design", default=None, metavar="[grid|fit|flat|prior|halving]",
              help="With --full-run: how the share becomes pilots: fit (the grid if it fits, else fewer pilots "
                   "nearest the prior, else none), flat (the grid or a refusal), prior (no pilots), halving (every "
                   "pilot to B/11, the best half on to B, or a refusal), grid (the config as written, whatever the "
                   "share) (docs/pilot.md).  "
                   "[default: the config's pilot_design, else fit]")
@ALLOW_APPROXIMATE
def plan(config_path: str | None, budget: str | None, grid: str | None, seeds: int | None, fmt: str,
         as_json: bool, gpu_memory: str | None, full_run: str | None, share: float | None, design: str | None,
         allow_approximate: bool) -> None:
    """Plan the IsoFLOP grid of CONFIG.yaml: one GRPO schedule per ρ with its FLOP breakdown; with
    --full-run F, what the pilots cost of F, what a share of F buys, and what pilots are worth.

    With no CONFIG, plans the embedded default grid (what `race pilot` with no config runs)."""
    import os

    from race.flops.grid import plan_grid
    from race.run.api import build_config
    from race.stats.report import render_plan

    fmt = output_format(fmt, as_json)
    cfg = build_config(config_path).with_overrides(budget=budget, grid=grid, seeds=seeds, gpu_memory=gpu_memory,
                                                  allow_approximate_flops=allow_approximate or None)
    if cfg.models:                       # a grid over policies: one plan per policy, same budget per pilot
        from race.run.multimodel import part_configs
        from race.stats.report import heading

        parts = [(label, render_plan(plan_grid(part), fmt)) for label, part in part_configs(cfg)]
        if fmt == "json":
            from race.stats.report import SCHEMA_VERSION

            echo(json.dumps({"schema_version": SCHEMA_VERSION, "kind": "models-plan",
                                   "parts": {k: json.loads(v) for k, v in parts}}, indent=2))
        else:
            echo("\n".join(f"{heading(f'policy {k}', fmt)}\n\n{v}" for k, v in parts), nl=False)
        return
    from race.config.configfile import parse_flops

    for given, what in ((share, "--share is the share of a full run"),
                        (design, "--design says how a share of a full run becomes pilots")):
        if given is not None and full_run is None:
            raise click.UsageError(f"{what}: give --full-run F too")
    sized = cfg.pilot_design != "grid"          # a config that sizes its own pilots (race init's): its design and share
    design = design or (cfg.pilot_design if sized else "fit")
    share = share if share is not None else cfg.pilot_share
    full = parse_flops(full_run, "--full-run") if full_run is not None else None
    if full is not None and not full > float(cfg.budget):      # as race probe and the range at F: F must exceed B
        raise click.UsageError(f"--full-run {full:.3g} is not above the pilot budget {float(cfg.budget):.3g}: each pilot "
                               "already costs that much; give the full run's FLOPs (F > B), or a smaller --budget")
    planned = plan_grid(cfg)
    if full is None:
        echo(render_plan(planned, fmt), nl=False)
    else:
        from race.flops.grid import eval_flops, policy_arch
        from race.stats.pilotdesign import render_share

        ev = eval_flops(cfg, policy_arch(cfg), planned.prompt_len, planned.completion_len)
        echo(render_share(planned, full_run=full, share=share, eval_flops=ev, design=design, fmt=fmt), nl=False)
    from race.run.newconfig import DATA_SUFFIXES, set_warnings, task_sizes
    from race.core.safeio import one_line

    if cfg.task.endswith(DATA_SUFFIXES) and os.path.isfile(cfg.task):     # a local dataset: is it big enough?
        _, held, train = task_sizes(cfg.task)
        for line in set_warnings(cfg, train=train, held=min(held, cfg.eval.prompts) if held else held):
            echo(f"warning: {one_line(line)}", err=True)


@main.command()
@click.argument("results_path", metavar="[RESULTS.json]", required=False)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--refit", is_flag=True, help="Re-run fit → bootstrap → classify from the stored pilots.")
@click.option("--storage", default=None, metavar="URL", help="Read the pilots from this optuna storage instead.")
@click.option("--study", default=None, help="Study name in --storage.")
@click.option("--plot", "plot_path", default=None, metavar="FILE", help=PLOT_HELP)
@click.option("--full-run", "full_run", default=None, metavar="F", help=FULL_RUN_HELP)
@click.option("--force-forecast", "force_forecast", is_flag=True, help=FORCE_HELP)
@click.option("--pool", "pool", multiple=True, metavar="RESULTS.json",
              help="Pool the checkpoints of another results file of the same setup (another budget per pilot) "
                   "into the forecast; repeatable.")
def report(results_path: str | None, fmt: str, refit: bool, storage: str | None, study: str | None,
           plot_path: str | None, full_run: str | None, force_forecast: bool, pool: tuple[str, ...]) -> None:
    """Render the diagnosis stored in RESULTS.json (or a folder holding it), or from an optuna
    storage alone (--storage URL --study NAME). With --full-run F (or full_run_budget in the
    config): the forecast at F from the stored checkpoints, without re-running any pilot."""
    from race.stats.forecast import with_forecast
    from race.stats.report import render_diagnosis
    from race.stats.results import load_results

    if plot_path:
        from race.run.plot import check_plot_path

        check_plot_path(plot_path)
    if storage or study:
        if not (storage and study) or results_path:
            raise click.UsageError("report from storage takes --storage URL and --study NAME (and no RESULTS.json)")
        from race.run.store import load_results as load_stored

        results = load_stored(storage, study)
    elif results_path:
        from race.run.multimodel import is_joint

        if is_joint(results_path):       # a grid over models: the joint view, recomputed from its parts
            _report_models(results_path, fmt, refit=refit, plot_path=plot_path, rest=(full_run, force_forecast, pool))
            return
        results = load_results(results_path)
    else:
        raise click.UsageError("give RESULTS.json (or its folder), or --storage URL --study NAME")
    from race.config.configfile import parse_flops

    full = parse_flops(full_run, "--full-run") if full_run is not None else None
    others = [load_results(p) for p in pool]
    diagnosis = with_forecast(results, full_run_budget=full, force=force_forecast, pool=others, refit=refit)
    echo(render_diagnosis(diagnosis, fmt), nl=False)
    if plot_path:
        from dataclasses import replace

        draw(replace(results, diagnosis=diagnosis), plot_path, False)


def _report_models(path: str, fmt: str, *, refit: bool, plot_path: str | None, rest: tuple) -> None:
    from dataclasses import replace

    from race.run.multimodel import joint_view, load_parts, render_joint
    from race.stats.results import diagnose_results

    if any(rest):
        raise click.UsageError(f"{path!r} is a grid over models: forecasts are per policy (race report "
                               "DIR/LABEL --full-run F)")
    parts = load_parts(path)
    if refit:
        parts = [(label, replace(r, diagnosis=diagnose_results(r, refit=True))) for label, r in parts]
    echo(render_joint(joint_view(parts), fmt), nl=False)
    if plot_path:
        from race.run.plot import plot_models

        plot_models(path, plot_path)
        echo(f"figure → {plot_path}", err=True)


@main.command()
@click.argument("source", metavar="[RESULTS.json|DIR|CONFIG.yaml]", required=False)
@click.option("--for", "trainer", required=True, metavar="TRAINER",
              help="The trainer of the full run: trl, verl or openrlhf.")
@click.option("--full-run", "full_run", default=None, metavar="F",
              help="FLOPs of the full run, e.g. 1e20 (default: the config's full_run_budget).")
@click.option("--rho", default=None, metavar="R",
              help="The ρ to run at, in (0, 1) (default for results: the recommended range's centre; "
                   "required for a CONFIG).")
@click.option("--gpus", type=click.IntRange(1, 4096), default=None,
              help="GPUs per node the full run has: every count and batch of the recipe divides on them "
                   "(default: 8 for verl and OpenRLHF, as theirs; 1 process for TRL).")
@click.option("--nodes", type=click.IntRange(1, 4096), default=1, show_default=True, help="Nodes of the full run.")
@click.option("--storage", default=None, metavar="URL", help="Read the pilots from this optuna storage instead.")
@click.option("--study", default=None, help="Study name in --storage.")
@click.option("--emit", "emit_dir", default=None, metavar="DIR",
              help="Write the task's splits and RACE's reward module in DIR, as the trainer reads them, and point "
                   "the recipe at them (without it: placeholders the trainer refuses). A DIR that holds anything is "
                   "refused unless --force.")
@click.option("--force", is_flag=True,
              help="With --emit: replace RACE's own files in a non-empty DIR (each named on stderr); nothing else "
                   "there is touched.")
@click.option("--format", "fmt", type=click.Choice(("text", "yaml", "json")), default="text", show_default=True,
              help="text: configuration and FLOP statement; yaml: the trainer's configuration (TRL: for "
                   "`trl grpo --config`; verl: the overrides nested; not OpenRLHF, which reads flags only); "
                   "json: everything.")
def recipe(source: str | None, trainer: str, full_run: str | None, rho: str | None, gpus: int | None, nodes: int,
           storage: str | None, study: str | None, emit_dir: str | None, force: bool, fmt: str) -> None:
    """The full-run configuration for TRL, verl or OpenRLHF at the recommended ρ (or --rho): prompts
    per step, generations, mini-batches so that μ optimizer steps follow each rollout batch, steps
    from the full-run budget, the √B learning rate, LoRA, lengths, loss, β, temperature, sized for
    --gpus × --nodes; with RACE's FLOP count of it as that trainer runs it (docs/recipes.md)."""
    from race.fullrun.recipes import check_format, render_recipe
    from race.fullrun.recipes import recipe as make_recipe

    check_format(trainer, fmt)             # before a file is emitted
    if storage or study:
        if not (storage and study) or source:
            raise click.UsageError("a recipe from storage takes --storage URL and --study NAME (and no SOURCE)")
        from race.run.store import load_results as load_stored

        source = load_stored(storage, study)
    elif not source:
        raise click.UsageError("give RESULTS.json (or its folder) or CONFIG.yaml, or --storage URL --study NAME")
    if emit_dir is not None and not emit_dir.strip():
        raise click.UsageError(f"--emit {emit_dir!r}: expected the folder to write the task's splits and reward module in")
    if force and not emit_dir:
        raise click.UsageError("--force replaces files of --emit DIR: give --emit DIR")
    replaced = []
    if emit_dir:
        from race.fullrun.emit import check_target

        replaced = check_target(emit_dir, str(trainer).lower(), force=force)   # before anything is computed
    rec = make_recipe(source, trainer=trainer, full_run_budget=full_run, rho=rho, gpus=gpus, nodes=nodes,
                      emit_dir=emit_dir, force=force)
    if emit_dir:
        echo(f"wrote the task's splits and race_reward.py in {emit_dir} for {rec.version}"
              + (f"; replaced RACE's own {', '.join(replaced)} (--force)" if replaced else ""), err=True)
    echo(render_recipe(rec, fmt), nl=False)


@main.command()
@click.argument("results_path", metavar="RESULTS.json|DIR")
@click.option("--full-run", "full_run", required=True, metavar="F", help="FLOPs of the full run whose length is tested.")
@click.option("--rho", default=None, metavar="R", help="The ρ to probe (default: the grid's recommended ρ).")
@click.option("--lr", default=None, metavar="ETA", help="The learning rate to probe (default: the full run's at F).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--quiet", is_flag=True, help="No plan line and no progress lines on stderr.")
def probe(results_path: str, full_run: str, rho: str | None, lr: str | None, device: str, fmt: str,
          quiet: bool) -> None:
    """Test the learning rate at the full run's length: one run at the recommended ρ with the full
    run's optimizer-step count at 1 prompt per step, capped at a quarter of the pilot grid's compute
    (race/fullrun/probe.py). Its record goes into RESULTS.json; prints the report with the stability line
    and the rate for F."""
    import os

    from race.run.api import run_probe
    from race.config.configfile import parse_flops
    from race.stats.report import render_diagnosis

    F = parse_flops(full_run, "--full-run")
    r = _float_in(rho, "--rho", "a ρ in (0, 1)") if rho is not None else None
    eta = _float_in(lr, "--lr", "a learning rate in (0, 1)") if lr is not None else None
    if results_path.endswith(".gz"):
        raise click.UsageError(f"{results_path!r} is compressed: race probe stores its record in the results "
                               "file, so give an uncompressed results.json (or its folder)")
    out = results_path if results_path.endswith(".json") else os.path.join(results_path, "results.json")
    say = None if quiet else (lambda line: echo(line, err=True))
    results = run_probe(results_path, full_run_budget=F, rho=r, lr=eta, device=device, out=out, announce=say,
                        progress=say)
    echo(render_diagnosis(results.diagnosis, fmt), nl=False)


def _float_in(raw: str, name: str, expected: str) -> float:
    try:
        x = float(raw)
    except ValueError:
        raise click.UsageError(f"{name} {raw!r} is not a number: expected {expected}") from None
    if not 0.0 < x < 1.0:
        raise click.UsageError(f"{name} {raw!r} is out of range: expected {expected}")
    return x


@main.command()
@click.argument("paths", nargs=-1, metavar="RESULTS.json|DIR ...")
@click.option("--target", default=None, help="Evaluation target to compare (default: each run's primary target).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
def compare(paths: tuple[str, ...], target: str | None, fmt: str) -> None:
    """Compare pilot grids side by side (reward systems, models, budgets): one row per run with
    its verdict, ρ range, slope, feedback share and wall time; for one setup piloted at several
    budgets, whether the response to ρ moves with budget."""
    from race.run.compare import load_runs, render_comparison

    echo(render_comparison(load_runs(paths, target=target), fmt), nl=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
