"""What every ``race`` command shares: one-line errors, help in groups, safe terminal output.

Bad input ends with a one-line ``Error: ...`` and exit code 2, never a traceback (``BAD_INPUT``,
``exit_one_line``; the ``race`` group, race.run.cli.OneLineGroup, catches them); an unexpected error
keeps its traceback in a file the line names; a stopped command says what it kept (``what_is_kept``);
text from results files, configs and models is shown with its control characters escaped (``echo``).
``PilotCommand`` groups ``race pilot``'s options in its help and hands them to the command in the same
groups.

Invariants: no torch, transformers or optuna at import; every message one line.
"""
from __future__ import annotations

import sys
from typing import Any

import click

from race.core.signals import Terminated
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


# RACE's validation errors (race.RaceError is a ValueError) and a missing file: the user's input, one line, exit 2
BAD_INPUT = (ValueError, FileNotFoundError, KeyError)


def redacted(text: str, argv: list[str]) -> str:
    """``text`` without the passwords of any storage URL among the command's arguments."""
    from race.core import urls

    for arg in argv:
        if "://" in arg:
            text = urls.redact(text, arg)
    return text


def save_traceback(argv: list[str]) -> str:
    """Write the current exception's traceback (storage passwords redacted) to a file; its path."""
    import os
    import tempfile
    import time
    import traceback

    text = redacted("race " + " ".join(argv) + "\n\n" + traceback.format_exc(), argv)
    path = os.path.join(tempfile.gettempdir(), f"race-error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
    from race.core.safeio import write_inside

    return write_inside(os.path.dirname(path), os.path.basename(path), text, what="traceback file")


def exit_one_line(text: str, code: int) -> None:
    """End the command with exactly one line on stderr: ``Error: …`` (the text's first line, kept short)."""
    echo(f"Error: {error_line(text)}", err=True)
    sys.exit(code)


def exit_aborted(e: BaseException, argv: list[str]) -> None:
    """Ctrl-C (``Aborted!``, exit 1) or SIGTERM (one line saying what the stopped command kept, exit 143)."""
    if isinstance(e.__cause__, Terminated) or isinstance(e.__context__, Terminated):
        exit_one_line(f"terminated (SIGTERM){what_is_kept(argv)}", 143)
    echo("Aborted!", err=True)
    sys.exit(1)


def exit_internal(e: Exception, argv: list[str]) -> None:
    """A bug, not bad input: one line naming it and the file its traceback was saved to (exit 1); a
    storage the machine failed under (a full disk) is named instead (exit 2)."""
    named = storage_failure(e, argv)
    if named:
        exit_one_line(named, 2)
    path = save_traceback(argv)
    what = redacted(error_line(f"{type(e).__name__}: {e}"), argv)
    echo(f"Error: internal error ({what}); traceback saved to {path}", err=True)
    sys.exit(1)


def storage_failure(e: BaseException, argv: list[str]) -> str | None:
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


class Sectioned(click.Command):
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


ADAPTIVE_GROUP = "Adaptive grid (one concept: --adaptive, its policy and its share)"


class PilotCommand(Sectioned):
    """``race pilot``: its options in the groups its help shows, and handed to the command the same way."""

    SECTIONS = {
        "Grid": ("budget", "seeds", "grid", "models", "thorough", "extend", "allow_approximate"),
        "Engine": ("backend", "workers", "device", "engine", "retries", "heartbeat"),
        "Storage": ("storage", "study", "import_pilots"),
        ADAPTIVE_GROUP: ("adaptive", "adaptive_policy", "adaptive_share", "halving_eta", "halving_rungs", "halving_keep"),
        "Full run": ("full_run", "design", "share", "force_forecast", "probe_f"),
        "Output": ("out_dir", "fmt", "as_json", "quiet", "plot_path", "profile"),
    }

    @classmethod
    def grouped(cls, given: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The command's keyword arguments, by the groups of its help (every one in exactly one group)."""
        groups = {heading: {n: given[n] for n in names} for heading, names in cls.SECTIONS.items()}
        placed = {n for names in cls.SECTIONS.values() for n in names}
        assert placed == set(given), sorted(set(given) ^ placed)
        return groups


def what_is_kept(argv: list[str]) -> str:
    """What a stopped command leaves behind, for its last line: a grid's finished pilots are in its
    storage; a probe is one run, written only when it ends."""
    command = next((a for a in argv if not a.startswith("-")), "")
    if command in ("pilot", "worker"):
        return "; finished pilots stay in the storage: the same command resumes"
    if command == "probe":
        return "; the probe is one run, stored only when it ends: the same command runs it again from the start"
    return ""


# an error line longer than this (a value quoted whole somewhere; race.core.safeio.quote keeps a value to
# ~200 characters) keeps its head (what is wrong, the value) and its tail (what to do)
LINE_CHARS, LINE_HEAD, LINE_TAIL = 500, 330, 150


def error_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else "error"
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_HEAD]} […{len(line) - LINE_HEAD - LINE_TAIL:,} characters cut…] {line[-LINE_TAIL:]}"


def echo(message: Any = None, **kw: Any) -> None:
    """click.echo with every control character shown as an escape (race.core.safeio.terminal_safe): text
    from results files, configs and models never drives the terminal."""
    from race.core.safeio import terminal_safe

    click.echo(terminal_safe(message) if isinstance(message, str) else message, **kw)


def full_run_budget(full_run: str | None, force: bool, configured: float | None) -> float | None:
    """The full-run budget a forecast is made for (--full-run over the config's), checked before
    anything runs; --force-forecast without one is refused."""
    from race.config.configfile import parse_flops

    full = parse_flops(full_run, "--full-run") if full_run is not None else configured
    if force and full is None:
        raise click.UsageError("--force-forecast needs --full-run F (FLOPs of one full run) or full_run_budget "
                               "in the config")
    return full


def output_format(fmt: str, as_json: bool) -> str:
    """The format a command prints: ``--json`` is ``--format json``; with another ``--format`` too it
    is refused in one line (it silently won before)."""
    if as_json and fmt not in ("text", "json"):
        raise click.UsageError(f"--json means --format json, but --format {fmt} was given too: give one of them")
    return "json" if as_json else fmt


def draw(results: Any, path: str, quiet: bool) -> None:
    from race.run.plot import plot_results

    plot_results(results, path)
    if not quiet:
        echo(f"figure → {path}", err=True)


class Failed(click.ClickException):
    """Pilots that failed after their retries: one line, exit 2, finished pilots kept."""

    exit_code = 2
