"""Which pilots should an adaptive grid run? Successive halving against the informative policy,
replayed on synthetic grids through the production regime rule (no pilots run).

    python bench/adaptive_policies.py                  # the table in docs/storage.md (~5 min on 2 cores)
    python bench/adaptive_policies.py --repeats 50     # quicker

Each repeat draws a full grid of synthetic pilots (tests/test_regime.py::synthetic_results:
per-prompt difficulty, 500 prompts × 4 samples, seed SD 0.024 — the noise measured on the
tiny policy), classifies it, then lets each adaptive policy of race.run.adaptive pick its pilots
from the same draws (rung by rung, seeing only the scores of the pilots it already ran) and
classifies that subset with the same bootstrap seed. Both policies run half the full grid's
pilots (race.run.adaptive.adaptive_cap), or ``--share`` of them (``race pilot --adaptive-share``). Reported per response and grid: how often the adaptive
verdict equals the full grid's, and how often each equals the truth of the response.
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

from race.stats import regime  # noqa: E402
from race.core.records import Regime  # noqa: E402
from race.run.adaptive import ADAPTIVE_POLICIES, adaptive_subset, is_budget, policy_named  # noqa: E402
from test_regime import FALLING, FLAT, PEAKED, RISING, synthetic_results  # noqa: E402

# the thorough preset's measured response (docs/pilot.md: 0.648 / 0.662 / 0.658 / 0.628 / 0.555 at
# ρ 0.42 … 0.85): its least-squares quadratic in log ρ, c = −0.50, vertex at ρ 0.53
# the policies that pick pilots of the full budget; budget halving reads pilots paused at B/11, which a
# replay on full-budget pilots does not have (its figures: tests/test_budget_halving.py, docs/storage.md)
REPLAYED = tuple(p for p in ADAPTIVE_POLICIES if not is_budget(policy_named(p)))
THOROUGH_LIKE = lambda r: -0.50 * (math.log(r) - math.log(0.53)) ** 2   # noqa: E731
RESPONSES = {
    "peaked (vertex 0.58)": (PEAKED, Regime.BALANCED),
    "thorough-like (vertex 0.53)": (THOROUGH_LIKE, Regime.BALANCED),
    "falling −0.15/ρ": (FALLING, Regime.SEARCH_HEAVY),
    "rising +0.15/ρ": (RISING, Regime.UPDATE_HEAVY),
    "flat": (FLAT, Regime.INCONCLUSIVE),
}
GRIDS = {
    "4 × 3 (previous default)": ((0.45, 0.6, 0.73, 0.84), 3),
    "5 × 4 (thorough)": ((0.42, 0.5, 0.62, 0.74, 0.85), 4),
}


def chosen(policy: str, pilots, grid, seeds, share: float) -> list:
    """The pilots ``policy`` runs (synthetic seeds are numbered from 1000)."""
    by_key = {(p.rho_target, p.seed - 1000): p for p in pilots}
    return [by_key[k] for k in adaptive_subset(policy, grid, seeds, lambda k: by_key[k].score("reward"),
                                               share=share)]


def run(repeats: int, share: float = 0.5) -> None:
    print("| response (truth) | grid, pilots full → adaptive | full = truth | "
          + " | ".join(f"{p}: = full, = truth" for p in REPLAYED) + " |")
    print("|---|---|---|" + "---|" * len(REPLAYED))
    for gname, (grid, seeds) in GRIDS.items():
        for rname, (response, truth) in RESPONSES.items():
            full_ok, agree, right, sizes = 0, Counter(), Counter(), set()
            for rep in range(repeats):
                pilots = synthetic_results(response=response, n_seeds=seeds, n_prompts=500, k=4,
                                           grid=grid, seed=20_000 + rep)
                full = regime.classify(pilots, seed=rep).regime
                full_ok += full is truth
                for policy in REPLAYED:
                    sub = chosen(policy, pilots, grid, seeds, share)
                    sizes.add(len(sub))
                    v = regime.classify(sub, seed=rep).regime
                    agree[policy] += v is full
                    right[policy] += v is truth
            pct = lambda k: f"{100 * k / repeats:.0f} %"   # noqa: E731
            print(f"| {rname} ({truth.value}) | {gname}, {len(grid) * seeds} → {'/'.join(map(str, sorted(sizes)))} "
                  f"| {pct(full_ok)} | " + " | ".join(f"{pct(agree[p])}, {pct(right[p])}" for p in REPLAYED)
                  + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--share", type=float, default=0.5,
                    help="share of the full grid's pilots the adaptive grids run (race pilot --adaptive-share)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    run(args.repeats, args.share)
    print(f"\n{args.repeats} synthetic grids per row; wall {time.perf_counter() - t0:.0f} s; "
          f"command: python bench/adaptive_policies.py --repeats {args.repeats}"
          + (f" --share {args.share}" if args.share != 0.5 else ""))


if __name__ == "__main__":
    main()
