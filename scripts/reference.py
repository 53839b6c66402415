"""The generated reference pages: docs/reference/cli.md from the click commands,
docs/reference/config.md from the config dataclasses (race/config/configfile.py: fields, types, defaults and
the comment beside each field) with the schema's ranges (race/config/schema.py CONSTRAINTS, and the upper bounds of
race/config/rules.py UPPER_BOUNDS), and
docs/reference/api.md from the public Python names (``race.__all__`` and the modules a user calls:
their signatures and docstrings).

    python scripts/reference.py --write      # regenerate both pages
    python scripts/reference.py --check      # exit 1 when a page differs (tests/test_meta.py runs it)

One source of truth: a field or an option documented here is documented where it is defined.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "reference"
WIDTH = 100


def cli_page() -> str:
    import click

    from race.run.cli import main

    lines = ["# Command-line reference", "",
             "Generated from the click commands by `python scripts/reference.py --write`; do not edit by hand.", ""]
    with click.Context(main, info_name="race", max_content_width=WIDTH, terminal_width=WIDTH) as ctx:
        lines += ["## race", "", "```text", main.get_help(ctx).rstrip(), "```", ""]
        for name in sorted(main.list_commands(ctx)):
            cmd = main.get_command(ctx, name)
            with click.Context(cmd, info_name=name, parent=ctx, max_content_width=WIDTH,
                               terminal_width=WIDTH) as sub:
                lines += [f"## race {name}", "", "```text", cmd.get_help(sub).rstrip(), "```", ""]
    return "\n".join(lines)


def _comments(cls: type) -> dict[str, str]:
    """field → the comment beside it in race/config/configfile.py (and the comment-only lines under it)."""
    import inspect

    src, start = inspect.getsourcelines(cls)
    tree = ast.parse("".join(src).replace("\n    ", "\n", 0))
    body = tree.body[0].body
    out: dict[str, str] = {}
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            i = node.end_lineno - 1
            text = []
            line = src[i]
            if "#" in line:
                text.append(line.split("#", 1)[1].strip())
                j = i + 1
                while j < len(src) and src[j].strip().startswith("#"):
                    text.append(src[j].strip()[1:].strip())
                    j += 1
            out[node.target.id] = " ".join(text)
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        v = f.default
    elif f.default_factory is not dataclasses.MISSING:        # type: ignore[misc]
        v = f.default_factory()                                # type: ignore[misc]
        if dataclasses.is_dataclass(v):
            return "(section)"
    else:
        return "required"
    if isinstance(v, tuple):
        v = list(v)
    return f"`{v!r}`" if v is not None else "`null`"


def config_page() -> str:
    from race.config import configfile as C
    from race.config.rules import UPPER_BOUNDS, bound_text
    from race.config.schema import CONSTRAINTS

    sections = [("", C.GridConfig)] + [(name, cls) for name, cls in C._SECTIONS.items()] + [
        ("eval.tasks[]", C.EvalTask)]
    lines = ["# Config reference", "",
             "Every field of a pilot-grid config (YAML), with its type, default, range and meaning. Generated from",
             "race/config/configfile.py and race/config/schema.py by `python scripts/reference.py --write`; do not edit by hand.",
             "Unknown keys are refused, and so are values of the wrong type, each in one line naming the field.", ""]
    for prefix, cls in sections:
        notes = _comments(cls)
        lines += [f"## `{prefix}`" if prefix else "## top level", "",
                  "| field | type | default | range | meaning |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix and not prefix.endswith("[]") else f.name
            rng = ", ".join(f"{k} {v}" for k, v in CONSTRAINTS.get(key, {}).items()).replace("ge ", "≥ ") \
                .replace("gt ", "> ").replace("le ", "≤ ")
            if key in UPPER_BOUNDS:                     # race.config.rules' bounds, each with its reason in the error
                rng = ", ".join(filter(None, (rng, f"≤ {bound_text(UPPER_BOUNDS[key][0])}")))
            typ = str(f.type).replace("|", "or")
            meaning = notes.get(f.name, "").replace("|", "/")
            if _default(f) == "(section)":
                meaning = meaning or f"the `{f.name}` section below"
            lines.append(f"| `{f.name}` | `{typ}` | {_default(f)} | {rng} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


# the modules whose public functions a planning script calls besides ``race.*`` (docs/guide.md)
API_MODULES = {"race.fullrun.watch": ("Watch", "check_scores", "check_means", "verl_history", "trl_callback"),
               "race.fullrun.probe": ("plan_probe",),
               "race.stats.results": ("probe_for",),
               "race.run.api": ("run_probe",),
               "race.stats.forecast": ("with_forecast",),
               "race.stats.drift": ("range_at",),
               "race.stats.rate": ("full_run_rate",),
               "race.stats.instability": ("stability_at", "find_instability")}


def _entry(qual: str, obj) -> list[str]:
    import inspect

    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        sig = ""
    kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
    doc = inspect.getdoc(obj) or ""
    if kind == "class" and doc.startswith(obj.__name__ + "("):      # a dataclass's generated signature line
        doc = ""
    head = f"`{qual}` (a {type(obj).__name__})" if kind == "value" else "```python\n" + qual + sig + "\n```"
    out = [f"### `{qual}`", "", head, ""]
    if doc:
        out += [doc, ""]
    return out


def api_page() -> str:
    import importlib

    import race

    lines = ["# Python reference", "",
             "The public names of `race` and the functions a planning script calls, with their signatures and",
             "docstrings. Generated by `python scripts/reference.py --write`; do not edit by hand.", "",
             "## `race`", ""]
    for name in sorted(n for n in race.__all__ if n != "__version__"):
        lines += _entry(f"race.{name}", getattr(race, name))
    for module, names in API_MODULES.items():
        mod = importlib.import_module(module)
        lines += [f"## `{module}`", ""]
        for name in names:
            lines += _entry(f"{module}.{name}", getattr(mod, name))
    return "\n".join(lines)


PAGES = {"cli.md": cli_page, "config.md": config_page, "api.md": api_page}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    stale = []
    for name, make in PAGES.items():
        text = make() + "\n"
        path = OUT / name
        if args.write:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        elif not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path.relative_to(ROOT)))
    if stale:
        print(f"stale: {', '.join(stale)}: run python scripts/reference.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
