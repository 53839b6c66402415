"""Issue 49 item 6: does a drift that levels off beat the linear drift on held-out budgets?

    python research/scripts/drift_saturating.py shape      # the pooled optimum against budget: linear and logistic fits
    python research/scripts/drift_saturating.py backtest   # leave one setting out: each drift's range at 10, 30, 100 × B, scored
    python research/scripts/drift_saturating.py own        # when is a setting's own drift better than the population's?
    python research/scripts/drift_saturating.py tables                        # every table of docs/drift.md's block
    python research/scripts/drift_saturating.py tables --check docs/drift.md  # exit 1 if the doc's tables differ
    python research/scripts/drift_saturating.py tables --write docs/drift.md  # rewrite them

Data: both validation rounds' committed records (research/validation/runs/, research/validation/round2/runs/),
read through research/scripts/drift.py (its budget levels: every constant-rate run's held-out checkpoints,
collapsed runs left out). Development data only; nothing is run. Deterministic (no random numbers; the
fits start from fixed points); under a minute on two cores.

**The shape.** The IsoCompute Playbook (Cheng et al., "IsoCompute Playbook: Optimally Scaling Sampling
Compute for LLM RL", arXiv:2603.12151) finds the compute-optimal rollouts per problem n*(C) rising along
a sigmoid in log C and then saturating. RACE's drift (race.stats.drift) is linear in x = log10(C / B). To
compare the two shapes on the same footing, each setting's optimum is first read at every budget level:
a joint surface R = α_level − k (ρ − c_level)² with one curvature k per setting and a free centre c_level
per level (levels with ≥ 3 ρ points; centres bounded to [−0.5, 1.5] as in race.stats.drift.fit_joint;
SEs from the Jacobian). Then the settings' centres are pooled with one offset a_s per setting and a
shared shape g(x), weighted by 1 / max(SE, 0.03), by scipy.optimize.curve_fit:

- linear: g(x) = d · x;
- logistic: g(x) = Δ · (σ((x − x0) / w) − σ(−x0 / w)), Δ the ceiling of the move (its total over all
  budgets), x0 its midpoint, w its width; g(0) = 0. "free": x0 ∈ [−2, 4]; "levels off": x0 ∈ [−2, 0.5],
  so that the move decelerates past B (the Playbook's saturating regime).

**The backtest** is drift.py's (leave one setting out; the held-out setting sees only its pilot grid;
scored against its full runs at 10 × B, and at 30 × and 100 × B, the held-out budgets of item 6): median
regret in pooled full-run SEs at the recommended ρ, and whether the full-run best ρ lies in the range at F.
The shapes are fitted on the other settings only. Each candidate moves the pilot grid's range at B with
race.stats.drift.range_at: same CI as the linear candidate it replaces, only the move differs.

- "population drift" and "shrunk to the population" are drift.py's (the pooled random-effects drift of
  the other settings; RACE today);
- "pooled linear" is the linear g fitted on the other settings' centres (the control for the method);
- "logistic (free)" and "logistic (levels off)" move by g(x_F) of the other settings' logistic fit;
- "shrunk × logistic shape" is RACE's shrunk drift with the population logistic's deceleration:
  move = d_shrunk · g(x_F) / (d_pooled · x_F) · x_F (g: the "levels off" logistic);
- "longer pilots (≈ 3 × B), shrunk": the own drift of longer pilots (below), shrunk as RACE shrinks;
  "longer pilots, own where SE < τ": their own drift unshrunk where its SE is below τ, else shrunk. The
  range at B stays the pilot grid's. At 10 × B these read the scored runs' own early checkpoints (not
  independent of the score); at 30 × and 100 × B the scored runs are other runs.

**A setting's own drift.** Each setting's drift from its pilot grid alone (race.stats.drift.fit_joint on its
checkpoints) and from "longer pilots" (the pilot grid plus its 10 × B runs' checkpoints up to 0.305 of
their budget, ≈ 3 × B: the design's continued pilots), against its drift measured on its full-run grids
alone (10, 30, 100 × B runs: independent of the pilot grid). The own drift beats the population's where it
lies closer to that reference. κ, the RMS of (own − reference) / √(SE_own² + SE_ref²), says how far the
fit's SE understates the own drift's real error; the own drift is worth more than the population's where
κ · SE_own < τ (the between-setting SD).
"""
from __future__ import annotations

import math
import statistics
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "research" / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import drift as D  # noqa: E402
import validation as V  # noqa: E402

SUITES = (ROOT / "research" / "validation" / "suite.yaml", ROOT / "research" / "validation" / "round2.yaml")
BEGIN, END = "<!-- drift-saturating:tables:begin -->", "<!-- drift-saturating:tables:end -->"
SE_FLOOR = 0.03          # the pooled shape fit: no level centre weighs more than one of SE 0.03
SHAPES = {"linear": None, "logistic (free)": (-2.0, 4.0), "logistic (levels off)": (-2.0, 0.5)}
LONGER = 0.305           # "longer pilots": the 10 × B runs read up to this fraction (≈ 3 × B)
CANDIDATES = ("population drift", "shrunk to the population", "pooled linear", "logistic (free)",
              "logistic (levels off)", "shrunk × logistic shape", "longer pilots (≈ 3 × B), shrunk",
              "longer pilots, own where SE < τ")


@lru_cache(maxsize=1)
def suite() -> dict:
    return D.combined(list(SUITES))


def settings() -> list[dict]:
    return [s for s in suite()["settings"] if s["name"] not in D.ALL_COLLAPSED]


# ---------------------------------------------------------------- the optimum at each budget level

def level_centres(lvs: list[dict]) -> list[tuple[float, float, float]]:
    """(x, centre, SE) per budget level: R = α_level − k (ρ − c_level)², one k, weighted as fit_joint."""
    import numpy as np
    from scipy.optimize import least_squares

    obs = D.observations(lvs)
    by: dict[int, list] = {}
    for o in obs:
        by.setdefault(o.level, []).append(o)
    keep = [lv for lv, os in sorted(by.items()) if len({round(o.rho, 6) for o in os}) >= 3]
    if len(keep) < 2:
        return []
    pts = [o for lv in keep for o in by[lv]]
    li = {lv: i for i, lv in enumerate(keep)}
    L = np.array([li[o.level] for o in pts])
    r = np.array([o.rho for o in pts])
    y = np.array([o.y for o in pts])
    w = 1.0 / np.maximum(np.array([o.se for o in pts]), 0.005)
    nl = len(keep)

    def resid(p):
        return w * (p[:nl][L] - p[nl] * (r - p[nl + 1:][L]) ** 2 - y)

    lo = np.concatenate([np.full(nl, -np.inf), [1e-6], np.full(nl, -0.5)])
    hi = np.concatenate([np.full(nl, np.inf), [1e3], np.full(nl, 1.5)])
    best = None
    for c_start in (float(r.mean()), float(r.min()), float(r.max())):
        for k_start in (0.5, 5.0):
            p0 = np.concatenate([[max(o.y for o in by[lv]) for lv in keep], [k_start], np.full(nl, c_start)])
            res = least_squares(resid, p0, bounds=(lo, hi), method="trf", max_nfev=2000)
            if best is None or res.cost < best.cost:
                best = res
    dof = max(1, len(pts) - len(best.x))
    cov = np.linalg.pinv(best.jac.T @ best.jac) * max(2 * best.cost / dof, 1.0)
    se = np.sqrt(np.maximum(np.diag(cov)[nl + 1:], 0.0))
    return [(by[lv][0].x, float(c), float(e)) for lv, c, e in zip(keep, best.x[nl + 1:], se)]


@lru_cache(maxsize=1)
def centres() -> dict[str, tuple]:
    """Every setting's level centres from all its grids (the pooled shape leaves one setting out of the pooling)."""
    return {s["name"]: tuple(level_centres(D.levels(s))) for s in settings()}


def sigmoid(z):
    from scipy.special import expit

    return expit(z)


def shape_g(kind: str, p: Sequence[float], x):
    """The move g(x) of a fitted shape (g(0) = 0)."""
    if kind == "linear":
        return p[0] * x
    delta, x0, w = p
    return delta * (sigmoid((x - x0) / w) - sigmoid(-x0 / w))


@lru_cache(maxsize=None)
def pooled_shape(kind: str, exclude: str | None = None) -> dict[str, Any]:
    """The shape g fitted by curve_fit on the level centres of every setting but ``exclude``, one free
    offset per setting. Returns its parameters, their SEs, the weighted residual sum of squares and n."""
    import numpy as np
    from scipy.optimize import curve_fit

    names = [n for n, c in centres().items() if n != exclude and len(c) >= 2]
    S, X, Y, E = [], [], [], []
    for i, n in enumerate(names):
        for x, c, e in centres()[n]:
            S.append(i), X.append(x), Y.append(c), E.append(max(e, SE_FLOOR))
    S, X, Y, E = map(np.asarray, (S, X, Y, E))
    ns = len(names)

    def f(_, *p):
        return np.asarray(p[:ns])[S] + shape_g(kind, p[ns:], X)

    if kind == "linear":
        starts, lo, hi = [[-0.05]], [-1.0], [1.0]
    else:
        x0_lo, x0_hi = SHAPES[kind]
        lo, hi = [-1.5, x0_lo, 0.15], [1.5, x0_hi, 3.0]
        starts = [[d, x0, w] for d in (-0.3, -0.1) for x0 in (-1.0, 0.0, 1.0, 2.0) if x0_lo <= x0 <= x0_hi
                  for w in (0.3, 1.0)]
    best = None
    for st in starts:
        try:
            p, cov = curve_fit(f, None, Y, p0=[0.5] * ns + st, sigma=E, bounds=([-1.0] * ns + lo, [2.0] * ns + hi),
                               maxfev=20000)
        except RuntimeError:
            continue
        rss = float(np.sum(((f(None, *p) - Y) / E) ** 2))
        if best is None or rss < best[0] - 1e-9:
            best = (rss, p, cov)
    rss, p, cov = best
    se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    return {"p": tuple(float(v) for v in p[ns:]), "se": tuple(float(v) for v in se[ns:]), "rss": rss, "n": len(Y),
            "settings": ns}


def shape_lines() -> list[str]:
    out = ["| shape | parameters (SE) | weighted RSS | move at 10 × B | at 30 × B | at 100 × B | at 1000 × B |",
           "|---|---|---|---|---|---|---|"]
    for kind in SHAPES:
        f = pooled_shape(kind)
        if kind == "linear":
            par = f"d = {f['p'][0]:+.3f} ({f['se'][0]:.3f}) per decade"
        else:
            par = (f"Δ = {f['p'][0]:+.2f} ({f['se'][0]:.2f}), x0 = {f['p'][1]:+.2f} ({f['se'][1]:.2f}), "
                   f"w = {f['p'][2]:.2f} ({f['se'][2]:.2f})")
        moves = " | ".join(f"{shape_g(kind, f['p'], math.log10(k)):+.3f}" for k in (10, 30, 100, 1000))
        out.append(f"| {kind} | {par} | {f['rss']:.1f} | {moves} |")
    f = pooled_shape("linear")
    out += ["", f"{f['n']} level centres of {f['settings']} settings (a free offset each). The free logistic's "
                f"midpoint x0 runs to its bound when the centres do not level off within the data."]
    return out


def band_lines() -> list[str]:
    """The drift below B and above B, per setting (fit_joint on the levels at x ≤ 0 and at x ≥ 0), pooled."""
    lows, highs = [], []
    out = ["| setting | drift at ≤ B (SE) | drift at ≥ B (SE) | levels above B |", "|---|---|---|---|"]
    for s in settings():
        lvs = D.levels(s)
        lo_f = D.fit([lv for lv in lvs if lv["x"] <= 0.01])
        hi_lvs = [lv for lv in lvs if lv["x"] >= -0.01]
        hi_f = D.fit(hi_lvs)
        if not (lo_f and hi_f and math.isfinite(lo_f.d_se) and math.isfinite(hi_f.d_se)):
            continue
        lows.append((lo_f.d, lo_f.d_se))
        highs.append((hi_f.d, hi_f.d_se))
        out.append(f"| {s['name']} | {lo_f.d:+.3f} ({lo_f.d_se:.3f}) | {hi_f.d:+.3f} ({hi_f.d_se:.3f}) | {hi_f.levels} |")
    pl = D.pool([d for d, _ in lows], [e for _, e in lows])
    ph = D.pool([d for d, _ in highs], [e for _, e in highs])
    steeper = sum(h[0] < l[0] for l, h in zip(lows, highs))
    out += ["", f"Pooled (DerSimonian–Laird): below B {pl['d']:+.3f} ρ per decade (SE {pl['se']:.3f}, τ {pl['tau']:.3f}), "
                f"above B {ph['d']:+.3f} (SE {ph['se']:.3f}, τ {ph['tau']:.3f}), {pl['n']} settings; the drift is "
                f"steeper (more negative) above B in {steeper} of {len(lows)}."]
    return out


# ---------------------------------------------------------------- the backtest

@lru_cache(maxsize=1)
def backtest() -> tuple[dict, ...]:
    from race.stats.drift import range_at, shrink

    rows = []
    for s in settings():
        name = s["name"]
        pilot = V.load_run(name, "pilot")
        pv = V.verdict(pilot)
        pop = D.per_setting_drift(suite(), exclude=name)
        own = D.fit(D.levels(s, grids=("pilot",)))
        tau = max(pop["tau"], pop["se"])
        d_sh, se_sh = shrink(own.d if own else float("nan"), own.d_se if own else math.inf, pop["d"], tau)
        lin = pooled_shape("linear", name)["p"]
        longer = D.fit(longer_levels(s))
        if longer is not None and math.isfinite(longer.d_se):
            d_lo, se_lo = shrink(longer.d, longer.d_se, pop["d"], tau)
            d_ov, se_ov = (longer.d, longer.d_se) if longer.d_se < tau else (d_lo, se_lo)
        else:
            d_lo = d_ov = se_lo = se_ov = None
        for kind, factor in D.FACTORS:
            full = V.load_run(name, kind)
            if full is None or V.grid_class(V.diagnosis(full)) == "unstable":
                continue
            x_f = math.log10(factor)

            def moved(move: float, se: float) -> tuple[tuple[float, float], float]:
                r = range_at(pv.rho_range, pv.recommended_rho, pilot_budget=1.0, full_run_budget=factor,
                             drift=move / x_f, drift_se=se)
                return r.rho_range, r.recommended_rho

            g_free = shape_g("logistic (free)", pooled_shape("logistic (free)", name)["p"], x_f)
            g_off = shape_g("logistic (levels off)", pooled_shape("logistic (levels off)", name)["p"], x_f)
            recs = {"population drift": moved(pop["d"] * x_f, tau),
                    "shrunk to the population": moved(d_sh * x_f, se_sh),
                    "pooled linear": moved(lin[0] * x_f, tau),
                    "logistic (free)": moved(g_free, tau),
                    "logistic (levels off)": moved(g_off, tau),
                    "shrunk × logistic shape": moved(d_sh * x_f * g_off / (lin[0] * x_f), se_sh)}
            if d_lo is not None:
                recs["longer pilots (≈ 3 × B), shrunk"] = moved(d_lo * x_f, se_lo)
                recs["longer pilots, own where SE < τ"] = moved(d_ov * x_f, se_ov)
            for model, ((lo, hi), rho) in recs.items():
                regret, regret_se, best = D.score(full, rho)
                rows.append({"setting": name, "factor": factor, "model": model, "rho": rho, "range": (lo, hi),
                             "in_range": V._within(best, lo, hi), "best": best, "regret": regret,
                             "regret_se": regret_se})
    return tuple(rows)


def summary(model: str, factors: Sequence[float]) -> dict[str, Any]:
    sel = [r for r in backtest() if r["model"] == model and r["factor"] in factors and math.isfinite(r["regret_se"])]
    return {"n": len(sel), "median": statistics.median(r["regret_se"] for r in sel),
            "ci": V.median_ci([r["regret_se"] for r in sel]), "mean": statistics.fmean(r["regret"] for r in sel),
            "covered": sum(r["in_range"] for r in sel)}


FACTOR_SETS = (("10 × B", (10.0,)), ("30 × B", (30.0,)), ("100 × B", (100.0,)), ("30 × and 100 × B (held out)", (30.0, 100.0)))


def backtest_lines() -> list[str]:
    out = ["| drift model | full runs at | grids | median regret, pooled SEs (CI, coverage) | mean regret (reward) "
           "| full-run best ρ in the range |", "|---|---|---|---|---|---|"]
    for model in CANDIDATES:
        for lab, fs in FACTOR_SETS:
            s = summary(model, fs)
            lo, hi, cov = s["ci"]
            out.append(f"| {model} | {lab} | {s['n']} | {s['median']:.2f} ({lo:.2f} … {hi:.2f}, {cov:.0%}) | "
                       f"{s['mean']:.4f} | {s['covered']}/{s['n']} |")
    out += ["", "The 30 × and 100 × B grids, per grid: recommended ρ (regret in pooled SEs); ✗ the full-run best ρ "
                "outside the range.", "", "| grid | full-run best ρ | " + " | ".join(CANDIDATES) + " |",
            "|---|---|" + "---|" * len(CANDIDATES)]
    keyed: dict[tuple, dict] = {}
    for r in backtest():
        if r["factor"] > 10:
            keyed.setdefault((r["setting"], r["factor"]), {})[r["model"]] = r
    for (name, factor), by in keyed.items():
        best = next(iter(by.values()))["best"]
        cells = [f"{by[m]['rho']:.2f} ({by[m]['regret_se']:.2f})" + ("" if by[m]["in_range"] else " ✗")
                 if m in by else "—" for m in CANDIDATES]
        out.append(f"| {name} {factor:g}× | {best:.2f} | " + " | ".join(cells) + " |")
    return out


# ---------------------------------------------------------------- a setting's own drift

def longer_levels(s: dict) -> list[dict]:
    """The pilot grid's levels plus its 10 × B runs' checkpoints up to LONGER of their budget (≈ 3 × B):
    the levels "longer pilots" continued from the grid would add."""
    full10 = V.load_run(s["name"], "full10")
    if full10 is None:
        return D.levels(s, grids=("pilot",))
    fracs = sorted({round(c.fraction, 6) for p in V.pilots_of(full10) for c in p.checkpoints
                    if 0 < c.fraction <= LONGER + 1e-3})
    rhos = sorted({p.rho_target for p in V.pilots_of(full10)})
    return D.levels(s, grids=("pilot",), extra=[("full10", f, rhos, 10 ** 6) for f in fracs])


@lru_cache(maxsize=1)
def own_rows() -> tuple[dict, ...]:
    rows = []
    for s in settings():
        name = s["name"]
        ref = D.fit(D.levels(s, grids=("full10", "full30", "full100")))
        if ref is None or not math.isfinite(ref.d_se):
            continue
        pop = D.per_setting_drift(suite(), exclude=name)
        row = {"setting": name, "ref": ref.d, "ref_se": ref.d_se, "pop": pop["d"], "tau": max(pop["tau"], pop["se"])}
        for key, lvs in (("pilot", D.levels(s, grids=("pilot",))), ("longer", longer_levels(s))):
            f = D.fit(lvs)
            ok = f is not None and math.isfinite(f.d_se)
            row[key] = f.d if ok else float("nan")
            row[key + "_se"] = f.d_se if ok else float("nan")
        rows.append(row)
    return tuple(rows)


def kappa(key: str) -> float:
    zs = [(r[key] - r["ref"]) / math.hypot(r[key + "_se"], r["ref_se"]) for r in own_rows() if r[key] == r[key]]
    return math.sqrt(statistics.fmean(z * z for z in zs))


def own_lines() -> list[str]:
    rows = own_rows()
    out = ["| setting | drift on the full runs alone (SE) | population (others) | pilot grid's own (SE) | closer | "
           "longer pilots' own, to ≈ 3 × B (SE) | closer |", "|---|---|---|---|---|---|---|"]

    def closer(r: dict, key: str) -> str:
        if r[key] != r[key]:
            return "—"
        return "own" if abs(r[key] - r["ref"]) < abs(r["pop"] - r["ref"]) else "population"

    for r in rows:
        cells = []
        for key in ("pilot", "longer"):
            cells.append("—" if r[key] != r[key] else f"{r[key]:+.3f} ({r[key + '_se']:.3f})")
            cells.append(closer(r, key))
        out.append(f"| {r['setting']} | {r['ref']:+.3f} ({r['ref_se']:.3f}) | {r['pop']:+.3f} | " + " | ".join(cells) + " |")
    tau = statistics.median(r["tau"] for r in rows)
    out += ["", "| own drift from | settings | own closer than the population | κ (error / stated SE) | "
                "SE at which own beats the population (τ / κ) | settings under it | of those, own closer |",
            "|---|---|---|---|---|---|---|"]
    for key, lab in (("pilot", "the pilot grid"), ("longer", "longer pilots (≈ 3 × B)")):
        sel = [r for r in rows if r[key] == r[key]]
        k = kappa(key)
        bar = tau / k
        under = [r for r in sel if r[key + "_se"] < bar]
        out.append(f"| {lab} | {len(sel)} | {sum(closer(r, key) == 'own' for r in sel)} | {k:.2f} | {bar:.3f} | "
                   f"{len(under)} | {sum(closer(r, key) == 'own' for r in under)} |")
    out += ["", f"τ = {tau:.3f} (the between-setting SD of the others, median over the settings)."]
    return out


SECTIONS = (("The optimum against budget, pooled: linear or logistic", shape_lines),
            ("The drift below and above B", band_lines),
            ("The backtest: linear against saturating drift (leave one setting out)", backtest_lines),
            ("When a setting's own drift beats the population's", own_lines))


def tables() -> str:
    return V.section_tables(SECTIONS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = {"shape": lambda: shape_lines() + [""] + band_lines(), "backtest": backtest_lines, "own": own_lines}
    if not argv or argv[0] not in (*cmds, "tables"):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    if argv[0] == "tables":
        return V.doc_command(argv[1:], tables, BEGIN, END, "research/scripts/drift_saturating.py")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print("\n".join(cmds[argv[0]]()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
