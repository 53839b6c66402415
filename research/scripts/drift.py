"""The optimum against budget, and the choice of the drift model (issue 32), from the first round's data.

    python research/scripts/drift.py table        # per setting and budget level: the best ρ with its bootstrap CI
    python research/scripts/drift.py backtest     # leave-one-setting-out: each candidate's range at 10 × and 30 × B, scored
    python research/scripts/drift.py population   # the population drift (round 1; both rounds, as race/stats/drift.py carries it, with --suite twice)

After the second round was unsealed, both rounds are development data; ``--suite`` given twice reads
them as one set of settings (``--suite research/validation/suite.yaml --suite research/validation/round2.yaml``),
with 100 × B grids scored too, and ``tables --write/--check`` use docs/drift.md's ``drift:rounds`` block.

Data: research/validation/runs/ (the first round, all of it development data now). Each constant-rate run's
held-out checkpoints (budget fractions 1/64 … 1, the same 100 checkpoint prompts throughout) are
IsoFLOP points at that fraction of its budget: a constant-rate run stopped at f · C is the run
planned at f · C (same knobs per step). A decaying schedule's early checkpoints are not (its rate has
not decayed yet), so such settings give only their end points. A run that fell back on its own
checkpoints (race.stats.instability.find_instability) is left out: its collapse is the stability issue's
subject, not the optimum's.

Budget levels: (grid, checkpoint fraction); x = log10(C / B), B the setting's pilot budget, so the
levels run from B/64 to 30 × B.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "research" / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import validation as V  # noqa: E402

GRIDS = ("pilot", "full10", "full30", "full100")
FACTORS = (("full10", 10.0), ("full30", 30.0), ("full100", 100.0))
N_BOOT = 400
# settings every run of which collapsed: no optimum to move
ALL_COLLAPSED = {"lr-x3", "lr-x3-cosine"}


def runs_of(rec: dict) -> list:
    """The record's complete runs that did not fall back."""
    from race.stats.instability import find_instability

    return [p for p in V.pilots_of(rec) if p.checkpoints and find_instability(p.checkpoints, "reward") is None]


def levels(s: dict, *, grids: Sequence[str] = GRIDS, max_factor: float = math.inf, seeds: int | None = None,
           extra: Sequence[tuple[str, float, Sequence[float], int]] = ()) -> list[dict[str, Any]]:
    """Budget levels of setting ``s``: each {kind, fraction, x, by_rho: {ρ measured: [per-seed means]}}.
    ``max_factor``: only levels at ≤ that × B; ``seeds``: the first seeds only; ``extra``: (kind,
    fraction, ρ targets, seeds) cells added from other grids (the emulated ladder)."""
    B = float(s["pilot_budget"])
    decays = ((s.get("overrides") or {}).get("learning_rate") or {}).get("schedule", "constant") != "constant"
    out: dict[tuple[str, float], dict] = {}

    def add(kind: str, rec: dict, want_fraction: float | None = None, rhos: Sequence[float] | None = None,
            n_seeds: int | None = None) -> None:
        meas = V.measured_rho(rec)
        for p in runs_of(rec):
            if rhos is not None and p.rho_target not in rhos:
                continue
            if n_seeds is not None and p.seed >= n_seeds:
                continue
            for c in p.checkpoints:
                if c.fraction <= 0 or (decays and c.fraction < 1) or not c.evals.get("reward"):
                    continue
                if want_fraction is not None and abs(c.fraction - want_fraction) > 1e-6:
                    continue
                key = (kind, round(c.fraction, 6))
                lv = out.setdefault(key, {"kind": kind, "fraction": c.fraction, "flops": [], "by_rho": {}})
                lv["flops"].append(c.flops.total)
                lv["by_rho"].setdefault(round(meas[p.rho_target], 4), []).append(statistics.fmean(c.evals["reward"]))

    for kind in grids:
        rec = V.load_run(s["name"], kind)
        if rec is not None:
            add(kind, rec, n_seeds=seeds if kind == "pilot" else None)
    for kind, frac, rhos, n in extra:
        rec = V.load_run(s["name"], kind)
        if rec is not None:
            add(f"{kind}@{frac:g}", rec, want_fraction=frac, rhos=rhos, n_seeds=n)
    res = []
    for lv in out.values():
        lv["x"] = math.log10(statistics.fmean(lv["flops"]) / B)
        if 10 ** lv["x"] <= max_factor * 1.0001:
            res.append(lv)
    return sorted(res, key=lambda lv: (lv["x"], lv["kind"]))


def optimum_ci(by_rho: dict[float, list[float]], *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """The best ρ (highest seed mean) and a bootstrap 95 % CI over seeds."""
    import numpy as np

    rhos = sorted(by_rho)
    means = [statistics.fmean(by_rho[r]) for r in rhos]
    best = rhos[int(np.argmax(means))]
    rng = np.random.default_rng(seed)
    picks = []
    for _ in range(n_boot):
        m = [np.mean(rng.choice(by_rho[r], len(by_rho[r]))) for r in rhos]
        picks.append(rhos[int(np.argmax(m))])
    lo, hi = np.quantile(picks, [0.025, 0.975])
    return best, float(lo), float(hi)


def observations(lvs: list[dict]) -> list:
    from race.stats.drift import Observation

    obs = []
    for i, lv in enumerate(lvs):
        pooled = [statistics.variance(v) for v in lv["by_rho"].values() if len(v) > 1]
        sd = math.sqrt(statistics.fmean(pooled)) if pooled else 0.05
        for rho, v in lv["by_rho"].items():
            obs.append(Observation(level=i, x=lv["x"], rho=rho, y=statistics.fmean(v), se=sd / math.sqrt(len(v))))
    return obs


def fit(lvs: list[dict]):
    from race.stats.drift import DriftError, fit_joint

    try:
        return fit_joint(observations(lvs))
    except DriftError:
        return None


# ---------------------------------------------------------------- the table

def table(suite: dict) -> list[str]:
    out = ["| setting | grid | fraction | budget (× B) | ρ points | best ρ (95 % CI) |", "|---|---|---|---|---|---|"]
    for s in suite["settings"]:
        if s["name"] in ALL_COLLAPSED:
            continue
        for lv in levels(s):
            if len(lv["by_rho"]) < 2:
                continue
            best, lo, hi = optimum_ci(lv["by_rho"])
            out.append(f"| {s['name']} | {lv['kind']} | {lv['fraction']:.3g} | {10 ** lv['x']:.3g} | {len(lv['by_rho'])} | "
                       f"{best:.2f} ({lo:.2f} … {hi:.2f}) |")
    return out


def per_setting_drift(suite: dict, *, exclude: str | None = None, grids: Sequence[str] = GRIDS) -> dict[str, Any]:
    """Each setting's joint-surface drift from all its data (pilots and full runs), and their
    precision-weighted population mean with the between-setting SD (DerSimonian–Laird)."""
    rows = {name: f for name, f in _all_fits(id(suite), suite, tuple(grids)).items() if name != exclude}
    return {"fits": rows, **pool([f.d for f in rows.values()], [f.d_se for f in rows.values()])}


_FITS: dict[tuple, dict] = {}


def _all_fits(key: int, suite: dict, grids: tuple[str, ...]) -> dict[str, Any]:
    """Every setting's joint-surface fit on all its grids, once per suite (the backtest leaves one out
    of the pooling, not out of the fitting of the others)."""
    if (key, grids) not in _FITS:
        rows = {}
        for s in suite["settings"]:
            if s["name"] in ALL_COLLAPSED:
                continue
            f = fit(levels(s, grids=grids))
            if f is not None and math.isfinite(f.d_se):
                rows[s["name"]] = f
        _FITS[(key, grids)] = rows
    return _FITS[(key, grids)]


def pool(ds: Sequence[float], ses: Sequence[float]) -> dict[str, float]:
    """Random-effects pooling (DerSimonian–Laird): the mean drift, its SE and the between-setting SD τ."""
    if not ds:
        return {"d": float("nan"), "se": float("nan"), "tau": float("nan"), "n": 0}
    w = [1 / se ** 2 for se in ses]
    mean_fe = sum(wi * d for wi, d in zip(w, ds)) / sum(w)
    q = sum(wi * (d - mean_fe) ** 2 for wi, d in zip(w, ds))
    c = sum(w) - sum(wi ** 2 for wi in w) / sum(w)
    tau2 = max(0.0, (q - (len(ds) - 1)) / c) if c > 0 else 0.0
    wr = [1 / (se ** 2 + tau2) for se in ses]
    mean = sum(wi * d for wi, d in zip(wr, ds)) / sum(wr)
    return {"d": mean, "se": math.sqrt(1 / sum(wr)), "tau": math.sqrt(tau2), "n": len(ds)}


# ---------------------------------------------------------------- the backtest

CANDIDATES = ("at B (the rule today)", "population drift", "own pilots' drift", "shrunk to the population",
              "ladder (emulated), shrunk", "GP surface (scikit-learn)",
              # after round 2 was unsealed (2026-12-04): the shrunk range, with the recommended point kept
              # at B's, or moved only by the grid's own drift where its 90 % CI excludes no move
              "shrunk range, point at B", "shrunk range, point by own evidence")


# The GP's kernel is fit by maximum marginal likelihood from 1 + GP_RESTARTS starts (the first at the
# kernel as given, the rest drawn by random_state 0), the best kept. One start stopped at the length-scale
# bounds (0.01, 0.01) in most fits, and whether a fit stopped there or nearby followed the CPU's rounding
# (a 1e-12 relative change of the inputs moved the reasoner's centre from 0.60 to 0.61); with 10 restarts the
# likelihood is higher in every fit and the centres do not move under that change (2026-12-08).
GP_RESTARTS = 10


def gp_centre(lvs: list[dict], x_f: float, rho_lo: float, rho_hi: float) -> float:
    """The argmax over ρ of a Gaussian-process fit of R(ρ, x) (scikit-learn, RBF + white noise, each
    level's mean removed) evaluated at x_f; the kernel's hyperparameters from the best of 1 + GP_RESTARTS
    optimizer starts."""
    import numpy as np
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, WhiteKernel

    X, y = [], []
    for lv in lvs:
        m = statistics.fmean(statistics.fmean(v) for v in lv["by_rho"].values())
        for rho, v in lv["by_rho"].items():
            X.append([rho, lv["x"]])
            y.append(statistics.fmean(v) - m)
    gp = GaussianProcessRegressor(RBF(length_scale=[0.2, 1.0], length_scale_bounds=(1e-2, 1e2)) + WhiteKernel(1e-3),
                                  normalize_y=True, n_restarts_optimizer=GP_RESTARTS, random_state=0).fit(np.array(X), np.array(y))
    grid = np.linspace(rho_lo, rho_hi, 61)
    pred = gp.predict(np.column_stack([grid, np.full_like(grid, x_f)]))
    return float(grid[int(np.argmax(pred))])


def score(full: dict, rec_rho: float) -> tuple[float, float, bool]:
    """(regret in reward, regret in pooled full-run SEs, whether the full runs' best ρ lies within
    ±half a grid step of ``rec_rho``... no: returned separately) — see backtest."""
    means = V.point_means(full)
    meas = V.measured_rho(full)
    on_axis = {meas[t]: v for t, v in means.items()}
    best_t = max(means, key=lambda t: statistics.fmean(means[t]))
    best_mean = statistics.fmean(means[best_t])
    dfs = [len(v) - 1 for v in means.values() if len(v) > 1]
    pooled = math.sqrt(sum((len(v) - 1) * statistics.variance(v) for v in means.values() if len(v) > 1) / sum(dfs))
    pse = pooled / math.sqrt(len(means[best_t]))
    regret = best_mean - V.interpolate(on_axis, rec_rho)
    return regret, regret / pse if pse > 0 else float("nan"), meas[best_t]


def _ladder_fit(s: dict, pilot: Any) -> Any:
    """``backtest``'s ladder: the pilot grid at 2 of its 3 seeds (8 B), plus, at ≈ 3 × B, the pilot-best
    point and the full grid's next point below it, 2 seeds each (the 10 × B runs' checkpoint at 0.305:
    4 × 3.05 B): 20.2 B against the grid's 12 B. Its fit, or None without the 10 × B runs' checkpoints."""
    full10 = V.load_run(s["name"], "full10")
    if full10 is None:
        return None
    fgrid = sorted({p.rho_target for p in V.pilots_of(full10)})
    pmeans = V.point_means(pilot)
    top = max(pmeans, key=lambda t: statistics.fmean(pmeans[t]))
    below = [t for t in fgrid if t < top - 1e-9]
    pts = [t for t in (top, below[-1] if below else None) if t is not None and t in fgrid]
    frac = min((c.fraction for p in V.pilots_of(full10) for c in p.checkpoints if c.fraction >= 0.25),
               default=None)
    return None if frac is None else fit(levels(s, grids=("pilot",), seeds=2, extra=[("full10", frac, pts, 2)]))


def backtest(suite: dict) -> list[dict[str, Any]]:
    """Leave one setting out: the population drift from the others' data (all grids); the held-out
    setting sees only its pilot grid (and, for the ladder, the longer pilots it would buy); each
    candidate's range at 10 × and 30 × B is scored against that setting's full runs."""
    from race.stats.drift import Z90, range_at, shrink

    rows = []
    for s in suite["settings"]:
        if s["name"] in ALL_COLLAPSED:
            continue
        pilot = V.load_run(s["name"], "pilot")
        pv = V.verdict(pilot)
        pop = per_setting_drift(suite, exclude=s["name"])
        own = fit(levels(s, grids=("pilot",)))
        ladder_fit = _ladder_fit(s, pilot)
        for kind, factor in FACTORS:
            full = V.load_run(s["name"], kind)
            if full is None or V.grid_class(V.diagnosis(full)) == "unstable":
                continue
            x_f = math.log10(factor)
            tau = max(pop["tau"], pop["se"])

            def moved(d: float, se: float) -> tuple[tuple[float, float], float]:
                r = range_at(pv.rho_range, pv.recommended_rho, pilot_budget=1.0, full_run_budget=factor,
                             drift=d, drift_se=se)
                return r.rho_range, r.recommended_rho

            half = (pv.rho_range[1] - pv.rho_range[0]) / 2
            recs: dict[str, tuple[tuple[float, float], float]] = {CANDIDATES[0]: (pv.bounds, pv.recommended_rho)}
            recs[CANDIDATES[1]] = moved(pop["d"], tau)
            if own is not None and math.isfinite(own.d_se):
                c = min(0.99, max(0.01, pv.recommended_rho + own.d * x_f))
                recs[CANDIDATES[2]] = ((c - half, c + half), c)
            recs[CANDIDATES[3]] = moved(*shrink(own.d if own else float("nan"), own.d_se if own else math.inf,
                                                pop["d"], tau))
            (s_lo, s_hi), _ = recs[CANDIDATES[3]]
            recs[CANDIDATES[6]] = ((s_lo, s_hi), min(s_hi, max(s_lo, pv.recommended_rho)))
            own_move = (own.d * x_f if own is not None and math.isfinite(own.d_se) and abs(own.d) > Z90 * own.d_se
                        else 0.0)
            recs[CANDIDATES[7]] = ((s_lo, s_hi), min(s_hi, max(s_lo, pv.recommended_rho + own_move)))
            if ladder_fit is not None:
                recs[CANDIDATES[4]] = moved(*shrink(ladder_fit.d, ladder_fit.d_se, pop["d"], tau))
            grid = sorted(V.measured_rho(pilot).values())
            c = gp_centre(levels(s, grids=("pilot",)), x_f, grid[0] - 0.1, grid[-1])
            recs[CANDIDATES[5]] = ((c - half, c + half), c)
            fmeas = sorted(V.measured_rho(full).values())
            for name, ((lo, hi), rho) in recs.items():
                regret, regret_se, best = score(full, rho)
                rows.append({"setting": s["name"], "half": s.get("half", "held-out"), "factor": factor, "model": name, "rho": rho,
                             "range": (lo, hi), "in_range": V._within(best, lo, hi), "best": best,
                             # a recommendation past the measured full grid by more than 0.05: its regret is unknown
                             "outside": rho < fmeas[0] - 0.05 or rho > fmeas[-1] + 0.05,
                             "regret": regret, "regret_se": regret_se,
                             "d_pop": pop["d"], "d_own": own.d if own else float("nan")})
    return rows


def backtest_lines(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| model | factor | settings | median regret, pooled SEs (CI, coverage) | mean regret (reward) | "
           "full-run best ρ in the range | recommended ρ past the measured grid |", "|---|---|---|---|---|---|---|"]
    for name in CANDIDATES:
        for _, factor in FACTORS:
            sel = [r for r in rows if r["model"] == name and r["factor"] == factor and math.isfinite(r["regret_se"])]
            if not sel:
                continue
            lo, hi, cov = V.median_ci([r["regret_se"] for r in sel])
            med = statistics.median(r["regret_se"] for r in sel)
            inr = sum(r["in_range"] for r in sel)
            w_lo, w_hi = V.wilson(inr, len(sel))
            out.append(f"| {name} | {factor:g} × | {len(sel)} | {med:.2f} ({lo:.2f} … {hi:.2f}, {cov:.0%}) | "
                       f"{statistics.fmean(r['regret'] for r in sel):.4f} | {inr}/{len(sel)} ({w_lo:.2f} … {w_hi:.2f}) | "
                       f"{sum(r['outside'] for r in sel)} |")
    out += ["", "Per setting: the range at F, its recommended ρ and (regret in pooled full-run SEs); ✗: the "
            "full-run best ρ outside the range.", "",
            "| setting | factor | full-run best ρ | " + " | ".join(CANDIDATES) + " |",
            "|---|---|---|" + "---|" * len(CANDIDATES)]
    keyed: dict[tuple, dict] = {}
    for r in rows:
        keyed.setdefault((r["setting"], r["factor"]), {})[r["model"]] = r
    for (name, factor), by in keyed.items():
        best = next(iter(by.values()))["best"]
        cells = [f"[{by[m]['range'][0]:.2f}, {by[m]['range'][1]:.2f}] {by[m]['rho']:.2f} ({by[m]['regret_se']:.2f})"
                 + ("" if by[m]["in_range"] else " ✗") if m in by else "—" for m in CANDIDATES]
        out.append(f"| {name} | {factor:g} × | {best:.2f} | " + " | ".join(cells) + " |")
    return out


BEGIN, END = "<!-- drift:tables:begin -->", "<!-- drift:tables:end -->"
ROUNDS_BEGIN, ROUNDS_END = "<!-- drift:rounds:begin -->", "<!-- drift:rounds:end -->"   # several suites read as one


def population_lines(suite: dict) -> list[str]:
    pop = per_setting_drift(suite)
    out = ["| setting | drift (ρ per decade) | SE | optimum at B (c0) | curvature k | budget levels |",
           "|---|---|---|---|---|---|"]
    for name, f in pop["fits"].items():
        out.append(f"| {name} | {f.d:+.3f} | {f.d_se:.3f} | {f.c0:.2f} | {f.k:.3g} | {f.levels} |")
    out += ["", f"Population (random-effects, DerSimonian–Laird): **{pop['d']:+.3f} ρ per decade** (SE {pop['se']:.3f}), "
                f"between-setting SD τ = {pop['tau']:.3f}, {pop['n']} settings."]
    return out


def tables(suite: dict, *, optimum: bool = True) -> str:
    return "\n".join(["### The drift per setting (joint surface, all grids)", "", *population_lines(suite), "",
                      "### The backtest (leave one setting out)", "", *backtest_lines(backtest(suite)), "",
                      *(["### The optimum against budget", "", *table(suite), ""] if optimum else [])])


def combined(paths: Sequence[Path]) -> dict:
    """One suite of every setting that ran full grids in the suites at ``paths`` (their names are
    distinct), each read from its own round's committed data (validation.RUNS_OF)."""
    if len(paths) == 1:
        suite = V.load_suite(paths[0])
        if suite.get("runs"):
            V.RUNS = V.ROOT / suite["runs"]
        return suite
    settings = []
    for path in paths:
        suite = V.load_suite(path)
        runs = V.ROOT / suite["runs"] if suite.get("runs") else V.RUNS
        for s in suite["settings"]:
            if V.planned(s, "full10"):
                V.RUNS_OF[s["name"]] = runs
                settings.append(s)
    return {"settings": settings}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["table", "backtest", "population", "tables"])
    ap.add_argument("--check", default=None, help="tables: exit 1 if this doc's drift block differs")
    ap.add_argument("--write", default=None, help="tables: rewrite this doc's drift block")
    ap.add_argument("--suite", action="append", default=None,
                    help="a suite file; give it twice to read several rounds as one set of settings (default: "
                         "the first round); tables --write/--check then use that set's own block")
    args = ap.parse_args(argv)
    rounds = bool(args.suite and len(args.suite) > 1)
    suite = combined([Path(x) for x in args.suite or [V.SUITE]])
    begin, end = (ROUNDS_BEGIN, ROUNDS_END) if rounds else (BEGIN, END)
    if args.cmd == "tables":
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # the GP's convergence notes
            text = tables(suite, optimum=not rounds)
        if args.check:
            if V._doc_tables(Path(args.check).read_text(), begin, end) != text:
                sys.stderr.write(f"{args.check}: the drift tables differ from what research/validation/runs/ gives; run: "
                                 f"python research/scripts/drift.py tables --write {args.check}\n")
                return 1
        elif args.write:
            doc = Path(args.write).read_text()
            head, rest = doc.split(begin, 1)
            Path(args.write).write_text(head + begin + "\n" + text + end + rest.split(end, 1)[1])
        else:
            sys.stdout.write(text)
        return 0
    if args.cmd == "table":
        print("\n".join(table(suite)))
    elif args.cmd == "population":
        pop = per_setting_drift(suite)
        for name, f in pop["fits"].items():
            print(f"{name:<16} d = {f.d:+.3f} ± {f.d_se:.3f} per decade  (c0 {f.c0:.2f}, k {f.k:.3g}, {f.levels} levels)")
        print(f"population: d = {pop['d']:+.3f} (SE {pop['se']:.3f}), between-setting SD τ = {pop['tau']:.3f}, "
              f"{pop['n']} settings")
    else:
        print("\n".join(backtest_lines(backtest(suite))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
