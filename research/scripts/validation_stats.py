"""The statistics of the validation study (issue 16), on one committed grid record: its pilots, the
rule's diagnosis and verdict, per-point means and measured ρ, bootstrap CIs of the best ρ, regret
and gain, collapses, and the per-setting scoring rows the tables read. Moved out of validation.py
unchanged (issue 52); validation.py re-exports every name."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from validation_suite import N_BOOT  # noqa: E402


# ---------------------------------------------------------------- statistics

_MEMO: dict[int, tuple[dict, dict]] = {}


def _memo(record: dict, key: str, make: Any) -> Any:
    """``make()`` once per record (a loaded dict) and key: the tables read each grid several times."""
    held = _MEMO.setdefault(id(record), (record, {}))
    if held[0] is not record:                 # an id reused after its record was freed
        held = _MEMO[id(record)] = (record, {})
    if key not in held[1]:
        held[1][key] = make()
    return held[1][key]


def pilots_of(record: dict) -> list:
    from race.core.records import PilotResult

    return _memo(record, "pilots", lambda: [PilotResult.from_dict(p) for p in record["pilots"]
                                            if p.get("status") == "complete"])


def diagnosis(record: dict):
    """The rule's diagnosis of a grid (race.stats.regime.classify, the primary target: held-out reward).
    Its confidence is the bootstrap share, the number the validation rounds were frozen and scored with
    (the rerun confidence, the rule's printed number since issue 54, is not simulated here)."""
    from race.stats.regime import classify

    return _memo(record, "diagnosis",
                 lambda: classify(pilots_of(record), primary_target="reward", n_boot=N_BOOT, seed=0,
                                  rerun_confidence=False))


def verdict(record: dict):
    """The rule's verdict on a grid (the diagnosis' primary target)."""
    return diagnosis(record).primary


def grid_class(diag: Any) -> str:
    """What a grid is scored as: "unstable" when at least half its runs fell back on their held-out
    checkpoints (race.stats.instability.unstable_grid: the report names it), else its regime. Decided on the
    development half (lr-x3) before any held-out full run: a grid of collapsed runs has no regime
    to agree with, and a pilot grid that names the instability has given the right advice."""
    from race.stats.instability import unstable_grid

    return "unstable" if unstable_grid(diag.stability) else diag.primary.regime.value


def point_means(record: dict, target: str = "reward") -> dict[float, list[float]]:
    """ρ target → per-seed mean held-out score."""
    out: dict[float, list[float]] = {}
    for p in pilots_of(record):
        scores = p.evals[target]
        out.setdefault(p.rho_target, []).append(sum(scores) / len(scores))
    return dict(sorted(out.items()))


def measured_rho(record: dict) -> dict[float, float]:
    """ρ target → the measured ρ (C_learning / C_total as spent), mean over the point's runs: the
    axis the pilot verdict's range and recommended ρ live on."""
    out: dict[float, list[float]] = {}
    for p in pilots_of(record):
        out.setdefault(p.rho_target, []).append(p.flops.rho)
    return {t: sum(v) / len(v) for t, v in sorted(out.items())}


# a full-run point is in a range when its measured ρ is, give or take this: the same schedule's
# measured ρ differs between a pilot and a full run only by token-length noise (≤ 6e-4 in this suite's
# scored settings; research/validation-log.md, "A scoring fix")
RHO_TOL = 0.002


def boot_means(record: dict, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[list[float], Any]:
    """The full runs' ρ targets and an (n_boot × ρ) array of bootstrap means of the held-out reward:
    each replicate resamples each point's seeds, then each chosen seed's prompts (memoized per record;
    best_rho_ci and regret_gain_ci read the same replicates)."""
    import numpy as np

    def make():
        by_rho: dict[float, list] = {}
        for p in pilots_of(record):
            by_rho.setdefault(p.rho_target, []).append(np.asarray(p.evals["reward"], dtype=float))
        rhos = sorted(by_rho)
        rng = np.random.default_rng(seed)
        out = np.empty((n_boot, len(rhos)))
        for b in range(n_boot):
            for j, r in enumerate(rhos):
                seeds = by_rho[r]
                chosen = [seeds[i] for i in rng.integers(0, len(seeds), len(seeds))]
                out[b, j] = np.mean([s[rng.integers(0, len(s), len(s))].mean() for s in chosen])
        return rhos, out

    return _memo(record, f"boot/{n_boot}/{seed}", make)


def best_rho_ci(record: dict, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """The full runs' best ρ (highest mean over seeds) and a bootstrap CI over seeds and prompts."""
    import numpy as np

    means = point_means(record)
    rhos = sorted(means)
    best = rhos[int(np.argmax([np.mean(means[r]) for r in rhos]))]
    b_rhos, reps = boot_means(record, n_boot=n_boot, seed=seed)
    picks = [b_rhos[i] for i in np.argmax(reps, axis=1)]
    lo, hi = np.quantile(picks, [0.025, 0.975])
    return best, (float(lo), float(hi))


def regret_gain_ci(record: dict, rec_rho: float, on_policy: float | None) -> tuple[tuple[float, float],
                                                                                  tuple[float, float]]:
    """95 % bootstrap CIs (the replicates of boot_means) of the regret at ``rec_rho`` (a measured ρ:
    the best point's mean minus the response read at it) and of the gain there over the on-policy
    point (nan without one). A replicate's best is its own maximum, so the regret CI leans high (the
    maximum of noisy means is biased up); it says how far seed and prompt noise alone move the figure."""
    import numpy as np

    rhos, reps = boot_means(record)
    meas = measured_rho(record)
    axis = [meas[r] for r in rhos]
    at = np.array([np.interp(rec_rho, axis, row) for row in reps])      # interpolate(), per replicate
    regret = reps.max(axis=1) - at
    nan = (float("nan"), float("nan"))
    gain = at - reps[:, rhos.index(on_policy)] if on_policy in rhos else None
    q = lambda v: tuple(float(x) for x in np.quantile(v, [0.025, 0.975]))  # noqa: E731
    return q(regret), (q(gain) if gain is not None else nan)


def interpolate(means: dict[float, list[float]], rho: float) -> float:
    """The full-run response (mean over seeds) at ``rho``, linear between grid points and flat past
    the ends (numpy.interp, which regret_gain_ci applies to each bootstrap replicate)."""
    import numpy as np

    xs = sorted(means)
    return float(np.interp(rho, xs, [sum(means[x]) / len(means[x]) for x in xs]))


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free CI of a median from order statistics: the narrowest (k-th smallest,
    k-th largest) pair covering it with probability ≥ ``level`` (binomial, p = 1/2); under 6 values
    none reaches 0.95, and the (smallest, largest) pair is given with its own coverage.
    Returns (low, high, coverage); nans without values."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return (float("nan"), float("nan"), float("nan"))
    cover = lambda k: 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n  # noqa: E731  k-th from each end
    k = 1
    while k + 1 <= (n + 1) // 2 and cover(k + 1) >= level:
        k += 1
    return (xs[k - 1], xs[n - k], cover(k))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def collapses(record: dict) -> dict[float, int]:
    """Unstable pilots per ρ (race.stats.instability' rule on the held-out reward)."""
    from race.stats.instability import stability

    st = stability(pilots_of(record), "reward")
    return {pt.rho_target: pt.unstable for pt in st.points} if st else {}


def _fallen(diag: Any) -> tuple[int, int]:
    """(runs that fell back, runs) of a grid; (0, 0) without checkpoints."""
    st = diag.stability
    return (st.fell, st.pilots) if st else (0, 0)


def candidate_range(pv: Any, pilot_grid: dict[float, float]) -> tuple[float, float, float]:
    """The candidate low-side rule (written down on 2026-12-02, after the held-out half's first five
    settings and before the reasoner's, lr-x3-cosine's and the 30 × B full runs were looked at; not
    adopted): the recommended range's lower bound moves down to the pilot grid's next measured point
    below it, since the full-run best ρ lay below the pilot grid's best in 7 of the first 10 scored
    settings. A range already open below, or whose lower bound is at the grid's lowest point, is
    unchanged. Returns (low, high, the ρ where it is read: the new range's centre; an open range keeps
    its edge point)."""
    b_lo, b_hi = pv.bounds
    if pv.open_side == "below":
        return b_lo, b_hi, pv.recommended_rho
    lower = [m for m in pilot_grid.values() if m < b_lo - RHO_TOL]
    lo = max(lower) if lower else b_lo
    return lo, b_hi, pv.recommended_rho if pv.open_side == "above" else (lo + b_hi) / 2


def _within(rho: float, lo: float, hi: float) -> bool:
    """A measured ρ in [lo, hi], within RHO_TOL (a pilot and a full run of one schedule differ by less)."""
    return lo - RHO_TOL <= rho <= hi + RHO_TOL


def _in_se(value: float, se: float) -> float:
    """``value`` in units of ``se``; nan where the SE is nan or not positive (one seed, a flat grid)."""
    return value / se if se == se and se > 0 else float("nan")


def setting_row(s: dict, pilot: dict, full: dict) -> dict[str, Any]:
    """Every per-setting metric of docs/validation.md for one setting with both grids done."""
    import statistics

    pd, fd = diagnosis(pilot), diagnosis(full)
    pv, fv = pd.primary, fd.primary
    means = point_means(full)
    best, best_ci = best_rho_ci(full)
    # the rule as adopted (a range open at a grid edge: race.stats.regime.open_side) and as it was before
    # 2026-12-02 (always the closed range, read at its centre): both are scored
    lo, hi = pv.rho_range
    centre = (lo + hi) / 2
    best_mean = sum(means[best]) / len(means[best])
    se = statistics.stdev(means[best]) / math.sqrt(len(means[best])) if len(means[best]) > 1 else float("nan")
    # the pooled SE: the seed variance pooled over every full-run point (10 df at 5 × 3 runs, against the
    # best point's own 2), over the best point's seed count; the two are shown side by side
    dfs = [len(v) - 1 for v in means.values() if len(v) > 1]
    pooled_sd = math.sqrt(sum((len(v) - 1) * statistics.variance(v) for v in means.values() if len(v) > 1)
                          / sum(dfs)) if dfs and sum(dfs) else float("nan")
    pse = pooled_sd / math.sqrt(len(means[best]))
    # the pilot's range and recommended ρ are measured ρ: read them on the full runs' measured axis
    meas = measured_rho(full)
    on_axis = {meas[t]: v for t, v in means.items()}
    at_rec = interpolate(on_axis, pv.recommended_rho)
    closed_regret = best_mean - interpolate(on_axis, centre)
    on_policy = s.get("on_policy")
    gain = at_rec - sum(means[on_policy]) / len(means[on_policy]) if on_policy in means else float("nan")
    regret_ci, gain_ci = regret_gain_ci(full, pv.recommended_rho, on_policy)
    b_lo, b_hi = pv.bounds
    c_lo, c_hi, c_read = candidate_range(pv, measured_rho(pilot))
    pilot_flops = sum(p.flops.total for p in pilots_of(pilot))
    full_pilots = pilots_of(full)
    one_full = max(p.flops.total for p in full_pilots)
    return {"setting": s["name"], "half": s.get("half"), "pilot": grid_class(pd), "pilot_regime": pv.regime.value,
            "full_regime": fv.regime.value, "pilot_best_rho": pv.best_rho, "pilot_range": (lo, hi),
            # best ρ, range and regret mean nothing on a grid of collapsed runs: such settings are not scored on them
            "scored": grid_class(fd) != "unstable",
            "pilot_unstable": _fallen(pd), "full_unstable": _fallen(fd),
            # the bootstrap share of the full runs' replicates that show the pilot's regime
            "support": float(fv.fits.get("support", {}).get(pv.regime.value, float("nan"))),
            "open_side": pv.open_side, "pilot_range_text": pv.range_text(),
            "closed_in_range": _within(meas[best], lo, hi), "closed_regret": closed_regret,
            "closed_regret_pse": _in_se(closed_regret, pse), "regret_pse": _in_se(best_mean - at_rec, pse),
            "best_mean": best_mean, "pse": pse,
            "pilot_confidence": pv.confidence, "full": grid_class(fd), "full_confidence": fv.confidence,
            "pilot_trend": pv.fits.get("trend_regime"), "full_trend": fv.fits.get("trend_regime"),
            "best": best, "best_ci": best_ci, "best_measured": meas[best],
            "in_range": _within(meas[best], b_lo, b_hi), "bounds": (b_lo, b_hi),
            # the candidate low-side rule, written down before the data it is judged on (candidate_range)
            "cand_range": (c_lo, c_hi), "cand_in_range": _within(meas[best], c_lo, c_hi),
            "cand_regret_pse": _in_se(best_mean - interpolate(on_axis, c_read), pse),
            "regret": best_mean - at_rec, "regret_se": _in_se(best_mean - at_rec, se), "regret_ci": regret_ci, "gain": gain, "gain_ci": gain_ci, "cost_one": pilot_flops / one_full,
            "cost_grid": pilot_flops / sum(p.flops.total for p in full_pilots),
            "collapses": collapses(full)}


def forecast_row(pilot: dict, full: dict, row: dict) -> dict[str, Any]:
    """The pilot grid's forecast at the full-run budget (race.stats.forecast) against the full runs;
    ``row``: the setting's ``setting_row`` (both grids' regimes, the pilot's best ρ, the full runs'
    best-ρ CI, best mean and pooled SE)."""
    from race.stats.forecast import forecast
    from race.core.records import Regime

    fc = forecast([(pilots_of(pilot), float(pilot["budget"]))], target="reward",
                  full_run_budget=float(full["budget"]), pilot_regime=Regime(row["pilot_regime"]),
                  pilot_best_rho=row["pilot_best_rho"])
    if fc.status == "refused":
        return {"status": "refused", "regime": None, "best": None, "same": None, "in_ci": None,
                "regret": float("nan"), "regret_pse": float("nan")}
    if not row["scored"]:               # collapsed full runs: no best ρ to find, no regret (scoring section)
        return {"status": fc.status, "regime": fc.regime.value, "best": fc.best_rho,
                "same": fc.regime.value == row["full"], "in_ci": None, "regret": float("nan"),
                "regret_pse": float("nan")}
    regret = row["best_mean"] - interpolate(point_means(full), fc.best_rho)
    return {"status": fc.status, "regime": fc.regime.value, "best": fc.best_rho,
            "same": fc.regime.value == row["full_regime"],
            "in_ci": row["best_ci"][0] <= fc.best_rho <= row["best_ci"][1],
            "regret": regret, "regret_pse": _in_se(regret, row["pse"])}


def adaptive_record(pilot: dict, share: float, policy: str = "informative") -> dict:
    """The pilot grid an adaptive study of ``share`` would have run, replayed on the pilot grid's own
    pilots (race.run.adaptive.adaptive_subset): the record with only those pilots, scored like any grid."""
    from race.run.adaptive import adaptive_subset
    pilots = pilots_of(pilot)
    by_key = {(p.rho_target, p.seed): p for p in pilots}
    grid = sorted({p.rho_target for p in pilots})
    seeds = max(p.seed for p in pilots) + 1

    def score(key):
        p = by_key[key]
        return sum(p.evals["reward"]) / len(p.evals["reward"])

    keys = set(adaptive_subset(policy, grid, seeds, score, share=share))
    return {**pilot, "pilots": [p for p in pilot["pilots"] if p.get("status") == "complete"
                                and (float(p["rho_target"]), int(p["seed"])) in keys]}


def ranking_by_budget(record: dict) -> list[tuple[float, float, float | None]]:
    """How the full runs rank ρ as their budget grows, from their held-out checkpoints: per
    checkpoint fraction f > 0 (the budget multiple f × the run's budget), the best ρ on the
    checkpoint prompts (mean over seeds) and the Spearman correlation of the ρ ranking with the
    end's (None when either is constant)."""
    from scipy.stats import spearmanr

    pilots = pilots_of(record)
    by_frac: dict[float, dict[float, list[float]]] = {}
    for p in pilots:
        for c in p.checkpoints:
            if c.fraction > 0:
                scores = c.evals["reward"]
                by_frac.setdefault(round(c.fraction, 4), {}).setdefault(p.rho_target, []).append(sum(scores) / len(scores))
    if not by_frac:
        return []
    end = {r: sum(v) / len(v) for r, v in by_frac[max(by_frac)].items()}
    out = []
    for f in sorted(by_frac):
        means = {r: sum(v) / len(v) for r, v in by_frac[f].items()}
        rhos = sorted(set(means) & set(end))
        xs, ys = [means[r] for r in rhos], [end[r] for r in rhos]
        corr = float(spearmanr(xs, ys).statistic) if len(set(xs)) > 1 and len(set(ys)) > 1 else None
        out.append((f, max(means, key=means.get), corr))
    return out
