"""Replaying pilot designs on rounds 1–2's committed data (issues 48 and 49).

    python research/scripts/replay.py prior        # issue 48: the no-pilot prior against RACE, as scored (frozen)
    python research/scripts/replay.py compute      # issue 48: RACE's run after paying for its pilots (equal compute)
    python research/scripts/replay.py rules        # issue 48 item 5: the same figures under the scoring rules below
    python research/scripts/replay.py designs      # issue 49: pilot designs replayed, leave one setting out
    python research/scripts/replay.py passrate     # issue 49: does the base pass rate name the grids that learned nothing?
    python research/scripts/replay.py pairing      # issue 49: are seeds of different ρ correlated (paired)?
    python research/scripts/replay.py priorstart   # issue 49 item 7: variants of the prior-start rule
    python research/scripts/replay.py population   # race.stats.design's prior and its τ from both rounds
    python research/scripts/replay.py tables                          # every table of docs/pilot.md's replay section
    python research/scripts/replay.py tables --check docs/pilot.md    # exit 1 if the doc's tables differ
    python research/scripts/replay.py tables --write docs/pilot.md    # rewrite them

Everything is computed from the committed records of both validation rounds
(research/validation/runs/, research/validation/round2/runs/) with the project's own scoring code
(research/scripts/validation.py, validation_round2.py, drift.py, race.stats.drift, race.stats.regime), read
only. Deterministic (fixed bootstrap seeds); about a minute on two cores.

**Grids scored.** Every (setting, full-run budget) of both rounds with a pilot grid and a full-run
grid committed: 10 × B (24 settings that ran one), 30 × B (default, steps-sparse, lr-x2,
steps-lr-x3) and 100 × B (steps-n16). A grid whose full runs are *unstable* (at least half fell
back on their own checkpoints: lr-x3, lr-x3-cosine, lr-x2) has no best ρ and is not scored, as in
the frozen tables.

**RACE's recommendation at F** ("RACE" below): round 2 as frozen (validation_round2.score_row:
race.stats.drift's range at F with the frozen population −0.055 / 0.052); round 1 by the drift model's
leave-one-setting-out backtest (research/scripts/drift.py, candidate "shrunk to the population":
the population drift from the other round-1 settings). These are the figures docs/validation.md
and docs/drift.md hold.

**The no-pilot prior** for a setting: the median, over the *other* settings of both rounds whose
10 × B grid is scored, of the full-run best ρ, measured (C_learning / C_total as spent, mean over
the best point's runs). It costs no pilot compute.

**Scoring rules of issue 48 item 5, written down here before their scores were printed (2026-12-05):**

(a) *A grid that learned nothing is reported apart.* A full-run grid learned nothing when
    race.stats.instability.learned on its full runs says so: no ρ point's mean gain in held-out reward
    over the base policy (final checkpoint against step 0, on the checkpoint prompts, paired by
    seed) exceeds both 2 of its seed SEs and 0.01 — the replacement rule of round 2, applied to
    the full runs. Such a grid is listed on its own line and kept out of every median and count.
(b) *One prompt set per comparison.* Under these rules every comparison reads both sides on the
    **checkpoint prompts** (the first 100 of the 500 held-out prompts, the only set evaluated
    before a run's end): the full-budget response is the end checkpoint (fraction 1), a budget
    fraction f is read on the same 100 prompts, and the pooled SE is that of the same reading.
    The frozen figures (500 prompts at the end) are shown beside them, never replaced.
(c) *ρ is always measured*: every recommended ρ (pilot ranges, the prior) and every full-run
    response lives on the measured-ρ axis (validation.measured_rho), read by linear interpolation
    (validation.interpolate), flat past the grid's ends.
(d) *With and without collapsed runs.* A run collapses when race.stats.instability.find_instability
    flags it on its own held-out checkpoints (validation.collapses). Regret and gain are given on
    all runs and again with the collapsed runs left out of the full-run grid (its means, best
    point and pooled SE recomputed).

**Equal total compute.** A pilot grid costs c = its FLOPs / one full run's FLOPs (1.2 at 10 × B,
0.4 at 30 × B, 0.12 at 100 × B). RACE's run after paying for its pilots is the full run stopped at
1/(1 + c) of its budget: each constant-rate full run's own held-out checkpoints, interpolated
linearly in log FLOPs between the two checkpoints around that fraction (a constant-rate run
stopped at f · C is the run planned at f · C, docs/drift.md). Grids with a decaying rate
(default-cosine, wsd) have no such reading and are left out.

**Designs (issue 49).** Each design chooses which pilot runs (ρ, seed) run and how far (a budget
fraction of B, read from their checkpoints: a "continued" design is the same pilot read further
along its curve, which is what resuming its checkpoint gives). Its evidence is mapped to a range
at F by the project's rule where it applies: race.stats.regime.classify on the pilots as read, then
race.stats.drift.range_record (own drift shrunk to the population drift of the *other* settings of both
rounds, leave one setting out). Scored against each grid's full runs on the frozen reading (500
prompts, all runs): the full-run best ρ in the range (coverage), the range's width, the regret at
its recommended ρ in pooled full-run SEs, the same regime.
"""
from __future__ import annotations

import argparse
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

import validation as V  # noqa: E402
from replay_data import (EARLY, FULL_KINDS, LATE, MID, N_BOOT, SUITES, Z90, Response, _beats,  # noqa: E402,F401
                         _ckpt, _f, _interp_fraction, _load, _med, _seed_var_of_best, all_settings, cells,
                         collapsed, constant_rate, label, load, loso_population, raw_pilots, round1_backtest,
                         suites, truncated)
from replay_pilots import (DESIGN, DESIGNS, FLAT, PER_GRID, evidence, p_star, pairing_lines,  # noqa: E402,F401
                           pairing_row, passrate_lines, passrate_rows)

BEGIN, END = "<!-- replay:tables:begin -->", "<!-- replay:tables:end -->"


# ---------------------------------------------------------------- the grids scored, RACE and the prior

@lru_cache(maxsize=1)
def grids() -> tuple[dict, ...]:
    """Every (setting, full-run budget) of both rounds with both grids committed."""
    out = []
    for s in all_settings():
        pilot = load(s["name"], "pilot")
        if pilot is None:
            continue
        for kind in FULL_KINDS:
            if not V.planned(s, kind):
                continue
            full = load(s["name"], kind)
            if full is None:
                continue
            B = float(s["pilot_budget"])
            out.append({"setting": s["name"], "round": s["round"], "kind": kind, "factor": V.KINDS[kind], "B": B,
                        "F": B * V.KINDS[kind], "s": s, "pilot": pilot, "full": full, "on_policy": s.get("on_policy"),
                        "constant": constant_rate(s),
                        "scored": V.grid_class(V.diagnosis(full)) != "unstable"})
    return tuple(out)


@lru_cache(maxsize=None)
def response(idx: int, prompts: str = "final", frac: float = 1.0, drop_collapsed: bool = False) -> Response:
    return Response(grids()[idx]["full"], prompts=prompts, frac=frac, drop_collapsed=drop_collapsed)


@lru_cache(maxsize=None)
def race_at_f(idx: int) -> tuple[tuple[float, float], float]:
    """RACE's (range at F, recommended ρ) for grid ``idx``: round 1 by the backtest, round 2 as frozen."""
    g = grids()[idx]
    if g["round"] == 1:
        return round1_backtest()[(g["setting"], float(g["factor"]))]
    import validation_round2 as V2

    _, r2 = suites()
    row = V2.score_row(r2, g["s"], g["kind"], g["pilot"], g["full"])
    return tuple(row["range_f"]), row["rec_f"]


def best_measured(idx: int) -> float:
    return response(idx).best_rho


def pool_10x(exclude: str | None = None, *, skip: frozenset = frozenset()) -> list[float]:
    """The full-run best ρ (measured) of every scored 10 × B grid but ``exclude``'s (and ``skip``'s)."""
    return [best_measured(i) for i, g in enumerate(grids())
            if g["kind"] == "full10" and g["scored"] and g["setting"] != exclude and g["setting"] not in skip]


def prior_rho(setting: str, *, skip: frozenset = frozenset()) -> float:
    """The no-pilot prior: the median full-run best ρ of the other settings' scored 10 × B grids."""
    return statistics.median(pool_10x(setting, skip=skip))


# ---------------------------------------------------------------- issue 48: the prior against RACE (frozen reading)

def prior_rows() -> list[dict[str, Any]]:
    """Per scored grid: the full-run best ρ, RACE's and the prior's recommended ρ, their regrets in
    pooled SEs and gains over on-policy with validation.regret_gain_ci's CI (the frozen reading:
    500 prompts, all runs)."""
    out = []
    for i, g in enumerate(grids()):
        if not g["scored"]:
            continue
        rr = response(i)
        (lo, hi), rec = race_at_f(i)
        pr = prior_rho(g["setting"])
        row = {"i": i, "label": label(g), "round": g["round"], "factor": g["factor"], "best": rr.best_rho,
               "race": rec, "prior": pr, "race_regret": rr.regret(rec), "prior_regret": rr.regret(pr)}
        for who, rho in (("race", rec), ("prior", pr)):
            _, ci = V.regret_gain_ci(g["full"], rho, g["on_policy"])
            on = g["on_policy"]
            gain = rr.at(rho) - statistics.fmean(rr.means[on]) if on in rr.means else float("nan")
            row[f"{who}_gain"], row[f"{who}_gain_ci"] = gain, ci
        out.append(row)
    return out


def prior_lines() -> list[str]:
    rows = prior_rows()
    out = ["| grid | round | full-run best ρ | RACE at F: ρ (regret) | prior: ρ (regret) | gain over on-policy: RACE; prior (95 % CI) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        gains = "; ".join(f"{_f(r[w + '_gain'], 3, True)} ({_f(r[w + '_gain_ci'][0], 3, True)} … {_f(r[w + '_gain_ci'][1], 3, True)})"
                          for w in ("race", "prior"))
        out.append(f"| {r['label']} | {r['round']} | {r['best']:.2f} | {r['race']:.2f} ({_f(r['race_regret'])}) | "
                   f"{r['prior']:.2f} ({_f(r['prior_regret'])}) | {gains if r['race_gain'] == r['race_gain'] else '—'} |")
    out += ["", "| grids | n | median regret, prior | median regret, RACE | prior better / worse | beats on-policy where the gain's CI excludes 0: prior; RACE |",
            "|---|---|---|---|---|---|"]
    sets = [("all scored", rows), ("10 × B, round 1", [r for r in rows if r["factor"] == 10 and r["round"] == 1]),
            ("10 × B, round 2", [r for r in rows if r["factor"] == 10 and r["round"] == 2]),
            ("30 × and 100 × B", [r for r in rows if r["factor"] > 10])]
    for name, sel in sets:
        bp, np_ = _beats(sel, "prior")
        br, nr = _beats(sel, "race")
        out.append(f"| {name} | {len(sel)} | {_f(_med([r['prior_regret'] for r in sel]))} | "
                   f"{_f(_med([r['race_regret'] for r in sel]))} | "
                   f"{sum(r['prior_regret'] < r['race_regret'] - 1e-9 for r in sel)} / "
                   f"{sum(r['prior_regret'] > r['race_regret'] + 1e-9 for r in sel)} | {bp} of {np_}; {br} of {nr} |")
    return out


# ---------------------------------------------------------------- issue 48: equal total compute

def pilot_cost(i: int) -> float:
    """c: the pilot grid's FLOPs over one full run's (validation.setting_row's cost_one)."""
    g = grids()[i]
    return sum(p.flops.total for p in V.pilots_of(g["pilot"])) / max(p.flops.total for p in V.pilots_of(g["full"]))


def compute_rows(*, drop_collapsed: bool = False, skip_unlearned: bool = False) -> list[dict[str, Any]]:
    """Per scored constant-rate grid: RACE's run after paying for its pilots (its ρ read at
    1/(1 + c) of the budget) and at full budget, against the prior's run at full budget. Readings:
    "ckpt" (both sides on the 100 checkpoint prompts, their pooled SE: issue 48's equal-compute
    figures) and "final" (the 500 prompts, the frozen reading: only at full budget)."""
    out = []
    for i, g in enumerate(grids()):
        if not g["scored"] or not g["constant"] or (skip_unlearned and not learned_full(i)):
            continue
        c = pilot_cost(i)
        frac = 1 / (1 + c)
        (_, _), rec = race_at_f(i)
        pr = prior_rules(g["setting"], drop_collapsed) if skip_unlearned else prior_rho(g["setting"])
        end = response(i, "ckpt", 1.0, drop_collapsed)
        early = response(i, "ckpt", frac, drop_collapsed)
        fin = response(i, "final", 1.0, drop_collapsed)
        out.append({"i": i, "label": label(g), "factor": g["factor"], "c": c, "frac": frac,
                    "equal": V._in_se(early.at(rec) - end.at(pr), end.pse),
                    "full_ckpt": end.diff_pse(rec, pr), "full_final": fin.diff_pse(rec, pr)})
    return out


def compute_lines() -> list[str]:
    rows = compute_rows()
    out = ["RACE's run minus the prior's run, in pooled SEs of the reading (negative: RACE below). "
           "*Equal compute*: RACE's ρ read at 1/(1 + c) of the budget, the prior's at the end, both on the "
           "100 checkpoint prompts. *Full budget*: both at the end, on the checkpoint prompts and on the 500 "
           "final prompts.", "",
           "| grid | c (pilots / one full run) | read at | equal compute (ckpt) | full budget (ckpt) | full budget (final) |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['label']} | {r['c']:.3f} | {r['frac']:.3f} | {_f(r['equal'], 2, True)} | "
                   f"{_f(r['full_ckpt'], 2, True)} | {_f(r['full_final'], 2, True)} |")
    out += ["", "| budget | grids | equal compute: RACE below (by > 2 SEs), median | full budget (ckpt): below, median "
                "| full budget (final): below, median |", "|---|---|---|---|---|"]
    for fac in (10, 30, 100):
        sel = [r for r in rows if r["factor"] == fac]
        if not sel:
            continue
        out.append(f"| {fac} × B | {len(sel)} | {sum(r['equal'] < 0 for r in sel)} ({sum(r['equal'] < -2 for r in sel)}), "
                   f"{_f(_med([r['equal'] for r in sel]), 2, True)} | {sum(r['full_ckpt'] < 0 for r in sel)}, "
                   f"{_f(_med([r['full_ckpt'] for r in sel]), 2, True)} | {sum(r['full_final'] < 0 for r in sel)}, "
                   f"{_f(_med([r['full_final'] for r in sel]), 2, True)} |")
    return out


# ---------------------------------------------------------------- issue 48 item 5: the scoring rules

@lru_cache(maxsize=None)
def learned_full(i: int) -> bool:
    """Rule (a): whether grid ``i``'s full runs learned anything (race.stats.instability.learned)."""
    from race.stats.instability import learned

    got = learned(V.pilots_of(grids()[i]["full"]), "reward")
    return bool(got and got[0])


def prior_rules(setting: str, drop_collapsed: bool = False) -> float:
    """The prior under rules (a)–(d): the median best ρ (measured, on the checkpoint prompts, with or
    without collapsed runs) of the other settings' scored 10 × B grids that learned something."""
    return statistics.median(response(i, "ckpt", 1.0, drop_collapsed).best_rho for i, g in enumerate(grids())
                             if g["kind"] == "full10" and g["scored"] and learned_full(i) and g["setting"] != setting)


def rules_rows(drop_collapsed: bool) -> list[dict[str, Any]]:
    """Per scored grid, read on the checkpoint prompts (rule b), with or without collapsed runs (rule d):
    RACE's and the prior's regret and gain over on-policy (bootstrap over seeds and prompts)."""
    out = []
    for i, g in enumerate(grids()):
        if not g["scored"]:
            continue
        rr = response(i, "ckpt", 1.0, drop_collapsed)
        (_, _), rec = race_at_f(i)
        pr = prior_rules(g["setting"], drop_collapsed)
        row = {"i": i, "label": label(g), "round": g["round"], "factor": g["factor"], "learned": learned_full(i),
               "best": rr.best_rho, "race": rec, "prior": pr, "race_regret": rr.regret(rec),
               "prior_regret": rr.regret(pr), "runs": sum(len(v) for v in rr.means.values())}
        for who, rho in (("race", rec), ("prior", pr)):
            gain, lo, hi = rr.gain_ci(rho, g["on_policy"])
            row[f"{who}_gain"], row[f"{who}_gain_ci"] = gain, (lo, hi)
        out.append(row)
    return out


def rules_lines() -> list[str]:
    both = {False: rules_rows(False), True: rules_rows(True)}
    apart = [r for r in both[False] if not r["learned"]]
    out = ["Grids that learned nothing by rule (a), reported apart and kept out of every figure below: "
           + ("; ".join(f"{r['label']} (full-run best ρ {r['best']:.2f}, regret RACE {_f(r['race_regret'])}, prior "
                        f"{_f(r['prior_regret'])} pooled SEs of a seed SD near 0)" for r in apart) or "none") + ".", "",
           "| grid | runs (without collapsed) | best ρ, all runs; without collapsed | regret RACE: all; without | regret prior: all; without |",
           "|---|---|---|---|---|"]
    for a, b in zip(both[False], both[True]):
        if not a["learned"]:
            continue
        out.append(f"| {a['label']} | {a['runs']} ({b['runs']}) | {a['best']:.2f}; {b['best']:.2f} | "
                   f"{_f(a['race_regret'])}; {_f(b['race_regret'])} | {_f(a['prior_regret'])}; {_f(b['prior_regret'])} |")
    out += ["", "| grids (learned; checkpoint prompts) | runs | n | median regret, prior | median regret, RACE "
                "| beats on-policy where the CI excludes 0: prior; RACE |", "|---|---|---|---|---|---|"]
    for drop, rows in both.items():
        rows = [r for r in rows if r["learned"]]
        for name, sel in (("all", rows), ("10 × B", [r for r in rows if r["factor"] == 10]),
                          ("10 × B, round 2", [r for r in rows if r["factor"] == 10 and r["round"] == 2]),
                          ("30 × and 100 × B", [r for r in rows if r["factor"] > 10])):
            bp, np_ = _beats(sel, "prior")
            br, nr = _beats(sel, "race")
            out.append(f"| {name} | {'without collapsed' if drop else 'all'} | {len(sel)} | "
                       f"{_f(_med([r['prior_regret'] for r in sel]))} | {_f(_med([r['race_regret'] for r in sel]))} | "
                       f"{bp} of {np_}; {br} of {nr} |")
    out += ["", "Equal compute under the rules (both sides on the checkpoint prompts; the prior from the learned grids):", "",
            "| budget | runs | grids | equal compute: RACE below (by > 2 SEs), median | full budget: below, median |",
            "|---|---|---|---|---|"]
    for drop in (False, True):
        rows = compute_rows(drop_collapsed=drop, skip_unlearned=True)
        for fac in (10, 30, 100):
            sel = [r for r in rows if r["factor"] == fac]
            if sel:
                out.append(f"| {fac} × B | {'without collapsed' if drop else 'all'} | {len(sel)} | "
                           f"{sum(r['equal'] < 0 for r in sel)} ({sum(r['equal'] < -2 for r in sel)}), "
                           f"{_f(_med([r['equal'] for r in sel]), 2, True)} | {sum(r['full_ckpt'] < 0 for r in sel)}, "
                           f"{_f(_med([r['full_ckpt'] for r in sel]), 2, True)} |")
    return out


# ---------------------------------------------------------------- issue 49: pilot designs

def unlearned_settings() -> frozenset:
    return frozenset(g["setting"] for i, g in enumerate(grids()) if g["kind"] == "full10" and g["scored"]
                     and not learned_full(i))


@lru_cache(maxsize=None)
def best_sampling_var(i: int) -> float:
    """The bootstrap variance (seeds and prompts, validation.boot_means) of a full-run grid's best ρ, measured."""
    import numpy as np

    g = grids()[i]
    rhos, reps = V.boot_means(g["full"])
    meas = V.measured_rho(g["full"])
    picks = np.array([meas[rhos[j]] for j in np.argmax(reps, axis=1)])
    return float(picks.var())


@lru_cache(maxsize=None)
def prior_model(name: str) -> tuple[float, float, float]:
    """(prior ρ, observed SD of the others' best ρ, between-setting SD τ net of their sampling noise)
    from the other settings' scored 10 × B grids that learned something (rule a)."""
    skip = unlearned_settings()
    idx = [i for i, g in enumerate(grids()) if g["kind"] == "full10" and g["scored"] and g["setting"] != name
           and g["setting"] not in skip]
    xs = [response(i).best_rho for i in idx]
    sd = statistics.stdev(xs)
    tau2 = max(sd ** 2 - statistics.fmean(best_sampling_var(i) for i in idx), 0.05 ** 2)
    return statistics.median(xs), sd, math.sqrt(tau2)


def population_tau() -> tuple[int, float, float, float]:
    """race.stats.design's POPULATION_RHO_TAU: over the 21 grids of POPULATION_RHO (every 10 × B grid but
    `hard`, learned nothing, and `lr-x3`, `lr-x3-cosine`, every run collapsed), the observed SD of the
    full-run best ρ and that SD net of the grids' mean sampling variance of their best ρ (best_sampling_var)."""
    idx = [i for i, g in enumerate(grids()) if g["kind"] == "full10" and g["setting"] not in
           ("hard", "lr-x3", "lr-x3-cosine")]
    xs = [response(i).best_rho for i in idx]
    sd = statistics.stdev(xs)
    noise = statistics.fmean(best_sampling_var(i) for i in idx)
    return len(idx), statistics.median(xs), sd, math.sqrt(sd ** 2 - noise)


@lru_cache(maxsize=None)
def design_at(i: int, design: str) -> dict[str, Any]:
    """A design's range at F and recommended ρ for grid ``i`` (leave one setting out), scored on the
    frozen reading of its full runs (500 prompts, all runs)."""
    from race.stats.design import prior_start
    from race.stats.drift import DriftError, range_for_pilots

    g = grids()[i]
    spec = DESIGN[design]
    name = g["setting"]
    ev = evidence(name, design)
    pop = loso_population(name)
    out: dict[str, Any] = {"cost": ev["cost"], "regime": ev.get("regime")}
    if spec["kind"] == "prior":                # race.stats.design.prior_start with no pilots: the prior alone
        prior, sd, tau = prior_model(name)
        s = prior_start([], None, prior=prior, prior_sd=tau, spread=sd)
        (lo, hi), rho = (s.low, s.high), s.rho
    elif spec["kind"] in ("grid", "halving"):
        try:
            r = range_for_pilots(ev.get("drift_pilots", ev["pilots"]), target="reward", pilot_budget=ev["budget"],
                                 full_run_budget=g["F"], rho_range=ev["rho_range"], recommended_rho=ev["recommended"],
                                 constant_rate=g["constant"], population=pop)
            (lo, hi), rho = r.rho_range, r.recommended_rho
            out["at_f"] = r.to_dict()
        except DriftError:                  # past the extrapolation limit: the range at B, no range at F
            (lo, hi), rho = ev["rho_range"], ev["recommended"]
            out["at_f"] = None
    else:                                   # the prior as the start: race.stats.design.prior_start, a verdict's rule
        base = design_at(i, spec["base"])
        s = prior_start_of(i, spec["base"])
        (lo, hi), rho = (s.low, s.high), s.rho
        out.update(cost=base["cost"], regime=base["regime"], w=s.weight)
    rr = response(i)
    out.update(range=(lo, hi), rho=rho, width=hi - lo, covered=V._within(rr.best_rho, lo, hi), regret=rr.regret(rho))
    return out


def prior_start_of(i: int, base: str, **kw: Any):
    """race.stats.design.prior_start on design ``base``'s pilots and range at F for grid ``i``, the prior and τ
    of the other settings (leave one setting out): the rule a verdict at F states beside its range."""
    from race.stats.design import prior_start

    prior, sd, tau = prior_model(grids()[i]["setting"])
    return prior_start(evidence(grids()[i]["setting"], base)["pilots"], design_at(i, base)["at_f"], target="reward",
                       prior=prior, prior_sd=tau, n_boot=N_BOOT, seed=0, **kw)


def full_regime(i: int) -> str:
    return V.diagnosis(grids()[i]["full"]).primary.regime.value


def design_summary(design: str, sel: Sequence[int]) -> dict[str, Any]:
    rows = [design_at(i, design) for i in sel]
    flat = [design_at(i, FLAT) for i in sel]
    firm = [(r, i) for r, i in zip(rows, sel) if full_regime(i) != "inconclusive" and r["regime"] is not None]
    ten = [(r, i) for r, i in zip(rows, sel) if grids()[i]["factor"] == 10]
    return {"n": len(rows), "covered": sum(r["covered"] for r in rows), "width": _med([r["width"] for r in rows]),
            "regret": _med([r["regret"] for r in rows]), "mean_regret": statistics.fmean(r["regret"] for r in rows),
            "same": sum(r["regime"] == full_regime(i) for r, i in firm), "firm": len(firm),
            "of_flat": _med([r["cost"] / f["cost"] for r, f in zip(rows, flat)]),
            "of_F": _med([r["cost"] * grids()[i]["B"] / grids()[i]["F"] for r, i in ten])}


def scored_learned() -> list[int]:
    return [i for i, g in enumerate(grids()) if g["scored"] and learned_full(i)]


def designs_lines() -> list[str]:
    sel = scored_learned()
    apart = [label(g) for i, g in enumerate(grids()) if g["scored"] and not learned_full(i)]
    out = [f"{len(sel)} scored grids that learned something (rule a; apart: {', '.join(apart) or 'none'}), leave one "
           "setting out. Compute: the design's pilot FLOPs, median over the grids, as a share of the flat grid's and "
           "of one full run at 10 × B. Coverage: the full-run best ρ inside the design's range at F; width: median "
           "width of that range in ρ; regret at its recommended ρ in pooled full-run SEs (frozen reading: 500 "
           "prompts, all runs); same regime where the full runs are conclusive (designs that give a regime).", "",
           "| design | compute: of the flat grid; of F (10 × B) | coverage | width (median) | regret: median; mean "
           "| same regime |", "|---|---|---|---|---|---|"]
    for name, _ in DESIGNS:
        s = design_summary(name, sel)
        same = f"{s['same']}/{s['firm']}" if s["firm"] else "—"
        out.append(f"| {name} | {s['of_flat']:.2f}; {s['of_F']:.2f} | {s['covered']}/{s['n']} | {s['width']:.2f} | "
                   f"{_f(s['regret'])}; {_f(s['mean_regret'])} | {same} |")
    out += ["", "Per grid (regret in pooled SEs; ✗ the full-run best ρ outside the range):", "",
            "| grid | best ρ | " + " | ".join(n for n in PER_GRID) + " |", "|---|---|" + "---|" * len(PER_GRID)]
    for i in sel:
        row = []
        for n in PER_GRID:
            d = design_at(i, n)
            row.append(f"{d['rho']:.2f} ({_f(d['regret'])})" + ("" if d["covered"] else " ✗"))
        out.append(f"| {label(grids()[i])} | {response(i).best_rho:.2f} | " + " | ".join(row) + " |")
    return out


def target_lines() -> list[str]:
    """Issue 49's targets against the replay."""
    sel = scored_learned()
    summ = {n: design_summary(n, sel) for n, _ in DESIGNS}
    flat = summ[FLAT]
    cheap = [(n, s) for n, s in summ.items() if 0 < s["of_flat"] <= 1 / 3 + 1e-9]
    best_cheap = max(cheap, key=lambda x: (x[1]["covered"], -x[1]["regret"]))
    hit = [n for n, s in cheap if s["covered"] >= flat["covered"]]
    low = [f"{n} ({_f(s['regret'])})" for n, s in summ.items() if s["regret"] <= 0.5]
    prior = summ[DESIGNS[0][0]]
    reasoners = [i for i in sel if grids()[i]["setting"] in ("reasoner", "reasoner-math")]
    out = ["| target | measured | |", "|---|---|---|",
           f"| the flat grid's coverage ({flat['covered']}/{flat['n']}) at ≤ 1/3 of its compute | "
           + (", ".join(hit) if hit else f"best at ≤ 1/3: {best_cheap[0]}, {best_cheap[1]['covered']}/{best_cheap[1]['n']} "
              f"at {best_cheap[1]['of_flat']:.2f} of the flat grid") + f" | {'met' if hit else 'missed'} |",
           f"| median regret ≤ 0.5 pooled SEs | {'; '.join(low) or 'none'} (flat grid {_f(flat['regret'])}, prior "
           f"{_f(prior['regret'])}) | {'met' if low else 'missed'} |"]
    for n, spec in DESIGNS:
        if spec["kind"] != "shrink":
            continue
        s = summ[n]
        per = [(label(grids()[i]), design_at(i, n)["regret"], design_at(i, DESIGNS[0][0])["regret"]) for i in reasoners]
        both = all(a < b for _, a, b in per)
        out.append(f"| {n}: median regret no worse than the prior's, better on both reasoners | "
                   f"{_f(s['regret'])} against {_f(prior['regret'])}; "
                   + "; ".join(f"{lab} {_f(a)} against {_f(b)}" for lab, a, b in per)
                   + f" | {'met' if s['regret'] <= prior['regret'] and both else 'missed'} |")
    return out


def slope_rows() -> list[dict[str, Any]]:
    """Per 10 × B grid: what the last stretch of compute buys at the full-run best point, in pooled SEs
    per doubling of compute (the checkpoint prompts at 0.55 F and at F: (R(F) − R(0.55 F)) / pooled SE /
    log2(1 / 0.55)). It prices the pilots in the units of their value: a share s of the compute spent on
    pilots costs the run about this × log2(1 / (1 − s)) pooled SEs (race.stats.design.pilot_value)."""
    out = []
    for i, g in enumerate(grids()):
        if g["kind"] != "full10":
            continue
        end, mid = response(i, "ckpt", 1.0), response(i, "ckpt", 0.55)
        if not end.pse > 0 or end.best_t not in mid.means:
            continue
        t = end.best_t
        per = (statistics.fmean(end.means[t]) - statistics.fmean(mid.means[t])) / end.pse / math.log2(1 / 0.55)
        out.append({"grid": label(g), "best": end.best_rho, "per_doubling": per})
    return out


def slope_lines() -> list[str]:
    rows = slope_rows()
    out = ["| grid | full-run best ρ | pooled SEs per doubling of compute near F |", "|---|---|---|"]
    out += [f"| {r['grid']} | {r['best']:.2f} | {r['per_doubling']:+.2f} |" for r in rows]
    med = statistics.median(r["per_doubling"] for r in rows)
    out += ["", f"Median over {len(rows)} grids: {med:.2f} pooled SEs per doubling (race.stats.design.SE_PER_DOUBLING). "
                f"A 10 % share spent on pilots costs the run about {med * math.log2(1 / 0.9):.2f} pooled SEs; the "
                f"prior alone's median regret above is what the pilots can win back."]
    return out


def prior_start_lines() -> list[str]:
    """Variants of the prior-start rule (research/scripts/prior_start.py), this module passed in."""
    import prior_start as PS

    return PS.lines(sys.modules[__name__])


def population_lines() -> list[str]:
    n, med, sd, tau = population_tau()
    return [f"{n} grids: median best ρ {med:.2f} (POPULATION_RHO), observed SD {sd:.3f} (POPULATION_RHO_SD), net of "
            f"their sampling noise τ = {tau:.3f} (POPULATION_RHO_TAU)"]


SECTIONS = (("The no-pilot prior against RACE (frozen reading: 500 prompts, all runs)", prior_lines),
            ("Equal total compute: RACE's run after paying for its pilots", compute_lines),
            ("Issue 48 item 5: the scoring rules, beside the frozen figures", rules_lines),
            ("Pilot designs replayed (leave one setting out)", designs_lines),
            ("Issue 49's targets", target_lines),
            ("The prior start: variants of the rule", prior_start_lines),
            ("The base pass rate and the grids that learned nothing", passrate_lines),
            ("Pairing: are the seeds of different ρ correlated?", pairing_lines),
            ("What the last stretch of compute buys: the price of a pilot share", slope_lines))


def tables() -> str:
    return V.section_tables(SECTIONS)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tables"]:
        return V.doc_command(argv[1:], tables, BEGIN, END, "research/scripts/replay.py")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["prior", "compute", "rules", "designs", "targets", "priorstart", "population",
                                    "passrate", "pairing", "slope", "tables"])
    args = ap.parse_args(argv)
    fn = {"prior": prior_lines, "compute": compute_lines, "rules": rules_lines, "designs": designs_lines,
          "targets": target_lines, "priorstart": prior_start_lines, "population": population_lines,
          "passrate": passrate_lines, "pairing": pairing_lines, "slope": slope_lines}[args.cmd]
    print("\n".join(fn()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
