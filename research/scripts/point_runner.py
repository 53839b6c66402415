"""Run ``race pilot`` on a grid of fewer points than a verdict needs: round 3's baselines (issue 48).

    PYTHONPATH=PIN python research/scripts/point_runner.py MODULE pilot CONFIG --out DIR …

Round 3's on-policy and no-pilot-prior runs are one ρ × 5 seeds at C. They are pilots like any other (the
same calibration, plan, engine, storage and results file), but ``race pilot`` refuses a grid of fewer
than 3 points before anything runs (a verdict needs them), and would fail after the last pilot when it
classifies. This runner is ``race pilot`` with exactly those two steps taken out: the ``grid points``
check is dropped from the table of checks, and the classification returns no verdict (a run of one point
has none). Everything else is the pinned checkout's own code, imported from PYTHONPATH, in either layout
(``race.prechecks`` / ``race.regime`` before the packages by layer, ``race.run.prechecks`` /
``race.stats.regime`` after).

Invariant: it changes nothing a pilot computes; results.json holds the pilots and no diagnosis.
"""
from __future__ import annotations

import importlib
import runpy
import sys
from pathlib import Path


def _module(old: str, new: str):
    """The pinned checkout's module: ``old`` where its race/ has that file (the layout before the packages by
    layer), else ``new``. Decided by the files, not by trying imports: an editable install of another
    checkout can answer an import the pin's own race/ cannot."""
    import race

    here = Path(race.__file__).parent
    return importlib.import_module(old if (here / (old.split(".", 1)[1] + ".py")).is_file() else new)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: point_runner.py MODULE pilot CONFIG …  (MODULE: race.cli or race)")
    module, args = argv[0], argv[1:]
    prechecks = _module("race.prechecks", "race.run.prechecks")
    regime = _module("race.regime", "race.stats.regime")
    prechecks.CHECKS = tuple(c for c in prechecks.CHECKS if c.name != "grid points")

    def no_verdict(*_a, **_k):
        return None                          # one point has no verdict: the results keep the pilots only

    regime.classify = no_verdict
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
