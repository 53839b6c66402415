"""Extending a pilot grid past the edge where its best point lies (``race pilot --extend N``).

A grid whose pilot-best point is its lowest (or highest) ρ has not bracketed the optimum: in the
validation study's development half every such search-heavy grid's full runs peaked below it
(docs/validation.md). ``run_extended`` runs the grid, then, up to N rounds, adds the next point
past that edge (``race.stats.regime.edge_point``: one geometric grid step) as a larger grid that imports
every finished pilot, so only the new point's seeds run. It stops early when the best point is no
longer at an edge, when the next point is unreachable for the schedule (one line says why), or
when pilots failed.

Invariants: round k is its own study, named ``<study>-x<k>`` in the same storage, created with
round 0's calibration, so every imported pilot's schedule is the one its plan holds (import refuses
otherwise); before a round starts, the previous round's results are copied to
``DIR/results-x<k-1>.json`` and imported from there, so no round's record is lost; ``DIR/results.json``
is the last round's. Re-running the same command resumes each round from its study. Adaptive
grids, grids over models and coordinate-only runs (``--workers 0``) are refused up front.
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from typing import Any

from race.run import study          # study.run_grid read at call time (tests replace it there)
from race.config.configfile import GridConfig
from race.core.errors import ConfigError, RaceError
from race.run.options import RunOptions
from race.core.records import TargetVerdict
from race.stats.regime import edge_point
from race.stats.results import Results, failure_message



def boundary_side(v: TargetVerdict) -> str | None:
    """"below" when the pilot-best point is the grid's lowest ρ, "above" at its highest, else None."""
    targets = [p.rho_target for p in v.points]
    if v.best_rho == min(targets):
        return "below"
    if v.best_rho == max(targets):
        return "above"
    return None


def next_grid(config: GridConfig, results: Results) -> tuple[float, str] | None:
    """The point the next round adds and its side, or None when the grid needs no extension."""
    if results.diagnosis is None or failure_message(results):
        return None
    side = boundary_side(results.diagnosis.primary)
    point = edge_point(side, config.grid)
    return (point, side) if point is not None and side is not None else None


def run_extended(config: GridConfig, options: RunOptions | None = None, *, banner: str | None = None,
                 **kw: Any) -> Results:
    """Run ``config``'s grid, then up to ``options.extend`` rounds past its best edge (module
    docstring); ``extend`` 0 is race.run.study.run_grid itself. ``options``: race.run.options.RunOptions
    (or its fields as keyword arguments, as before); ``banner``: the CLI's line, printed once the
    first grid's checks pass."""
    o = (options if options is not None else RunOptions.from_kwargs(**kw)).check()
    if o.extend and config.models:
        raise RaceError("extend takes one policy's grid: run a grid over models without it")
    results = study.run_grid(config, o, banner=banner)
    if not o.extend:
        return results
    from race.flops.grid import plan_grid
    from race.engine.calibration import Calibration

    name = o.study or config.name
    cal = Calibration(**results.plan["calibration"]) if results.plan.get("calibration") else None
    for k in range(1, o.extend + 1):
        step = next_grid(config, results)
        if step is None:
            break
        point, side = step
        wider = replace(config, grid=tuple(sorted((*config.grid, point))))
        if cal is not None:
            try:                         # an unreachable ρ ends the extension, not the run
                plan_grid(wider, prompt_len=cal.prompt_len, completion_len=cal.completion_len)
            except ConfigError as e:
                _say(o.quiet, f"grid not extended {side} ρ={min(config.grid) if side == 'below' else max(config.grid):g}: {e}")
                break
        kept = os.path.join(o.out_dir, f"results-x{k - 1}.json")
        _copy(os.path.join(o.out_dir, "results.json"), kept)
        _say(o.quiet, f"best point at the grid's {'lowest' if side == 'below' else 'highest'} ρ: extending the grid "
                      f"to ρ={point:g} (round {k} of {o.extend}; study {name}-x{k}; the grid so far → {kept})")
        results = study.run_grid(wider, o.with_(study=f"{name}-x{k}", import_pilots=kept), calibration=cal)
        config = wider
    return results


def _copy(src: str, dst: str) -> None:
    tmp = dst + ".tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _say(quiet: bool, line: str) -> None:
    if not quiet:
        print(line, file=sys.stderr, flush=True)
