"""Issue 49 item 4: early stopping on the learning curve, replayed on rounds 1–2's pilot grids.

    python research/scripts/lc_stop.py replay                         # each stopping rule against the flat grid
    python research/scripts/lc_stop.py tables                         # docs/pilot.md's block
    python research/scripts/lc_stop.py tables --check docs/pilot.md   # exit 1 if the doc's tables differ
    python research/scripts/lc_stop.py tables --write docs/pilot.md   # rewrite them

Every pilot of a committed pilot grid holds its held-out learning curve: the mean reward on the 100
checkpoint prompts at budget fractions 1/64 … 0.55 and 1. A stopping rule decides once, at a fraction f
of B (one of those checkpoints: 0.17, 0.30 or 0.55). For every pilot it fits the curve up to f and
extrapolates it to f = 1; per ρ point the prediction is the mean over its seeds, its SE their SD / √n.
A point stops when the best point's prediction exceeds its own by more than z · √(SE_best² + SE²): its
extrapolated curve cannot reach the best. The best point never stops. A stopped pilot costs f · B.

Curve models (scipy.optimize.curve_fit; fraction t of B):
- "power law": y = a − b · t^(−c), b ≥ 0, 0 < c ≤ 2 (pow3 of Domhan et al., a saturating curve; at
  t = 1 it predicts a − b); a pilot with fewer than 3 checkpoints up to f, or a failed fit, falls back
  to the log-linear fit;
- "log-linear": y = a + b · ln t on the checkpoints up to f (no saturation: optimistic for rising curves);
- "no extrapolation": the value at f itself (successive halving's read, with the same CI rule).
lcpfn (LC-PFN) and ifbo (in-context freeze-thaw) were tried first; neither runs here (docs/pilot.md).

What the design then reports, by the project's rules (research/scripts/replay.py, whose helpers it uses):
race.stats.regime.classify on the grid as the design holds it, on the 100 checkpoint prompts (the only
prompts a stopped pilot was evaluated on): the surviving points as run (their end checkpoint), a stopped
point at its extrapolated value (its pilots read at f, shifted by the point's predicted gain from f to B),
then
race.stats.drift.range_for_pilots with the population drift of the other settings (leave one setting
out); the drift sees the survivors' checkpoints and the stopped pilots' up to f. Scored as replay.py's
designs on the frozen reading (500 prompts, all runs) of the 24 scored grids that learned something.
The reference is the flat grid read the same way (checkpoint prompts); a rule that stops nothing in a
grid gives that reference's answer there exactly. Deterministic (classify's fixed bootstrap
seed; the fits start from fixed points).
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

import replay as R  # noqa: E402
import validation as V  # noqa: E402

BEGIN, END = "<!-- lc-stop:tables:begin -->", "<!-- lc-stop:tables:end -->"
FRACS = (0.168238, R.MID, R.LATE)
MODELS = ("power law", "log-linear", "no extrapolation")
RULES: list[tuple[str, str, float, float]] = [(f"{m}, stop at {f:.2f} B, z = {z:g}", m, f, z)
                                              for m in MODELS for f in FRACS for z in (2.0,)]
RULES += [(f"power law, stop at {f:.2f} B, z = 1", "power law", f, 1.0) for f in FRACS]


# ---------------------------------------------------------------- the curves

def curve(p: dict, frac: float) -> list[tuple[float, float]]:
    """(fraction, mean checkpoint reward) of a pilot's checkpoints in (0, frac]."""
    return [(c["fraction"], statistics.fmean(c["evals"]["reward"])) for c in p["checkpoints"]
            if 0 < c["fraction"] <= frac + 1e-4 and c["evals"].get("reward")]


def extrapolate(pts: list[tuple[float, float]], model: str) -> float:
    """The curve's value at t = 1 predicted from ``pts`` by ``model``."""
    import numpy as np
    from scipy.optimize import curve_fit

    t = np.array([a for a, _ in pts])
    y = np.array([b for _, b in pts])
    if model == "no extrapolation" or len(pts) < 2:
        return float(y[-1])
    if model == "power law" and len(pts) >= 3:
        def f(tt, a, b, c):
            return a - b * tt ** (-c)

        def jac(tt, a, b, c):           # exact derivatives: a numerical Jacobian was a third of the fit's time
            pw = tt ** (-c)
            return np.stack([np.ones_like(tt), -pw, b * pw * np.log(tt)], axis=1)

        best = None
        for c0 in (0.1, 0.5, 1.0):
            try:
                p, _ = curve_fit(f, t, y, p0=[y[-1] + 0.05, 0.05, c0], bounds=([-1.0, 0.0, 1e-3], [3.0, 5.0, 2.0]),
                                 jac=jac, maxfev=5000)
            except (RuntimeError, ValueError):
                continue
            rss = float(np.sum((f(t, *p) - y) ** 2))
            if best is None or rss < best[0] - 1e-12:
                best = (rss, p)
        if best is not None:
            return float(f(1.0, *best[1]))
    b, a = np.polyfit(np.log(t), y, 1)
    return float(a)


@lru_cache(maxsize=None)
def predictions(name: str, model: str, frac: float) -> dict[float, tuple[float, float, int]]:
    """ρ target → (mean prediction at B over its seeds, its SE, seeds)."""
    by: dict[float, list[float]] = {}
    for p in R.raw_pilots(name):
        by.setdefault(p["rho_target"], []).append(extrapolate(curve(p, frac), model))
    return {t: (statistics.fmean(v), statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else math.inf, len(v))
            for t, v in sorted(by.items())}


@lru_cache(maxsize=None)
def stopped(name: str, model: str, frac: float, z: float) -> frozenset:
    pred = predictions(name, model, frac)
    best = max(pred, key=lambda t: pred[t][0])
    mb, sb, _ = pred[best]
    return frozenset(t for t, (m, s, _) in pred.items()
                     if t != best and math.isfinite(s) and mb - m > z * math.sqrt(sb * sb + s * s))


# ---------------------------------------------------------------- the design's evidence and its range at F

def _shifted(p: dict, frac: float, shift: float):
    """A stopped pilot as the design holds it at B: read at ``frac`` (its checkpoint prompts), each
    score moved by ``shift``; its FLOPs and ρ as planned for B (the point stays on the grid's axis)."""
    from race.core.records import PilotResult

    c = R._ckpt(p, frac)
    evals = {k: [x + shift for x in v] if k == "reward" else list(v) for k, v in c["evals"].items()}
    return PilotResult.from_dict({**p, "evals": evals,
                                  "checkpoints": [x for x in p["checkpoints"] if x["fraction"] <= c["fraction"] + 1e-9]})


def _at_end(p: dict):
    """A pilot as run, its evaluation read on the checkpoint prompts (its end checkpoint)."""
    from race.core.records import PilotResult

    c = R._ckpt(p, 1.0)
    return PilotResult.from_dict({**p, "evals": dict(c["evals"])})


@lru_cache(maxsize=None)
def _classified(name: str, stop: frozenset, model: str, frac: float) -> dict[str, Any]:
    from race.stats.regime import classify

    s = next(x for x in R.all_settings() if x["name"] == name)
    B = float(s["pilot_budget"])
    raw = R.raw_pilots(name)
    keep = [p for p in raw if p["rho_target"] not in stop]
    pred = predictions(name, model, frac) if stop else {}
    pilots = [_at_end(p) for p in keep]
    held = [_shifted(p, frac, pred[p["rho_target"]][0] - statistics.fmean(R._ckpt(p, frac)["evals"]["reward"]))
            for p in raw if p["rho_target"] in stop]
    diag = classify(pilots + held, targets=["reward"], primary_target="reward", n_boot=R.N_BOOT, seed=0,
                    rerun_confidence=False)
    cost = (sum(p.flops.total for p in pilots)
            + sum(R.truncated(p, frac).flops.total for p in raw if p["rho_target"] in stop)) / B
    drift_pilots = pilots + [R.truncated(p, frac, rescale=False) for p in raw if p["rho_target"] in stop]
    return {"cost": cost, "drift_pilots": drift_pilots, "budget": B, "stopped": stop,
            "rho_range": tuple(diag.primary.rho_range), "recommended": diag.primary.recommended_rho,
            "regime": diag.primary.regime.value}


def evidence(name: str, model: str, frac: float, z: float) -> dict[str, Any]:
    """The design's grid at B, on the checkpoint prompts: the surviving points as run (their end
    checkpoint), a stopped point at its extrapolated value (its pilots read at ``frac``, each shifted
    by its point's predicted gain from ``frac`` to B); classify's verdict on it, its FLOPs in B."""
    stop = stopped(name, model, frac, z)
    return _classified(name, stop, model if stop else "", frac if stop else 1.0)


FLAT_CKPT = "flat grid (no stopping), checkpoint prompts"


@lru_cache(maxsize=None)
def design_at(i: int, rule: str) -> dict[str, Any]:
    from race.stats.drift import DriftError, range_for_pilots

    _, model, frac, z = next(r for r in RULES if r[0] == rule) if rule != FLAT_CKPT else (rule, "", 1.0, 0.0)
    g = R.grids()[i]
    ev = evidence(g["setting"], model, frac, z) if rule != FLAT_CKPT else _classified(g["setting"], frozenset(), "", 1.0)
    try:
        r = range_for_pilots(ev["drift_pilots"], target="reward", pilot_budget=ev["budget"], full_run_budget=g["F"],
                             rho_range=ev["rho_range"], recommended_rho=ev["recommended"], constant_rate=g["constant"],
                             population=R.loso_population(g["setting"]))
        (lo, hi), rho = r.rho_range, r.recommended_rho
    except DriftError:
        (lo, hi), rho = ev["rho_range"], ev["recommended"]
    rr = R.response(i)
    return {"cost": ev["cost"], "regime": ev["regime"], "range": (lo, hi), "rho": rho, "width": hi - lo,
            "covered": V._within(rr.best_rho, lo, hi), "regret": rr.regret(rho), "stopped": ev["stopped"]}


# ---------------------------------------------------------------- what it saves and what it costs

def pilot_best(name: str) -> float:
    """The pilot grid's best point at B (seed means on the final prompts)."""
    means = V.point_means(R.load(name, "pilot"))
    return max(means, key=lambda t: statistics.fmean(means[t]))


def nearest_full_best(i: int) -> float:
    """The pilot grid's point (ρ target) nearest, in measured ρ, to grid ``i``'s full-run best ρ."""
    g = R.grids()[i]
    meas = V.measured_rho(g["pilot"])
    best = R.response(i).best_rho
    return min(meas, key=lambda t: abs(meas[t] - best))


def rule_summary(rule: str, sel: Sequence[int]) -> dict[str, Any]:
    rows = [design_at(i, rule) for i in sel]
    flat = [design_at(i, FLAT_CKPT) for i in sel]
    _, model, frac, z = next(r for r in RULES if r[0] == rule)
    names = sorted({R.grids()[i]["setting"] for i in sel})
    firm = [(r, i) for r, i in zip(rows, sel) if R.full_regime(i) != "inconclusive"]
    return {"n": len(rows), "settings": len(names),
            "saving": 1 - statistics.fmean(evidence(n, model, frac, z)["cost"] / R.evidence(n, R.FLAT)["cost"]
                                           for n in names),
            "points": sum(len(stopped(n, model, frac, z)) for n in names),
            "grids_stopping": sum(bool(stopped(n, model, frac, z)) for n in names),
            "pilot_best_stopped": sum(pilot_best(n) in stopped(n, model, frac, z) for n in names),
            "full_best_stopped": sum(nearest_full_best(i) in r["stopped"] for r, i in zip(rows, sel)),
            "covered": sum(r["covered"] for r in rows), "regret": statistics.median(r["regret"] for r in rows),
            "mean_regret": statistics.fmean(r["regret"] for r in rows),
            "worse": sum(r["regret"] > f["regret"] + 1e-9 for r, f in zip(rows, flat)),
            "better": sum(r["regret"] < f["regret"] - 1e-9 for r, f in zip(rows, flat)),
            "same": sum(r["regime"] == R.full_regime(i) for r, i in firm), "firm": len(firm)}


def replay_lines() -> list[str]:
    sel = R.scored_learned()
    flat = R.design_summary(R.FLAT, sel)
    fc = [design_at(i, FLAT_CKPT) for i in sel]
    fc_same = [(r, i) for r, i in zip(fc, sel) if R.full_regime(i) != "inconclusive"]
    out = [f"{len(sel)} scored grids that learned something ({len({R.grids()[i]['setting'] for i in sel})} pilot grids), "
           "leave one setting out. Saving: the pilot compute a rule saves, mean over the pilot grids. Stopped: ρ points "
           "stopped (of 4 per grid), grids where a point stopped, grids where the pilot grid's own best point at B was "
           "stopped, scored grids where the pilot point nearest the full-run best ρ was stopped. Then the range at F as "
           "in replay.py's designs table (regret in pooled full-run SEs, frozen reading), and against the flat grid: "
           "grids where the regret rose / fell.", "",
           "| rule | saving | points stopped; grids | pilot best stopped | full-run best stopped | coverage | regret: "
           "median; mean | worse / better than flat | same regime |", "|---|---|---|---|---|---|---|---|---|",
           f"| flat grid (no stopping), final prompts (replay.py's) | 0.00 | 0; 0 | 0 | 0 | {flat['covered']}/{flat['n']} | "
           f"{R._f(flat['regret'])}; {R._f(flat['mean_regret'])} | — | {flat['same']}/{flat['firm']} |",
           f"| {FLAT_CKPT} | 0.00 | 0; 0 | 0 | 0 | {sum(r['covered'] for r in fc)}/{len(fc)} | "
           f"{R._f(statistics.median(r['regret'] for r in fc))}; {R._f(statistics.fmean(r['regret'] for r in fc))} | "
           f"— | {sum(r['regime'] == R.full_regime(i) for r, i in fc_same)}/{len(fc_same)} |"]
    for rule, *_ in RULES:
        s = rule_summary(rule, sel)
        out.append(f"| {rule} | {s['saving']:.2f} | {s['points']}; {s['grids_stopping']}/{s['settings']} | "
                   f"{s['pilot_best_stopped']} | {s['full_best_stopped']}/{s['n']} | {s['covered']}/{s['n']} | "
                   f"{R._f(s['regret'])}; {R._f(s['mean_regret'])} | {s['worse']} / {s['better']} | "
                   f"{s['same']}/{s['firm']} |")
    return out


def accuracy_lines() -> list[str]:
    """How well each model predicts a pilot's end from its curve up to f: the error of the point
    predictions (mean over seeds) against the points' measured end on the checkpoint prompts."""
    out = ["| model | read at | median abs. error of a point's prediction | mean error (bias) | best point at B "
           "predicted best |", "|---|---|---|---|---|"]
    names = sorted({R.grids()[i]["setting"] for i in R.scored_learned()})
    for model in MODELS:
        for frac in FRACS:
            errs, hits = [], 0
            for n in names:
                pred = predictions(n, model, frac)
                end = {}
                for p in R.raw_pilots(n):
                    c = [c for c in p["checkpoints"] if abs(c["fraction"] - 1) < 1e-9]
                    if c:
                        end.setdefault(p["rho_target"], []).append(statistics.fmean(c[0]["evals"]["reward"]))
                for t in pred:
                    if t in end:
                        errs.append(pred[t][0] - statistics.fmean(end[t]))
                hits += max(pred, key=lambda t: pred[t][0]) == max(end, key=lambda t: statistics.fmean(end[t]))
            out.append(f"| {model} | {frac:.2f} B | {statistics.median(abs(e) for e in errs):.3f} | "
                       f"{statistics.fmean(errs):+.3f} | {hits}/{len(names)} |")
    return out


SECTIONS = (("How well the curve up to f predicts the end (checkpoint prompts)", accuracy_lines),
            ("Early stopping replayed (leave one setting out)", replay_lines))


def tables() -> str:
    return V.section_tables(SECTIONS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("replay", "accuracy", "tables"):
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    if argv[0] == "tables":
        return V.doc_command(argv[1:], tables, BEGIN, END, "research/scripts/lc_stop.py")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print("\n".join(replay_lines() if argv[0] == "replay" else accuracy_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
