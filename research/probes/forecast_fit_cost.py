"""What the forecast's sigmoid fits cost on the validation study's pilot grids, and whether they converge.

    python research/probes/forecast_fit_cost.py             # the cap as shipped (research/validation-log.md, "How it is run")
    python research/probes/forecast_fit_cost.py --cap 200   # the cap before 2026-12-02

For every committed pilot grid (and extended grid) of research/validation/runs/ with its 10 × B full runs,
runs race.stats.forecast at the full-run budget as research/scripts/validation.py does, counting every
scipy.optimize.least_squares call the sigmoid fits make: the forecast's wall time, its status,
how many fits stopped at the evaluation cap (race.stats.curvefit.MAX_NFEV_PER_PARAM × parameters) and
the most evaluations a fit took that stopped before it (a converged fit).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "research" / "scripts")]


def main() -> int:
    import scipy.optimize

    import validation as v
    from race.stats import curvefit as fits
    from race.stats import forecast as fmod
    from race.core.records import Regime

    calls: list[tuple[int, int]] = []          # (evaluations, cap) per least_squares call
    real = scipy.optimize.least_squares

    def counted(*args, **kw):
        res = real(*args, **kw)
        calls.append((int(res.nfev), int(kw.get("max_nfev") or 0)))
        return res

    scipy.optimize.least_squares = counted     # fit_sigmoid_curves imports it at call time
    if "--cap" in sys.argv:
        fits.MAX_NFEV_PER_PARAM = int(sys.argv[sys.argv.index("--cap") + 1])
    print(f"cap: {fits.MAX_NFEV_PER_PARAM} evaluations per parameter")
    print("| grid | forecast | wall (s) | fits | at the cap | most evaluations of a converged fit |")
    print("|---|---|---|---|---|---|")
    for s in v.load_suite()["settings"]:
        full = v.load_run(s["name"], "full10")
        for kind in ("pilot", v.EXTENDED):
            pilot = v.load_run(s["name"], kind)
            if not (pilot and full):
                continue
            pv = v.verdict(pilot)
            calls.clear()
            t0 = time.perf_counter()
            fc = fmod.forecast([(v.pilots_of(pilot), float(pilot["budget"]))], target="reward",
                               full_run_budget=float(full["budget"]), pilot_regime=Regime(pv.regime.value),
                               pilot_best_rho=pv.best_rho)
            wall = time.perf_counter() - t0
            capped = sum(n >= cap for n, cap in calls)
            done = [n for n, cap in calls if n < cap]
            print(f"| {s['name']} {kind} | {fc.status} | {wall:.1f} | {len(calls)} | {capped} | "
                  f"{max(done) if done else '—'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
