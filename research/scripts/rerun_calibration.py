"""How well a verdict's confidence predicts its reruns (issue 54), the part of the reruns study that needs
no rerun: the reliability tables (confidences binned against the observed agreement of reruns), the
predicted rerun agreement of one grid (``rerun_agreement``), and the synthetic studies on grids with a
known answer (``synthetic``, ``calibration`` over ``TRUTHS``). research/scripts/reruns.py runs them
(its ``table``, ``calibration`` and ``synthetic`` commands) and research/scripts/rerun_models.py reads
their bins. Research only.

Invariants: deterministic in its seeds; reads and writes no file; imports no other script.
"""
from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
N_BOOT = 1000         # bootstrap replicates of every verdict of the reruns study
MIN_BIN = 5           # the fewest verdicts a reliability bin holds


# ---------------------------------------------------------------- a confidence that predicts reruns

def _support_gated(rule: np.ndarray, *, grid: Any, boot: Any, wide: Any, contrasts: np.ndarray) -> np.ndarray:
    """``rule`` (``rerun_agreement``'s verdict codes of the simulated reruns) through the support gate
    (race.stats.regime.MIN_SUPPORT of decisive replicates): a rerun's replicates scatter about its own
    means as this grid's do about its means, so the share beyond the band is a normal tail; a rerun
    whose decisive share falls short of the gate states inconclusive (3)."""
    from statistics import NormalDist

    from race.stats import regime as R

    ndist = NormalDist()
    x_lo, x_hi = math.log(float(grid.rho.min())), math.log(float(grid.rho.max()))
    change = boot.slope * (x_hi - x_lo)
    sd = max(float(np.std(change)), 1e-12)
    band1 = R.REPLICATE_BAND_SE * float(np.median(contrasts.std(axis=0)))
    wide_change = wide.slope * (x_hi - x_lo)
    p_dec = np.array([ndist.cdf((-band1 - c) / sd) + 1 - ndist.cdf((band1 - c) / sd) for c in wide_change])
    return np.where(p_dec >= R.MIN_SUPPORT, rule, 3)


def rerun_agreement(results: list, *, target: str = "reward", n_boot: int = N_BOOT, seed: int = 0,
                    inflate: float = math.sqrt(2.0), unwiden: bool = False) -> dict[str, Any]:
    """The rule's verdict on ``results`` with two confidences: the stated one (the share of
    bootstrap replicates whose trend agrees with the verdict) and a predicted rerun agreement.

    A rerun's point means differ from this grid's by two draws of noise (this grid's and the
    rerun's), not one: with the truth unknown and this grid's replicates as its spread, a rerun's
    means scatter about this grid's means with √2 times the replicates' spread. Each inflated
    replicate is classified by the replicate rule (race.stats.regime.replicate_trends, band 2 contrast SEs:
    a rerun states a trend when its effect clears its own CI), and the predicted agreement is the
    share that lands on the stated regime — for an inconclusive verdict, the share that is itself
    indecisive."""
    from race.stats import regime as R
    from race.stats.fit import bootstrap_response, response_of_means

    complete = sorted((r for r in results if r.status == "complete"), key=lambda r: (r.rho_target, r.seed))
    diag = R.classify(complete, targets=[target], primary_target=target, n_boot=n_boot, seed=seed,
                      rerun_confidence=False)
    v = diag.primary
    grid = R._grid(complete, target)
    boot = bootstrap_response(grid=grid, n_boot=n_boot, seed=seed, seed_resampling=R.SEED_RESAMPLING,
                              seed_scale=R.seed_scale(grid=grid, level=0.9))
    centre = grid.point_means
    # unwiden: the simulated reruns scatter without the t/z widening of the seed part (the widening is
    # there for this grid's CIs; a rerun's noise is the noise itself)
    scale = R.seed_scale(grid=grid, level=0.9) if unwiden else 1.0
    means = centre + inflate / scale * (boot.point_means - centre)
    wide = response_of_means(rho=grid.rho, means=means)
    contrasts = boot.point_means - boot.point_means.mean(axis=1, keepdims=True)
    band = R.REPLICATE_BAND_SE * float(np.median(contrasts.std(axis=0))) * math.sqrt(2.0)
    reps = R.replicate_trends(boot=wide, band=band)
    idx = R._TRENDS.index(v.regime) if v.regime in R._TRENDS else None
    predicted = float(np.mean(reps == idx)) if idx is not None else float("nan")
    # the rule itself on each simulated rerun, its CIs as wide as this grid's (same design):
    # search-heavy when the slope's upper bound is < 0, update-heavy when the lower is > 0, balanced
    # when the curvature's upper bound is < 0 and the argmax's interval lies inside the grid
    slope_hat, curv_hat = float(np.median(boot.slope)), float(np.median(boot.curvature))
    s_lo, s_hi = np.percentile(boot.slope, [5, 95])
    c_hi = float(np.percentile(boot.curvature, 95))
    inside = boot.interior & boot.concave
    w_log = (1.645 * float(np.std(np.log(boot.argmax_rho[inside]))) if inside.sum() > 10 else np.inf)
    lo, hi = math.log(float(grid.rho.min())), math.log(float(grid.rho.max()))
    la = np.log(np.where(wide.concave, wide.argmax_rho, 1.0))
    balanced = (wide.curvature + (c_hi - curv_hat) < 0) & wide.concave & (la - w_log > lo) & (la + w_log < hi)
    update = wide.slope - (slope_hat - s_lo) > 0
    search = wide.slope + (s_hi - slope_hat) < 0
    rule = np.where(balanced, 0, np.where(update, 1, np.where(search, 2, 3)))
    predicted_rule = float(np.mean(rule == idx)) if idx is not None else float("nan")
    gated = _support_gated(rule, grid=grid, boot=boot, wide=wide, contrasts=contrasts)
    predicted_gate = float(np.mean(gated == idx)) if idx is not None else float("nan")
    return {"regime": v.regime.value, "confidence": v.fits["bootstrap_share"], "predicted_agreement": predicted,
            "predicted_rule": predicted_rule, "predicted_gate": predicted_gate}


def synthetic(repeats: int = 10, *, unwiden: bool = False, scales=(0.0, 0.5, 1.0, 1.5), seed_sd: float = 0.024, n_seeds: int = 3,
              n_prompts: int = 500) -> list[dict]:
    """Synthetic grids with a known answer (tests/test_regime.py::synthetic_results) on the default
    grid: per true response, ``repeats`` grids with other seeds; each verdict's stated and
    predicted confidence against its agreement with the other grids of the same truth."""
    sys.path[:0] = [str(ROOT / "tests")]
    from test_regime import synthetic_results  # noqa: E402

    grid = (0.5, 0.62, 0.74, 0.85)
    truths = {f"falling x{a:g}": (lambda a: (lambda r: -0.15 * a * (r - 0.6)))(a) for a in scales}
    truths.update({f"peaked x{a:g}": (lambda a: (lambda r: -0.4 * a * (math.log(r) - math.log(0.64)) ** 2))(a)
                   for a in scales if a})
    rows = []
    for name, response in truths.items():
        runs = []
        for rep in range(repeats):
            res = synthetic_results(response=response, n_seeds=n_seeds, seed_sd=seed_sd, n_prompts=n_prompts,
                                    grid=grid, seed=20_000 + rep)
            runs.append(rerun_agreement(res, seed=rep, unwiden=unwiden))
        for i, r in enumerate(runs):
            others = [o for j, o in enumerate(runs) if j != i]
            rows.append({"setting": name, "name": f"{name}#{i}", **r,
                         "agreement": sum(o["regime"] == r["regime"] for o in others) / len(others)})
    return rows


TRUTHS = {   # true responses on the default grid (ρ 0.5 … 0.85): flat, falling, rising and peaked at several sizes
    **{f"falling x{a:g}": (lambda a: (lambda r: -0.15 * a * (r - 0.6)))(a) for a in (0.0, 0.5, 1.0, 1.5)},
    "rising x1": lambda r: 0.15 * (r - 0.6),
    **{f"peaked x{a:g}": (lambda a: (lambda r: -0.4 * a * (math.log(r) - math.log(0.64)) ** 2))(a)
       for a in (0.5, 1.0, 1.5)},
}


def calibration(repeats: int = 40, *, base: int = 30_000, shrinks: tuple[int, ...] = (), seed_sd: float = 0.024,
                n_seeds: int = 3, n_prompts: int = 500) -> list[dict]:
    """Synthetic grids with a known answer (tests/test_regime.py::synthetic_results, the default grid's
    design) for each of TRUTHS, ``repeats`` grids a truth from generator seeds ``base`` + k: each
    grid's verdict with its bootstrap share and rerun confidence (race.stats.regime), and its
    agreement, the share of the other grids of its truth that state the same regime (independent
    reruns). ``shrinks``: the rerun confidence again with these James–Stein degrees of freedom
    (race.stats.confidence ``shrink``; 0 = a flat prior), as ``rerun_k{K}`` — how SHRINK was chosen."""
    sys.path[:0] = [str(ROOT / "tests")]
    from test_regime import synthetic_results  # noqa: E402

    from race.stats import regime as R
    from race.stats.confidence import simulate_reruns
    from race.stats.fit import bootstrap_response

    grid_rho = (0.5, 0.62, 0.74, 0.85)
    rows = []
    for name, response in TRUTHS.items():
        runs = []
        for rep in range(repeats):
            res = synthetic_results(response=response, n_seeds=n_seeds, seed_sd=seed_sd, n_prompts=n_prompts,
                                    grid=grid_rho, seed=base + rep)
            v = R.classify(res, n_boot=N_BOOT, seed=0, rerun_confidence=True).primary
            row = {"regime": v.regime.value, "bootstrap_share": v.fits["bootstrap_share"],
                   "rerun": v.fits["rerun_confidence"]}
            if shrinks:
                complete = sorted(res, key=lambda r: (r.rho_target, r.seed))
                grid = R._grid(complete, "reward")
                scale = R.seed_scale(grid=grid, level=0.9)
                boot = bootstrap_response(grid=grid, n_boot=N_BOOT, seed=0, seed_resampling=R.SEED_RESAMPLING,
                                          seed_scale=scale)
                shares = np.array([f.shares()["reward"] for f in R._point_flops(complete, grid)])
                for k in shrinks:
                    for noise in (True, False):
                        sims = simulate_reruns(grid=grid, replicates=boot.point_means, seed_scale=scale, seed=0,
                                               shrink=k, truth_noise=noise)
                        row[f"rerun_k{k}" + ("" if noise else "_plugin")] = R.rerun_confidence(
                            sims, rho=grid.rho, regime=v.regime, shares=shares, tau=R.REWARD_SHARE_THRESHOLD, level=0.9)
            runs.append(row)
        for i, r in enumerate(runs):
            others = [o for j, o in enumerate(runs) if j != i]
            rows.append({"setting": name, "name": f"{name}#{i}", **r,
                         "agreement": sum(o["regime"] == r["regime"] for o in others) / len(others)})
    return rows


def calibration_lines(rows: list[dict], keys: tuple[str, ...] = ("bootstrap_share", "rerun")) -> list[str]:
    """Per truth: verdicts, mean of each confidence and the observed agreement; then each confidence's
    reliability table (bins of ≥ MIN_BIN verdicts by that confidence)."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    out = ["| truth | verdicts | " + " | ".join(keys) + " | observed agreement |",
           "|---|---|" + "---|" * len(keys) + "---|"]
    for s, rs in by.items():
        counts = Counter(r["regime"] for r in rs)
        out.append(f"| {s} | {', '.join(f'{g} {n}' for g, n in counts.most_common())} | "
                   + " | ".join(f"{np.mean([r[k] for r in rs]):.3f}" for k in keys)
                   + f" | {np.mean([r['agreement'] for r in rs]):.3f} |")
    for k in keys:
        out += ["", *fixed_bin_lines(rows, k, f"{k}: {len(rows)} verdicts, bins 0.1 wide")]
    return out


def bins_of(rows: list[dict], key: str) -> list[dict]:
    rows = sorted(rows, key=lambda x: x[key])
    out, cur = [], []
    for i, row in enumerate(rows):
        cur.append(row)
        left = len(rows) - i - 1
        if len(cur) >= MIN_BIN and (left >= MIN_BIN or left == 0):
            out.append(cur)
            cur = []
    if cur:
        (out[-1].extend(cur) if out else out.append(cur))
    return [{"lo": b[0][key], "hi": b[-1][key], "n": len(b), "stated": sum(x[key] for x in b) / len(b),
             "observed": sum(x["agreement"] for x in b) / len(b)} for b in out]


def fixed_bins(rows: list[dict], key: str, width: float = 0.1) -> list[dict]:
    """Reliability-diagram bins of ``key``: [0, w), [w, 2w), … [1 − w, 1]; every bin that holds a verdict."""
    n_bins = int(round(1 / width))
    out = []
    for i in range(n_bins):
        b = [x for x in rows if min(int(x[key] / width + 1e-9), n_bins - 1) == i]
        if b:
            out.append({"lo": i * width, "hi": (i + 1) * width, "n": len(b), "stated": sum(x[key] for x in b) / len(b),
                        "observed": sum(x["agreement"] for x in b) / len(b)})
    return out


def fixed_bin_lines(rows: list[dict], key: str, title: str) -> list[str]:
    worst = max(abs(b["observed"] - b["stated"]) for b in fixed_bins(rows, key) if b["n"] >= MIN_BIN)
    return (bin_table(rows, key, title, fixed_bins(rows, key), digits=1)
            + ["", f"largest |gap| in a bin of ≥ {MIN_BIN} verdicts: {worst:.3f}"])


def reliability_lines(rows: list[dict], key: str, title: str) -> list[str]:
    return bin_table(rows, key, title, bins_of(rows, key), digits=2)


def bin_table(rows: list[dict], key: str, title: str, bins: list[dict], *, digits: int) -> list[str]:
    """A reliability table: one row per bin (its bounds to ``digits`` places), then all of ``rows``."""
    lines = [f"### {title}", "| bin | verdicts | mean stated | observed agreement | gap |", "|---|---|---|---|---|"]
    for b in bins:
        lines.append(f"| {b['lo']:.{digits}f}–{b['hi']:.{digits}f} | {b['n']} | {b['stated']:.3f} | {b['observed']:.3f} | "
                     f"{b['observed'] - b['stated']:+.3f} |")
    c = sum(x[key] for x in rows) / len(rows)
    a = sum(x["agreement"] for x in rows) / len(rows)
    lines.append(f"| all | {len(rows)} | {c:.3f} | {a:.3f} | {a - c:+.3f} |")
    return lines
