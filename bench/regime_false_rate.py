"""How often does classify() call a regime on pure noise, and how often does it find a real one?

    python bench/regime_false_rate.py                 # full tables (~5 min on 2 cores)
    python bench/regime_false_rate.py --repeats 50    # quicker

Synthetic grids come from tests/test_regime.py::synthetic_results (per-prompt
difficulty, k = 4 samples per prompt, seed effect of SD ``seed_sd``), on the grid
ρ ∈ {0.3, 0.45, 0.6, 0.72, 0.85}. Every classify() call uses the production
defaults (n_boot = 1000, confidence 0.9) unless a table says otherwise.

Tables:
1. false-verdict rate on a flat response (any verdict but inconclusive is false),
   by seeds per point, seed SD and prompt count;
2. the same rate for ablations of the rule (seed resampling, t_df/z widening,
   support gate) at the measured noise, to show what each part buys;
3. power: how often the right verdict comes out for the measured effect
   (−0.15 per unit ρ), half of it, a rise, and an interior peak — including at
   the seed count that the "add seeds" warning recommends.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402

from race.stats import regime  # noqa: E402
from race.core.records import Regime  # noqa: E402
from test_regime import FALLING, FLAT, GRID, PEAKED, RISING, synthetic_results  # noqa: E402


def verdicts(response, *, repeats: int, n_seeds: int, seed_sd: float, n_prompts: int) -> Counter:
    """Counter of verdicts over ``repeats`` seeded synthetic grids (same seeds as the test)."""
    out: Counter = Counter()
    for rep in range(repeats):
        results = synthetic_results(response=response, n_seeds=n_seeds, seed_sd=seed_sd,
                                    n_prompts=n_prompts, seed=10_000 + rep)
        out[regime.classify(results, seed=rep).regime] += 1
    return out


def _row(label: str, counts: Counter, repeats: int, right: Regime) -> str:
    rate = 1 - counts[right] / repeats
    se = math.sqrt(max(rate * (1 - rate), 1e-12) / repeats)
    parts = ", ".join(f"{r.value} {counts[r]}" for r in Regime if counts[r] and r is not right)
    return f"| {label} | {rate:6.1%} ± {se:4.1%} | {parts or '—'} |"


def false_rate_table(repeats: int) -> None:
    print(f"\n### 1. False-verdict rate on a flat response ({repeats} grids per row)\n")
    print("| seeds/point, seed SD, prompts | false rate ± SE | false verdicts |\n|---|---|---|")
    for n_seeds in (2, 3, 5):
        for seed_sd in (0.012, 0.024, 0.048):
            for n_prompts in (100, 500):
                c = verdicts(FLAT, repeats=repeats, n_seeds=n_seeds, seed_sd=seed_sd, n_prompts=n_prompts)
                print(_row(f"{n_seeds}, {seed_sd}, {n_prompts}", c, repeats, Regime.INCONCLUSIVE), flush=True)


ABLATIONS = {
    "production (pooled seeds, t_df/z, gate 0.7 @ 2 SE)": {},
    "no support gate (CI rule only)": {"MIN_SUPPORT": 0.0},
    "no t_df/z widening": {"SEED_DF_CORRECTION": False},
    "within-point seed resampling": {"SEED_RESAMPLING": "within"},
    "within-point, no widening, no gate (plain CI rule)": {"SEED_RESAMPLING": "within",
                                                           "SEED_DF_CORRECTION": False, "MIN_SUPPORT": 0.0},
}


def ablation_table(repeats: int) -> None:
    print(f"\n### 2. Ablations, 2 seeds/point, seed SD 0.024 ({repeats} grids per cell)\n")
    print("| rule | false rate, 300 prompts | false rate, 500 prompts | false rate, seed SD 0.048, "
          "500 prompts | search-heavy found (slope −0.15/ρ, 500 prompts) |\n|---|---|---|---|---|")
    saved = {k: getattr(regime, k) for k in ("MIN_SUPPORT", "SEED_DF_CORRECTION", "SEED_RESAMPLING")}
    try:
        for label, patch in ABLATIONS.items():
            for k, v in {**saved, **patch}.items():
                setattr(regime, k, v)
            cells = []
            for seed_sd, n_prompts in ((0.024, 300), (0.024, 500), (0.048, 500)):
                c = verdicts(FLAT, repeats=repeats, n_seeds=2, seed_sd=seed_sd, n_prompts=n_prompts)
                cells.append(f"{1 - c[Regime.INCONCLUSIVE] / repeats:.1%}")
            c = verdicts(FALLING, repeats=repeats, n_seeds=2, seed_sd=0.024, n_prompts=500)
            cells.append(f"{c[Regime.SEARCH_HEAVY] / repeats:.1%}")
            print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    finally:
        for k, v in saved.items():
            setattr(regime, k, v)


def power_table(repeats: int) -> None:
    print(f"\n### 3. Power: share of grids given the right verdict ({repeats} grids per row, 500 prompts)\n")
    print("| response | seeds/point | right | other verdicts |\n|---|---|---|---|")
    x = np.log(np.array(GRID))
    half = lambda r: 0.5 * FALLING(r)  # noqa: E731
    change = abs(np.polyfit(x, [half(r) for r in GRID], 1)[0]) * float(x.max() - x.min())
    advised = regime.seeds_needed(seed_sd=math.hypot(0.024, 0.01), change=change, rho=np.array(GRID), level=0.9)
    rows = [("falling, −0.15/ρ (measured)", FALLING, 2, Regime.SEARCH_HEAVY),
            ("falling, −0.15/ρ (measured)", FALLING, 3, Regime.SEARCH_HEAVY),
            ("falling, −0.075/ρ (half)", half, 3, Regime.SEARCH_HEAVY),
            (f"falling, −0.075/ρ (half), advised n={advised}", half, advised, Regime.SEARCH_HEAVY),
            ("rising, +0.15/ρ", RISING, 2, Regime.UPDATE_HEAVY),
            ("peak at ρ=0.58", PEAKED, 2, Regime.BALANCED),
            ("peak at ρ=0.58", PEAKED, 3, Regime.BALANCED)]
    for label, response, n_seeds, right in rows:
        c = verdicts(response, repeats=repeats, n_seeds=n_seeds, seed_sd=0.024, n_prompts=500)
        others = ", ".join(f"{r.value} {c[r]}" for r in Regime if c[r] and r is not right) or "—"
        print(f"| {label} | {n_seeds} | {c[right] / repeats:.1%} | {others} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=100, help="synthetic grids per row")
    ap.add_argument("--tables", default="123", help="which tables to print, e.g. 13")
    args = ap.parse_args()
    t0 = time.perf_counter()
    print(f"RACE regime rule: MIN_SUPPORT={regime.MIN_SUPPORT}, REPLICATE_BAND_SE={regime.REPLICATE_BAND_SE}, "
          f"SEED_RESAMPLING={regime.SEED_RESAMPLING!r}, SEED_DF_CORRECTION={regime.SEED_DF_CORRECTION}")
    if "1" in args.tables:
        false_rate_table(args.repeats)
    if "2" in args.tables:
        ablation_table(args.repeats)
    if "3" in args.tables:
        power_table(args.repeats)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
