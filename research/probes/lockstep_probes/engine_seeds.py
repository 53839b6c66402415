"""Do the lockstep and solo engines give the same verdict, beyond seed noise? (issue 19, item 3)

    PYTHONPATH=. python research/probes/lockstep_probes/engine_seeds.py LOCKSTEP/results.json SOLO/results.json

Reads two grids of the same config run with the two engines (e.g. `race pilot --thorough --seeds 8
--engine lockstep` and `--engine solo`) and prints, per engine: the verdict on all seeds; the
verdicts of every subset of k seeds (the same subset at every ρ; k = the shipped grid's seed count,
`--k`), as a distribution, so one sees how often a k-seed grid of that engine says each label;
and, per ρ, the mean held-out reward of each engine with Welch's t for the difference, then the
pooled difference over points. Seeds are not paired across engines (over hundreds of steps the
two drift apart as two seeds do), so the tests are unpaired.
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
from collections import Counter

from race.stats.regime import classify
from race.stats.results import load_results


def per_seed(pilots, rho):
    return {p.seed: sum(p.evals["reward"]) / len(p.evals["reward"]) for p in pilots if p.rho_target == rho}


def welch(a: list[float], b: list[float]) -> tuple[float, float]:
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    return statistics.mean(a) - statistics.mean(b), (statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lockstep")
    ap.add_argument("solo")
    ap.add_argument("--k", type=int, default=4, help="seeds per subset (the grid as shipped)")
    ap.add_argument("--n-boot", type=int, default=300, help="bootstrap replicates per subset verdict")
    args = ap.parse_args()
    grids = {}
    for name, path in (("lockstep", args.lockstep), ("solo", args.solo)):
        pilots = [p for p in load_results(path).pilots if p.status == "complete"]
        engines = Counter(p.extra.get("engine", "solo") for p in pilots)   # solo pilots record none
        grids[name] = pilots
        d = classify(pilots, primary_target="reward").primary
        print(f"{name}: {len(pilots)} pilots {dict(engines)}; all seeds: {d.regime.value} {d.range_text()} "
              f"confidence {d.confidence:.2f}, best ρ {d.best_rho:g}")
        seeds = sorted({p.seed for p in pilots})
        labels = Counter()
        for subset in itertools.combinations(seeds, args.k):
            chosen = [p for p in pilots if p.seed in subset]
            labels[classify(chosen, primary_target="reward", n_boot=args.n_boot).primary.regime.value] += 1
        total = sum(labels.values())
        print(f"  {args.k}-seed subsets ({total}): " + ", ".join(f"{k} {v / total:.2f}" for k, v in labels.most_common()))
    rhos = sorted({p.rho_target for p in grids["solo"]})
    diffs = []
    print("ρ target | lockstep mean (n) | solo mean (n) | lockstep − solo | Welch t")
    for r in rhos:
        a, b = list(per_seed(grids["lockstep"], r).values()), list(per_seed(grids["solo"], r).values())
        d, t = welch(a, b)
        diffs.append(d)
        print(f"{r:g} | {statistics.mean(a):.4f} ({len(a)}) | {statistics.mean(b):.4f} ({len(b)}) | {d:+.4f} | {t:+.2f}")
    m, sd = statistics.mean(diffs), statistics.stdev(diffs)
    print(f"over the {len(diffs)} points: mean difference {m:+.4f}, SD {sd:.4f}, t = {m / (sd / math.sqrt(len(diffs))):+.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
