"""The seed-and-prompt bootstrap's wall time: race.stats.fit.bootstrap_response at n_boot = 1000 on 5 points ×
3 seeds × 500 prompts (the default grid's held-out layout, one more point), best and median of ``--repeats``.

    python bench/bootstrap_speed.py [--repeats 10]

Its target (under 0.5 s on 2 CPU cores) was a timed unit test until 2026-12-06; timings live here and in
docs/benchmarks.md. State the machine's load beside any figure.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from race.stats import fit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    rho = np.array([0.3, 0.45, 0.6, 0.73, 0.85])
    rng = np.random.default_rng(0)
    t = np.repeat(rho, 3)
    g = fit.grid_scores(rho_targets=t, pilot_seeds=np.tile([0, 1, 2], 5), pilot_rho=t,
                        scores=rng.binomial(4, 0.45, size=(15, 500)) / 4)
    fit.bootstrap_response(grid=g, n_boot=1000, seed=0)               # warm-up
    times = []
    for k in range(args.repeats):
        t0 = time.perf_counter()
        fit.bootstrap_response(grid=g, n_boot=1000, seed=1 + k)
        times.append(time.perf_counter() - t0)
    print(f"bootstrap_response, n_boot 1000, 5 points × 3 seeds × 500 prompts: best {min(times):.3f} s, "
          f"median {statistics.median(times):.3f} s over {args.repeats}; 1-minute load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
