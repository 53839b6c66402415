"""What a pilot grid shows on its own, for research/scripts/replay.py (issue 49): the pilot designs
replayed (``DESIGNS``) and each design's evidence at B, the base pass rate against race.stats.design's
bar, and the pairing of seeds across ρ. Moved out of replay.py unchanged (issue 52); replay.py
re-exports every name."""
from __future__ import annotations

import math
import statistics
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "research" / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import validation as V  # noqa: E402
from replay_data import (EARLY, FULL_KINDS, LATE, MID, N_BOOT, _med, all_settings, collapsed,  # noqa: E402
                         load, raw_pilots, truncated)


DESIGNS: list[tuple[str, dict]] = [
    ("prior alone (no pilots)", {"kind": "prior"}),
    ("flat grid: 4 ρ × 3 seeds at B", {"kind": "grid", "frac": 1.0, "seeds": 3, "drop_top": False}),
    ("flat grid read at 0.55 B", {"kind": "grid", "frac": LATE, "seeds": 3, "drop_top": False}),
    ("flat grid read at 0.30 B", {"kind": "grid", "frac": MID, "seeds": 3, "drop_top": False}),
    ("2 seeds × 4 ρ at B", {"kind": "grid", "frac": 1.0, "seeds": 2, "drop_top": False}),
    ("3 seeds × 3 ρ (top ρ dropped) at B", {"kind": "grid", "frac": 1.0, "seeds": 3, "drop_top": True}),
    ("2 seeds × 3 ρ (top ρ dropped) at B", {"kind": "grid", "frac": 1.0, "seeds": 2, "drop_top": True}),
    ("2 seeds × 4 ρ read at 0.30 B", {"kind": "grid", "frac": MID, "seeds": 2, "drop_top": False}),
    ("halving: all at 0.09 B, CI overlap → B", {"kind": "halving", "frac": EARLY, "keep": "ci"}),
    ("halving: all at 0.09 B, top half → B", {"kind": "halving", "frac": EARLY, "keep": 2}),
    ("halving: all at 0.09 B, top 1 → B", {"kind": "halving", "frac": EARLY, "keep": 1}),
    ("halving: all at 0.30 B, CI overlap → B", {"kind": "halving", "frac": MID, "keep": "ci"}),
    ("halving: all at 0.30 B, top half → B", {"kind": "halving", "frac": MID, "keep": 2}),
    ("prior start + flat grid", {"kind": "shrink", "base": "flat grid: 4 ρ × 3 seeds at B"}),
    ("prior start + flat grid read at 0.30 B", {"kind": "shrink", "base": "flat grid read at 0.30 B"}),
    ("prior start + 2 seeds × 4 ρ read at 0.30 B", {"kind": "shrink", "base": "2 seeds × 4 ρ read at 0.30 B"}),
]
DESIGN = dict(DESIGNS)
FLAT = DESIGNS[1][0]


@lru_cache(maxsize=None)
def evidence(name: str, design: str) -> dict[str, Any]:
    """What a design's pilots show at B (independent of F): the pilots as read, their diagnosis,
    their FLOPs in units of B, and for successive halving the survivors and their range at B."""
    from race.stats.regime import classify

    spec = DESIGN[design]
    s = next(x for x in all_settings() if x["name"] == name)
    B = float(s["pilot_budget"])
    raw = raw_pilots(name)
    targets = sorted({p["rho_target"] for p in raw})
    if spec["kind"] == "prior":
        return {"cost": 0.0, "pilots": []}
    if spec["kind"] == "shrink":
        return evidence(name, spec["base"])
    if spec["kind"] == "grid":
        keep = targets[:-1] if spec["drop_top"] else targets
        sel = [p for p in raw if p["rho_target"] in keep and p["seed"] < spec["seeds"]]
        pilots = [truncated(p, spec["frac"]) for p in sel]
        if spec.get("transform"):           # a read of the same pilots (research/scripts/eval_share.py)
            pilots = [spec["transform"](p) for p in pilots]
        diag = classify(pilots, targets=["reward"], primary_target="reward", n_boot=N_BOOT, seed=0,
                        rerun_confidence=False)
        return {"cost": sum(p.flops.total for p in pilots) / B, "pilots": pilots, "diag": diag,
                "budget": B * spec["frac"], "rho_range": tuple(diag.primary.rho_range),
                "recommended": diag.primary.recommended_rho, "regime": diag.primary.regime.value}
    if spec["kind"] == "halving":
        f = spec["frac"]
        early = {(p["rho_target"], p["seed"]): truncated(p, f) for p in raw}
        means = {t: statistics.fmean(statistics.fmean(early[k].evals["reward"]) for k in early if k[0] == t)
                 for t in targets}
        order = sorted(targets, key=lambda t: -means[t])
        if spec["keep"] == "ci":
            # a point survives when its mean is within 2 SEs of a difference (seed SD pooled over the
            # points, 3 seeds a point) of the best point's: its CI still overlaps the best
            per = {t: [statistics.fmean(early[k].evals["reward"]) for k in early if k[0] == t] for t in targets}
            sd = math.sqrt(statistics.fmean(statistics.variance(v) for v in per.values()))
            n = min(len(v) for v in per.values())
            keep = [t for t in order if means[order[0]] - means[t] <= 2 * sd * math.sqrt(2 / n)]
        else:
            keep = order[:spec["keep"]]
        full = [truncated(p, 1.0) for p in raw if p["rho_target"] in keep]
        dropped = [truncated(p, f, rescale=False) for p in raw if p["rho_target"] not in keep]
        cost = (sum(p.flops.total for p in full) + sum(early[k].flops.total for k in early if k[0] not in keep)) / B
        fm = {t: statistics.fmean(statistics.fmean(p.evals["reward"]) for p in full if p.rho_target == t) for t in keep}
        meas = {t: statistics.fmean(p.flops.rho for p in full if p.rho_target == t) for t in keep}
        best = max(keep, key=lambda t: fm[t])
        return {"cost": cost, "pilots": full, "drift_pilots": full + dropped, "budget": B, "keep": keep,
                "rho_range": (min(meas.values()), max(meas.values())), "recommended": meas[best], "regime": None}
    raise ValueError(spec["kind"])


PER_GRID = ("prior alone (no pilots)", FLAT, "flat grid read at 0.30 B", "halving: all at 0.09 B, top 1 → B",
            "prior start + flat grid", "prior start + flat grid read at 0.30 B")


# ---------------------------------------------------------------- issue 49: the base pass rate

def p_star(g: int) -> float:
    """race.stats.design.p_star: the base pass rate below which fewer than half the groups of g rollouts hold
    two different 0/1 rewards, 1 − 2^(−1/g) (0.083 for g = 8; the check `race pilot` runs after calibration)."""
    from race.stats.design import p_star as rule

    return rule(g)


def passrate_rows() -> list[dict[str, Any]]:
    """Per setting with a pilot grid: the base policy's pass rate (pass@1 on the checkpoint prompts
    at step 0, mean over the pilots), the group sizes (rollouts per prompt) of its pilot grid, the
    rule's call (race.stats.design.signal) at the configured group n_train (the largest trained in the grid:
    what `race pilot` checks after calibration), and whether its pilot grid and its 10 × B full runs learned
    (race.stats.instability.learned)."""
    from race.stats.instability import learned
    from race.stats.design import signal

    out = []
    for s in all_settings():
        pilot = load(s["name"], "pilot")
        if pilot is None:
            continue
        ps = V.pilots_of(pilot)
        base = [c for p in ps for c in p.checkpoints if c.fraction == 0 and c.evals.get("pass@1")]
        p = statistics.fmean(statistics.fmean(c.evals["pass@1"]) for c in base)
        gs = sorted({q.schedule.n_train for q in ps})
        thr = p_star(max(gs))
        lp = learned(ps, "reward")
        full = load(s["name"], "full10")
        lf = learned(V.pilots_of(full), "reward") if full is not None else None
        collapsed_share = (sum(V.collapses(full).values()) / len(V.pilots_of(full))) if full is not None else None
        out.append({"setting": s["name"], "round": s["round"], "p": p, "groups": gs, "p_star": thr,
                    "predicted": signal(p, max(gs)).status != "ok", "pilot_learned": bool(lp and lp[0]),
                    "full_learned": None if lf is None else bool(lf[0]), "full_collapsed": collapsed_share})
    return out


def passrate_lines() -> list[str]:
    rows = passrate_rows()
    out = ["| setting | round | base pass rate p | trained group sizes g | p*(configured g) | rule: no signal | pilot grid learned "
           "| 10 × B full runs learned (share collapsed) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        full = "—" if r["full_learned"] is None else (f"{'yes' if r['full_learned'] else '**no**'} "
                                                       f"({r['full_collapsed']:.0%})")
        out.append(f"| {r['setting']} | {r['round']} | {r['p']:.3f} | {', '.join(map(str, r['groups']))} | "
                   f"{r['p_star']:.3f} | {'**yes**' if r['predicted'] else 'no'} | "
                   f"{'yes' if r['pilot_learned'] else '**no**'} | {full} |")
    nothing = [r for r in rows if not r["pilot_learned"] or r["full_learned"] is False]
    named = [r for r in nothing if r["predicted"]]
    false = [r for r in rows if r["predicted"] and r not in nothing]
    out += ["", f"Learned nothing (pilot grid or 10 × B full runs, race.stats.instability.learned): "
                f"{', '.join(r['setting'] for r in nothing)}. The rule names {len(named)} of them "
                f"({', '.join(r['setting'] for r in named) or 'none'}), misses "
                f"{', '.join(r['setting'] for r in nothing if not r['predicted']) or 'none'}, and names "
                f"{len(false)} setting{'s' if len(false) != 1 else ''} that learned"
                + (f" ({', '.join(r['setting'] for r in false)})" if false else "") + "."]
    return out


# ---------------------------------------------------------------- issue 49: pairing

def pairing_row(rec: dict, *, drop_collapsed: bool = False) -> dict[str, Any] | None:
    """Within one grid: the correlation across ρ of per-seed results sharing a seed index (each
    point's mean removed; pooled over every pair of points), and what pairing would buy: the
    variance of a paired difference of two points over that of an unpaired one (1 − the correlation)."""
    by: dict[float, dict[int, float]] = {}
    for p in V.pilots_of(rec):
        if drop_collapsed and collapsed(p):
            continue
        by.setdefault(p.rho_target, {})[p.seed] = statistics.fmean(p.evals["reward"])
    res = {t: {s: x - statistics.fmean(v.values()) for s, x in v.items()} for t, v in by.items() if len(v) > 1}
    ts = sorted(res)
    sab = saa = sbb = 0.0
    n = 0
    for a in range(len(ts)):
        for b in range(a + 1, len(ts)):
            common = set(res[ts[a]]) & set(res[ts[b]])
            for s in common:
                sab += res[ts[a]][s] * res[ts[b]][s]
                saa += res[ts[a]][s] ** 2
                sbb += res[ts[b]][s] ** 2
                n += 1
    if not n or saa <= 0 or sbb <= 0:
        return None
    return {"corr": sab / math.sqrt(saa * sbb), "pairs": n}


def pairing_lines() -> list[str]:
    out = ["| grid | seeds per point | correlation across ρ, all runs | without collapsed runs |", "|---|---|---|---|"]
    vals: dict[str, list[float]] = {"pilot": [], "full": [], "full_clean": []}
    for s in all_settings():
        for kind in ("pilot", *FULL_KINDS):
            rec = load(s["name"], kind)
            if rec is None or (kind != "pilot" and not V.planned(s, kind)):
                continue
            a, b = pairing_row(rec), pairing_row(rec, drop_collapsed=True)
            if a is None:
                continue
            key = "pilot" if kind == "pilot" else "full"
            vals[key].append(a["corr"])
            if b is not None and key == "full":
                vals["full_clean"].append(b["corr"])
            seeds = max(len(v) for v in V.point_means(rec).values())
            out.append(f"| {s['name']} {kind} | {seeds} | {a['corr']:+.2f} | {'—' if b is None else format(b['corr'], '+.2f')} |")
    out.append("")
    for key, name in (("pilot", "pilot grids"), ("full", "full-run grids"), ("full_clean", "full-run grids without collapsed runs")):
        xs = vals[key]
        out.append(f"- {name}: median correlation {_med(xs):+.2f} over {len(xs)} grids ({sum(x > 0 for x in xs)} positive); "
                   f"a paired difference of two points would have {1 - _med(xs):.2f} × the variance of an unpaired one.")
    return out
