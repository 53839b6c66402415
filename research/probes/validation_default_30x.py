"""The figures of research/validation-log.md, "The second 30 × B grid: `default`", that the tables do not
print, read from the committed data (research/validation/runs/default/full30.json.gz; nothing is run):
the per-seed held-out reward per ρ, the pooled seed SD with and without the collapsed run (the
yardstick the regret is measured in), and the collapsed run's checkpoint curve.

    python research/probes/validation_default_30x.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "research" / "scripts"))
import validation as v  # noqa: E402  (the study's own loader and per-seed means)


COLLAPSED = 0.5      # a final held-out reward below this, against 0.79–0.90 for the others: the collapsed run


def pooled_sd(groups: dict[float, list[float]]) -> float:
    ss = sum(float(((np.array(x) - np.mean(x)) ** 2).sum()) for x in groups.values())
    return float(np.sqrt(ss / sum(len(x) - 1 for x in groups.values())))


def main() -> None:
    rec = v.load_run("default", "full30")
    means = v.point_means(rec)
    for rho, xs in means.items():
        print(f"ρ {rho:.2f}: seeds {', '.join(f'{x:.4f}' for x in xs)}; mean {np.mean(xs):.4f}")
    kept = {r: [x for x in xs if x >= COLLAPSED] for r, xs in means.items()}
    sd, sd_kept = pooled_sd(means), pooled_sd(kept)
    print(f"pooled seed SD {sd:.3f} (SE {sd / np.sqrt(3):.4f}); without the runs below {COLLAPSED} {sd_kept:.3f} "
          f"(SE {sd_kept / np.sqrt(3):.4f})")
    for p in rec["pilots"]:
        if np.mean(p["evals"]["reward"]) >= COLLAPSED:
            continue
        rho, seed = p["rho_target"], p["seed"]
        curve = ", ".join(f"{c['fraction']:.3f}: {np.mean(c['evals']['reward']):.3f}" for c in p["checkpoints"])
        print(f"collapsed: ρ {rho:.2f} seed {seed}; checkpoints (share of the run: mean reward) {curve}")


if __name__ == "__main__":
    main()
