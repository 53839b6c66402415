"""The path of one ``race pilot`` through the packages, measured with a call trace (docs/architecture.md).

    python scripts/call_trace.py [--markdown]

Runs a small ``race pilot`` of the embedded tiny grid in this process under ``sys.setprofile`` (its
pilots run in their own processes), then one of its pilots in this process (``run_pilot``, the
engine's path), and records every call from one RACE module into another: the caller is the
nearest RACE frame above the callee (library frames in between, such as click or torch, are
skipped). It prints each hop once, in the order it was first taken, with the functions on both
ends, and marks a hop that goes back up the layers of ``.importlinter`` (a callback, or an import
inside a function that the layers allow only because it is lazy) with ↑.

Counted: distinct (caller module, callee module) pairs. A hop inside one module is not a hop; nor is
a module's import running (``<module>``) or a generator expression of one module read by another
(data handed over, not a call). The path is the longest chain of modules on one call stack: the
route from the command down to a GRPO update.
"""
from __future__ import annotations

import argparse
import configparser
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def layer_ranks() -> dict[str, tuple[int, int]]:
    """Each name placed in .importlinter → (its package's layer, its layer inside the package); 0 is
    the top."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")

    def rows(section: str) -> list[list[str]]:
        return [[n.strip() for n in line.replace(":", "|").split("|") if n.strip()]
                for line in cfg[section]["layers"].splitlines() if line.strip()]

    ranks: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(rows("importlinter:contract:packages")):
        for pkg in row:
            ranks[pkg] = (i, 0)
            section = f"importlinter:contract:{pkg.split('.')[-1]}"
            if cfg.has_section(section):
                for j, inner in enumerate(rows(section)):
                    for name in inner:
                        ranks[name] = (i, j)
    return ranks


def rank_of(module: str, ranks: dict[str, tuple[int, int]]) -> tuple[int, int] | None:
    parts = module.split(".")
    for k in range(len(parts), 1, -1):
        if ".".join(parts[:k]) in ranks:
            return ranks[".".join(parts[:k])]
    return None


class Tracer:
    """``sys.setprofile`` hook: the cross-module hops between RACE modules, first occurrence kept."""

    def __init__(self) -> None:
        self.race_dir = str(ROOT / "race") + os.sep
        self.hops: dict[tuple[str, str], tuple[str, str]] = {}
        self.path: list[str] = []
        self.names: dict[str, str | None] = {}    # filename → its module, worked out once (every call asks)

    def module(self, filename: str) -> str | None:
        try:
            return self.names[filename]
        except KeyError:
            pass
        name = None
        if filename.startswith(self.race_dir):
            parts = list(Path(filename).relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join(parts)
        self.names[filename] = name
        return name

    def __call__(self, frame, event, arg):  # noqa: ANN001, ARG002
        if event != "call":
            return
        callee = self.module(frame.f_code.co_filename)
        if callee is None or frame.f_code.co_name in ("<module>", "<genexpr>"):
            return
        up = frame.f_back
        while up is not None and self.module(up.f_code.co_filename) is None:
            up = up.f_back
        if up is None:
            return
        caller = self.module(up.f_code.co_filename)
        if caller != callee and (caller, callee) not in self.hops:
            self.hops[(caller, callee)] = (up.f_code.co_name, frame.f_code.co_name)
        if caller != callee:
            chain, f = [], frame
            while f is not None:
                m = self.module(f.f_code.co_filename)
                if m is not None and (not chain or chain[-1] != m):
                    chain.append(m)
                f = f.f_back
            if len(chain) > len(self.path):
                self.path = chain[::-1]


def trace_pilot(out: str) -> Tracer:
    from race.run.cli import main

    t = Tracer()
    args = ["pilot", "--budget", "2e10", "--grid", "0.5,0.7,0.85", "--seeds", "2", "--workers", "1",
            "--engine", "solo", "--out", out, "--quiet", "--format", "json"]
    import contextlib
    import io

    sys.setprofile(t)
    try:
        with contextlib.redirect_stdout(io.StringIO()):          # the verdict's JSON: not this script's output
            main.main(args, standalone_mode=False)
    finally:
        sys.setprofile(None)
    from race.stats.results import load_results

    res = load_results(os.path.join(out, "results.json"))
    from race.config.configfile import config_from_dict
    from race.core.records import Schedule
    from race.engine.pilot import run_pilot

    cfg = config_from_dict(res.config)
    schedule = Schedule.from_dict(res.plan["schedules"][0])
    sys.setprofile(t)
    try:
        run_pilot(cfg, schedule, seed=0)
    finally:
        sys.setprofile(None)
    return t


def hop_rows(t: Tracer, ranks: dict[str, tuple[int, int]]) -> list[tuple[str, str, str, str, str]]:
    """(caller, its function, callee, its function, "↑" when the hop goes back up a layer) per hop, in order."""
    rows = []
    for (caller, callee), (fa, fb) in t.hops.items():
        ra, rb = rank_of(caller, ranks), rank_of(callee, ranks)
        up = ra is not None and rb is not None and rb < ra
        rows.append((caller.removeprefix("race."), fa, callee.removeprefix("race."), fb, "↑" if up else ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="a Markdown table (docs/architecture.md)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        t = trace_pilot(os.path.join(tmp, "run"))
    rows = hop_rows(t, layer_ranks())
    ups = sum(bool(r[4]) for r in rows)
    modules = {m for pair in t.hops for m in pair}
    packages: dict[tuple[str, str], int] = {}
    for caller, callee in t.hops:
        a, b = caller.split(".")[1], callee.split(".")[1]
        if a != b and not (a.startswith("__") or b.startswith("__")):
            packages[(a, b)] = packages.get((a, b), 0) + 1
    if args.markdown:
        print("| from package | to package | module pairs |\n|---|---|---|")
        for (a, b), n in sorted(packages.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"| `{a}/` | `{b}/` | {n} |")
        print("\nBack up a layer:\n")
        for a, fa, b, fb, up in rows:
            if up:
                print(f"- `{a}.{fa}` → `{b}.{fb}`")
    else:
        for i, (a, fa, b, fb, up) in enumerate(rows, 1):
            print(f"{i:3d} {up:1s} {a}.{fa} → {b}.{fb}")
    print(f"\n{len(rows)} cross-module hops through {len(modules)} modules; {ups} back up a layer")
    print("the deepest path: " + " → ".join(m.removeprefix("race.") for m in t.path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
