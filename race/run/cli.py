"""The ``race`` command line.

Bad input (unknown model, ρ outside (0, 1), a non-positive budget, a missing
file, malformed YAML) ends with a one-line ``Error: ...`` and exit code 2,
never a traceback.
"""
from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable

import click

from race.stats.report import FORMATS
from race.run.adaptive import ADAPTIVE_POLICIES
from race.run.options import ENGINES
PLOT_HELP = ("Also draw the diagnosis (response to ρ, compute split, training curves; with a forecast, held-out "
             "reward against FLOPs) to FILE: .png, .pdf or .svg.")
ENGINE_HELP = "; ".join(f"{name}: {what}" for name, what in ENGINES.items()) + "."
FULL_RUN_HELP = ("FLOPs of one full run at the chosen ρ, e.g. 6e12: predict held-out reward per ρ there from the "
                 "pilots' checkpoints (overrides the config's full_run_budget; docs/forecast.md).")
FORCE_HELP = "Print the forecast even past the extrapolation factor the backtests support, marked FORCED."
ALLOW_APPROXIMATE = click.option(
    "--allow-approximate", "allow_approximate", is_flag=True,
    help="Count a model type outside RACE's architecture table anyway (as a Llama-style decoder); "
         "every report then carries the warning (config: allow_approximate_flops: true).")


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn RACE's validation errors into click usage errors (exit 2, one line)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except (ValueError, FileNotFoundError, KeyError) as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise click.UsageError(msg) from None

    return wrapper


def _redacted(text: str, argv: list[str]) -> str:
    """``text`` without the passwords of any storage URL among the command's arguments."""
    from race.core import urls

    for arg in argv:
        if "://" in arg:
            text = urls.redact(text, arg)
    return text


def _save_traceback(argv: list[str]) -> str:
    """Write the current exception's traceback (storage passwords redacted) to a file; its path."""
    import os
    import tempfile
    import time
    import traceback

    text = _redacted("race " + " ".join(argv) + "\n\n" + traceback.format_exc(), argv)
    path = os.path.join(tempfile.gettempdir(), f"race-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
    from race.core.safeio import write_inside

    return write_inside(os.path.dirname(path), os.path.basename(path), text, what="traceback file")


class _OneLineGroup(click.Group):
    """A click group whose every error is exactly one line on stderr: ``Error: …`` and exit 2
    for bad input (click's own usage errors included: no ``Usage:`` / ``Try`` lines), and for an
    internal error one line naming it and the file its traceback was saved to (exit 1)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        _on_sigterm()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            _echo(f"Error: {_one_line(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except click.Abort as e:
            if isinstance(e.__cause__, _Terminated) or isinstance(e.__context__, _Terminated):
                _echo(f"Error: terminated (SIGTERM){_what_is_kept(argv)}", err=True)
                sys.exit(143)
            _echo("Aborted!", err=True)
            sys.exit(1)
        except Exception as e:  # noqa: BLE001 — a bug, not bad input: one line, the traceback in a file
            named = _storage_failure(e, argv)
            if named:                    # the machine under the storage (a full disk), not a bug
                _echo(f"Error: {_one_line(named)}", err=True)
                sys.exit(2)
            path = _save_traceback(argv)
            what = _redacted(_one_line(f"{type(e).__name__}: {e}"), argv)
            _echo(f"Error: internal error ({what}); traceback saved to {path}", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _storage_failure(e: BaseException, argv: list[str]) -> str | None:
    """The one line for a storage operation that failed because the machine did (a full disk, an
    I/O error, a read-only file: race.run.store.engine.system_failure), wherever it was raised; None
    otherwise. Loads nothing new: without optuna loaded no storage was used."""
    if "race.run.store" not in sys.modules:
        return None
    from race.run.store.engine import system_failure

    url = next((a.split("=", 1)[1] for a in argv if a.startswith("--storage=")), None) or \
        next((b for a, b in zip(argv, argv[1:]) if a == "--storage"), None)
    try:
        named = system_failure(e, url)
    except Exception:  # noqa: BLE001 — a URL that cannot even be masked: name no storage
        named = system_failure(e, None)
    return str(named) if named else None


class _Sectioned(click.Command):
    """A command whose ``--help`` lists its options under headings (``SECTIONS``: heading → option
    names), the rest under "Other options"."""

    SECTIONS: dict[str, tuple[str, ...]] = {}

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx) if isinstance(p, click.Option)}
        seen: set[str] = set()
        for heading, names in self.SECTIONS.items():
            records = [rows[n] for n in names if rows.get(n)]
            seen.update(names)
            if records:
                with formatter.section(heading):
                    formatter.write_dl(records)
        rest = [r for n, r in rows.items() if r and n not in seen]
        if rest:
            with formatter.section("Other options"):
                formatter.write_dl(rest)


_ADAPTIVE = "Adaptive grid (one concept: --adaptive, its policy and its share)"


class _PilotCommand(_Sectioned):
    """``race pilot``: its options in the groups its help shows, and handed to the command the same way."""

    SECTIONS = {
        "Grid": ("budget", "seeds", "grid", "models", "thorough", "extend", "allow_approximate"),
        "Engine": ("backend", "workers", "device", "engine", "retries", "heartbeat"),
        "Storage": ("storage", "study", "import_pilots"),
        _ADAPTIVE: ("adaptive", "adaptive_policy", "adaptive_share"),
        "Full run": ("full_run", "force_forecast", "probe_f"),
        "Output": ("out_dir", "fmt", "as_json", "quiet", "plot_path"),
    }

    @classmethod
    def grouped(cls, given: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The command's keyword arguments, by the groups of its help (every one in exactly one group)."""
        groups = {heading: {n: given[n] for n in names} for heading, names in cls.SECTIONS.items()}
        placed = {n for names in cls.SECTIONS.values() for n in names}
        assert placed == set(given), sorted(set(given) ^ placed)
        return groups


def _what_is_kept(argv: list[str]) -> str:
    """What a stopped command leaves behind, for its last line: a grid's finished pilots are in its
    storage; a probe is one run, written only when it ends."""
    command = next((a for a in argv if not a.startswith("-")), "")
    if command in ("pilot", "worker"):
        return "; finished pilots stay in the storage: the same command resumes"
    if command == "probe":
        return "; the probe is one run, stored only when it ends: the same command runs it again from the start"
    return ""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, taken the way Ctrl-C is (the storage keeps every finished pilot), then named."""


def _on_sigterm() -> None:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):  # noqa: ANN001, ARG001
        raise _Terminated()

    try:
        signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        pass


# an error line longer than this (a value quoted whole somewhere; race.core.safeio.quote keeps a value to
# ~200 characters) keeps its head (what is wrong, the value) and its tail (what to do)
LINE_CHARS, LINE_HEAD, LINE_TAIL = 500, 330, 150


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else "error"
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_HEAD]} […{len(line) - LINE_HEAD - LINE_TAIL:,} characters cut…] {line[-LINE_TAIL:]}"


def _echo(message: Any = None, **kw: Any) -> None:
    """click.echo with every control character shown as an escape (race.core.safeio.terminal_safe): text
    from results files, configs and models never drives the terminal."""
    from race.core.safeio import terminal_safe

    click.echo(terminal_safe(message) if isinstance(message, str) else message, **kw)


@click.group(cls=_OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="race-rl", prog_name="race")
def main() -> None:
    """RACE: where should the RL post-training compute go?

    Plans IsoFLOP pilot grids over the update fraction ρ = C_learning / C_total,
    runs them, and classifies the setup as search-, update- or reward-heavy.
    """


@main.command()
@click.option("--model", "model", required=True, help="Hugging Face id (shipped configs answer offline) or a folder with config.json.")
@click.option("--lora-rank", type=click.IntRange(min=1), default=8, show_default=True, help="LoRA rank r on all linear modules.")
@click.option("--prompt-len", type=click.FloatRange(min=0, min_open=True), default=512, show_default=True, help="Expected prompt tokens.")
@click.option("--completion-len", type=click.FloatRange(min=0, min_open=True), default=1024, show_default=True, help="Expected completion tokens.")
@click.option("-n", "--rollouts", type=click.IntRange(min=1), default=8, show_default=True, help="Rollouts per prompt (all trained, μ=1).")
@click.option("--reward-model", default=None, help="A reward model / PRM id or folder (default: rule-based, 0 FLOPs).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@ALLOW_APPROXIMATE
@_user_errors
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
        _echo(f"warning: {one_line(w)}", err=True)
    if as_json:
        _echo(json.dumps(summary, indent=2))
        return
    from tabulate import tabulate

    rows = [[one_line(k), f"{v:.4g}" if isinstance(v, float) else one_line(v)] for k, v in _flatten(summary)]
    _echo(tabulate(rows, headers=["quantity", "value"], tablefmt="simple", disable_numparse=True))


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
@_user_errors
def init(model: str, task: str, full_run: str, reward: str, reward_model: str | None, share: float,
         grid: str | None, seeds: int, prompt_len: float | None, completion_len: float | None,
         max_completion_len: int | None,
         lora_rank: int, gpu_memory: str | None, name: str | None, out_path: str | None, force: bool,
         allow_approximate: bool) -> None:
    """Write a commented pilot-grid config for MODEL, TASK and reward, sized from the full run:
    the budget per pilot is --share of --full-run over grid points × seeds, the header shows
    RACE's arithmetic, and the config is planned before it is written."""
    import os

    from race.run.newconfig import EVAL_PROMPTS, expected_lengths, fit_grid, init_raw, render_init, set_warnings, task_sizes

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
    small = [f"WARNING: {w}" for w in set_warnings(raw, train=train, held=held)]
    note = "\n".join(x for x in (note, lengths, fitted, *small) if x)
    text = render_init(raw, share=share, task_note=note)
    for line in ([fitted] if fitted else []) + small:
        _echo(line, err=True)
    if not out_path:
        _echo(text, nl=False)
        return
    from race.core.safeio import write_inside

    try:
        write_inside(os.path.dirname(os.path.abspath(out_path)), os.path.basename(out_path), text, what="--out")
    except OSError as e:
        raise click.UsageError(f"cannot write {out_path!r}: {e.strerror or e}: choose a writable --out") from None
    _echo(f"wrote {out_path}: check it with `race plan {out_path}`, run it with `race pilot {out_path}`", err=True)


@main.command()
@click.argument("config_path", metavar="CONFIG.yaml")
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
                   "(default 0.1, race init's).")
@ALLOW_APPROXIMATE
@_user_errors
def plan(config_path: str, budget: str | None, grid: str | None, seeds: int | None, fmt: str,
         as_json: bool, gpu_memory: str | None, full_run: str | None, share: float | None,
         allow_approximate: bool) -> None:
    """Plan the IsoFLOP grid of CONFIG.yaml: one GRPO schedule per ρ with its FLOP breakdown; with
    --full-run F, what the pilots cost of F, what a share of F buys, and what pilots are worth."""
    import os

    from race.config.configfile import load_config
    from race.flops.grid import plan_grid
    from race.stats.report import render_plan

    cfg = load_config(config_path).with_overrides(budget=budget, grid=grid, seeds=seeds, gpu_memory=gpu_memory,
                                                  allow_approximate_flops=allow_approximate or None)
    fmt = "json" if as_json else fmt
    if cfg.models:                       # a grid over policies: one plan per policy, same budget per pilot
        from race.run.multimodel import part_configs
        from race.stats.report import heading

        parts = [(label, render_plan(plan_grid(part), fmt)) for label, part in part_configs(cfg)]
        if fmt == "json":
            from race.stats.report import SCHEMA_VERSION

            _echo(json.dumps({"schema_version": SCHEMA_VERSION, "kind": "models-plan",
                                   "parts": {k: json.loads(v) for k, v in parts}}, indent=2))
        else:
            _echo("\n".join(f"{heading(f'policy {k}', fmt)}\n\n{v}" for k, v in parts), nl=False)
        return
    from race.config.configfile import parse_flops

    if share is not None and full_run is None:
        raise click.UsageError("--share is the share of a full run: give --full-run F too")
    full = parse_flops(full_run, "--full-run") if full_run is not None else None
    planned = plan_grid(cfg)
    if full is None:
        _echo(render_plan(planned, fmt), nl=False)
    else:
        from race.stats.design import DEFAULT_SHARE, render_share
        from race.flops.grid import eval_share, policy_arch

        ev = eval_share(cfg, policy_arch(cfg), planned.prompt_len, planned.completion_len)
        _echo(render_share(planned, full_run=full, share=DEFAULT_SHARE if share is None else share, eval_share=ev,
                           fmt=fmt), nl=False)
    from race.run.newconfig import DATA_SUFFIXES, set_warnings, task_sizes
    from race.core.safeio import one_line

    if cfg.task.endswith(DATA_SUFFIXES) and os.path.isfile(cfg.task):     # a local dataset: is it big enough?
        _, held, train = task_sizes(cfg.task)
        for line in set_warnings(cfg, train=train, held=min(held, cfg.eval.prompts) if held else held):
            _echo(f"warning: {one_line(line)}", err=True)


@main.command(cls=_PilotCommand)
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
              help="Which adaptive grid (implies --adaptive): informative (default) or successive halving over ρ.")
@click.option("--adaptive-share", type=float, default=None,
              help="Share of the full grid's pilots an adaptive grid runs (implies --adaptive; default 0.5, "
                   "or the study's own on a resume; a larger share on a resume adds pilots).")
@click.option("--retries", type=int, default=1, show_default=True,
              help="Times a failed pilot (exception, out-of-memory kill) is run again.")
@click.option("--heartbeat", type=int, default=None,
              help="Seconds between heartbeats, stored with the study for all its workers; a pilot is "
                   "abandoned after 3 missed (default 20).")
@click.option("--plot", "plot_path", default=None, metavar="FILE", help=PLOT_HELP)
@click.option("--import-pilots", "import_pilots", default=None, metavar="RESULTS.json",
              help="Record the finished pilots of this results file (same run config, run elsewhere or in a lost "
                   "storage; a grid with fewer seeds or other ρ points is fine) in the study first, so only "
                   "the missing ones run.")
@click.option("--full-run", "full_run", default=None, metavar="F", help=FULL_RUN_HELP)
@click.option("--force-forecast", "force_forecast", is_flag=True, help=FORCE_HELP)
@click.option("--probe", "probe_f", is_flag=True,
              help="With --full-run F: after the grid, test η at F's length (race probe; at most a quarter of the "
                   "grid's compute).")
@click.option("--extend", type=int, default=0, show_default=True, metavar="N",
              help="When the best point is the grid's lowest (highest) ρ, add the next point past that edge and run "
                   "only its seeds, up to N times (race/run/extend.py; each round is its own study, earlier rounds' "
                   "results kept as DIR/results-xK.json).")
@ALLOW_APPROXIMATE
@_user_errors
def pilot(config_path: str | None, **given: Any) -> None:
    """Run real LoRA GRPO pilots on an IsoFLOP ρ grid and print the regime verdict.

    With no CONFIG, runs the embedded default: the shipped tiny policy on arithmetic
    with a sparse reward (about five minutes on a 2-core CPU).
    """
    from race.run.extend import run_extended
    from race.stats.results import failure_message

    g = _PilotCommand.grouped(given)
    grid, out = g["Grid"], g["Output"]
    if out["as_json"] and not out["quiet"]:        # a deprecated alias, kept one release (docs/reference/cli.md)
        _echo("warning: --json is deprecated: use --format json", err=True)
    cfg, full = _pilot_config(config_path, grid, g["Engine"], g["Full run"], out)
    options = _pilot_options(cfg, g)           # every run option checked here, once (race.run.options)
    if cfg.models:
        if options.extend:
            raise click.UsageError("--extend takes one policy's grid: run a grid over models without it")
        _pilot_models(cfg, options, full=full, plot_path=out["plot_path"], fmt=out["fmt"], as_json=out["as_json"])
        return

    def announce() -> None:              # after the checks: a refusal stays one line
        if not options.quiet:
            _echo(f"RACE pilot grid {cfg.name}: {len(cfg.grid)} points × {cfg.seeds} seeds, "
                  f"{cfg.budget:.3g} FLOPs per pilot → {options.out_dir}/results.json", err=True)

    results = run_extended(cfg, options, announce=announce)      # extend 0: run_grid itself
    if results.diagnosis is not None:
        results = _pilot_full_run(results, options, full=full, force=g["Full run"]["force_forecast"],
                                  probe=g["Full run"]["probe_f"])
        _echo(_render(results.diagnosis, "json" if out["as_json"] else out["fmt"]), nl=False)
        if out["plot_path"]:
            _plot(results, out["plot_path"], options.quiet)
    failed = failure_message(results)
    if failed:
        raise _Failed(failed)


def _render(diagnosis: Any, fmt: str) -> str:
    from race.stats.report import render_diagnosis

    return render_diagnosis(diagnosis, fmt)


def _pilot_config(config_path: str | None, grid: dict, engine: dict, full_run: dict, out: dict) -> tuple[Any, float | None]:
    """``race pilot``'s config (CONFIG, or the embedded default / thorough grid, with the Grid group's
    overrides) and the full-run budget, each refused in one line before anything runs."""
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
    full = _full_run(full_run["full_run"], full_run["force_forecast"], cfg.full_run_budget)     # before any pilot runs
    if full_run["probe_f"] and not full:
        raise click.UsageError("--probe tests η at the full run's length: give --full-run F (or full_run_budget)")
    if full_run["probe_f"]:
        from race.fullrun.probe import check_full_run

        check_full_run(cfg.budget, full)            # F ≤ B or past MAX_FACTOR: refused before the grid runs
    return cfg, full


def _pilot_options(cfg: Any, g: dict) -> Any:
    """The run options of ``race pilot``, from its Engine, Storage, Adaptive and Output groups, checked."""
    import os

    from race.run.options import RunOptions

    engine, storage, adaptive, out = g["Engine"], g["Storage"], g[_ADAPTIVE], g["Output"]
    return RunOptions(out_dir=out["out_dir"] or os.path.join("runs", cfg.name), workers=engine["workers"],
                      device=engine["device"], quiet=out["quiet"], storage=storage["storage"], study=storage["study"],
                      adaptive=adaptive["adaptive_policy"] or adaptive["adaptive"], retries=engine["retries"],
                      heartbeat=engine["heartbeat"], adaptive_share=adaptive["adaptive_share"],
                      import_pilots=storage["import_pilots"], engine=engine["engine"],
                      extend=g["Grid"]["extend"]).check()


def _pilot_full_run(results: Any, options: Any, *, full: float | None, force: bool, probe: bool) -> Any:
    """With a full-run budget: the forecast saved with the results, then (``--probe``) the length probe."""
    from race.stats.results import failure_message

    if not full or failure_message(results):
        return results
    from race.run.api import run_probe, save_forecast

    results = save_forecast(results, options.out_dir, full_run_budget=full, force=force)
    if probe:
        say = None if options.quiet else (lambda line: _echo(line, err=True))
        results = run_probe(results, full_run_budget=full, device=options.device, out=options.out_dir, force=force,
                            announce=say, progress=say)
    return results


def _pilot_models(cfg: Any, options: Any, *, full: float | None, plot_path: str | None, fmt: str,
                  as_json: bool) -> None:
    """``race pilot`` of a grid over policies: every part, then the joint report (race.run.multimodel)."""
    from race.run.api import run_models
    from race.run.multimodel import render_joint

    if full is not None:
        raise click.UsageError("--full-run / full_run_budget forecasts one policy's grid: run the grid over models, "
                               "then race report DIR/LABEL --full-run F for each part")
    if options.import_pilots:
        raise click.UsageError("--import-pilots takes one policy's results: import into a part with "
                               "race pilot --out DIR/LABEL, then re-run the grid over models")
    if not options.quiet:
        _echo(f"RACE grid over models {cfg.name}: {len(cfg.models)} policies × {len(cfg.grid)} points × "
              f"{cfg.seeds} seeds, {cfg.budget:.3g} FLOPs per pilot → {options.out_dir}/models.json", err=True)
    view = run_models(cfg, out_dir=options.out_dir, quiet=options.quiet, storage=options.storage, study=options.study,
                      workers=options.workers, device=options.device, adaptive=options.adaptive,
                      adaptive_share=options.adaptive_share, retries=options.retries, heartbeat=options.heartbeat,
                      engine=options.engine)
    _echo(render_joint(view, "json" if as_json else fmt), nl=False)
    if plot_path:
        from race.run.plot import plot_models

        plot_models(options.out_dir, plot_path)
        if not options.quiet:
            _echo(f"figure → {plot_path}", err=True)


def _full_run(full_run: str | None, force: bool, configured: float | None) -> float | None:
    """The full-run budget a forecast is made for (--full-run over the config's), checked before
    anything runs; --force-forecast without one is refused."""
    from race.config.configfile import parse_flops

    full = parse_flops(full_run, "--full-run") if full_run is not None else configured
    if force and full is None:
        raise click.UsageError("--force-forecast needs --full-run F (FLOPs of one full run) or full_run_budget "
                               "in the config")
    return full


def _plot(results: Any, path: str, quiet: bool) -> None:
    from race.run.plot import plot_results

    plot_results(results, path)
    if not quiet:
        _echo(f"figure → {path}", err=True)


class _Failed(click.ClickException):
    """Pilots that failed after their retries: one line, exit 2, finished pilots kept."""

    exit_code = 2


@main.command()
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
@_user_errors
def worker(storage: str, study: str, workers: int | None, device: str, retries: int, wait: float,
           quiet: bool, engine: str, trust_reward: bool) -> None:
    """Join a study (from any machine) and run the pilots no other worker holds.

    Stops when the study needs no more pilots; a pilot whose worker died is taken over
    once its heartbeat is stale."""
    from race.run.workers import run_worker
    done = run_worker(storage, study, workers=workers, device=device, quiet=quiet, retries=retries, wait=wait,
                      engine=engine, trust_reward=trust_reward)
    _echo(f"worker done: {done['ran']} pilots run here ({done['complete']} complete, {done['failed']} failed) "
               f"for study {done['study']!r} in {done['storage']}")


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
@_user_errors
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
    _echo(render_diagnosis(diagnosis, fmt), nl=False)
    if plot_path:
        from dataclasses import replace

        _plot(replace(results, diagnosis=diagnosis), plot_path, False)


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
    _echo(render_joint(joint_view(parts), fmt), nl=False)
    if plot_path:
        from race.run.plot import plot_models

        plot_models(path, plot_path)
        _echo(f"figure → {plot_path}", err=True)


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
@_user_errors
def recipe(source: str | None, trainer: str, full_run: str | None, rho: str | None, gpus: int | None, nodes: int,
           storage: str | None, study: str | None, emit_dir: str | None, force: bool, fmt: str) -> None:
    """The full-run configuration for TRL, verl or OpenRLHF at the recommended ρ (or --rho): prompts
    per step, generations, mini-batches so that μ optimizer steps follow each rollout batch, steps
    from the full-run budget, the √B learning rate, LoRA, lengths, loss, β, temperature, sized for
    --gpus × --nodes; with RACE's FLOP count of it as that trainer runs it (docs/recipes.md)."""
    from race.fullrun.recipes import recipe as make_recipe
    from race.fullrun.recipes import render_recipe

    if storage or study:
        if not (storage and study) or source:
            raise click.UsageError("a recipe from storage takes --storage URL and --study NAME (and no SOURCE)")
        from race.run.store import load_results as load_stored

        source = load_stored(storage, study)
    elif not source:
        raise click.UsageError("give RESULTS.json (or its folder) or CONFIG.yaml, or --storage URL --study NAME")
    if force and not emit_dir:
        raise click.UsageError("--force replaces files of --emit DIR: give --emit DIR")
    replaced = []
    if emit_dir:
        from race.fullrun.emit import check_target

        replaced = check_target(emit_dir, str(trainer).lower(), force=force)   # before anything is computed
    rec = make_recipe(source, trainer=trainer, full_run_budget=full_run, rho=rho, gpus=gpus, nodes=nodes,
                      emit_dir=emit_dir, force=force)
    if emit_dir:
        _echo(f"wrote the task's splits and race_reward.py in {emit_dir} for {rec.version}"
              + (f"; replaced RACE's own {', '.join(replaced)} (--force)" if replaced else ""), err=True)
    _echo(render_recipe(rec, fmt), nl=False)


@main.command()
@click.argument("results_path", metavar="RESULTS.json|DIR")
@click.option("--full-run", "full_run", required=True, metavar="F", help="FLOPs of the full run whose length is tested.")
@click.option("--rho", default=None, metavar="R", help="The ρ to probe (default: the grid's recommended ρ).")
@click.option("--lr", default=None, metavar="ETA", help="The learning rate to probe (default: the full run's at F).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--quiet", is_flag=True, help="No plan line and no progress lines on stderr.")
@_user_errors
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
    say = None if quiet else (lambda line: _echo(line, err=True))
    results = run_probe(results_path, full_run_budget=F, rho=r, lr=eta, device=device, out=out, announce=say,
                        progress=say)
    _echo(render_diagnosis(results.diagnosis, fmt), nl=False)


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
@_user_errors
def compare(paths: tuple[str, ...], target: str | None, fmt: str) -> None:
    """Compare pilot grids side by side (reward systems, models, budgets): one row per run with
    its verdict, ρ range, slope, feedback share and wall time; for one setup piloted at several
    budgets, whether the response to ρ moves with budget."""
    from race.run.compare import load_runs, render_comparison

    _echo(render_comparison(load_runs(paths, target=target), fmt), nl=False)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
