"""Stability candidates read from a pilot grid, scored on the first round's full runs (issue 33).

    python research/scripts/stability.py                    # the table of docs/stability.md, with run-level rates
    python research/scripts/stability.py probe SETTING KIND # run the length probe for a setting's full-run grid
    python research/scripts/stability.py probes             # every probe of the first round not yet committed
    python research/scripts/stability.py --suite research/validation/round2.yaml probes   # round 2's (race.fullrun.probe; sealed-safe)
    python research/scripts/stability.py --suite research/validation/round2.yaml rate-plan  # race.stats.rate's plan per grid
    python research/scripts/stability.py --suite research/validation/round2.yaml rate       # its pre-registered rate runs
    python research/scripts/stability.py --suite research/validation/round2.yaml rates --write docs/stability.md
    python research/scripts/stability.py [--suite …] rates --check docs/stability.md       # what CI runs

**The length probe** (a candidate, written down before any probe ran; round 1's probes ran with
this script's own planner, round 2's with race.fullrun.probe, the same design at the grid's recommended ρ): one run at the full run's
budget F's optimizer-step count, at the pilot verdict's recommended ρ, with 1 prompt per step
instead of the grid's B_p and the same η and rollouts per prompt, so it costs F / B_p. Capped at
PROBE_SHARE of the pilot grid's compute (then it covers that share of the full run's steps). It
flags the setting when it falls back on its held-out checkpoints (race.stats.instability' rule).
Data: research/validation/probes/SETTING-KIND.json.gz (round 2: research/validation/round2/probes/), compact as the
study's grids. Two readings of a probe were scored (docs/stability.md): it fell back by the pilots'
rule (find_instability, the pre-registered one), or it ended below its base policy
(race.stats.instability.probe_fall, chosen on these data); the rule frozen for round 2 flags a setting when
some pilot fell back or its probe ended below its base (race.stats.instability.stability_at).

A candidate flags a setting from its pilot grid alone. Setting level: flagged among the settings
with ≥ 1/3 of their full runs collapsed (detection) and among those with none (false alarm).
Run level: flagged among the collapsed full runs, and among the stable ones. A full run collapsed
when it fell back on its own held-out checkpoints (race.stats.instability.find_instability); its setting's
10 × and 30 × B grids both count.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "research" / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import validation as V  # noqa: E402

PROBE_SHARE = 0.25          # the probe's cost, at most, as a share of the pilot grid's compute
PROBES = ROOT / "research" / "validation" / "probes"


def fell(p) -> bool:
    from race.stats.instability import find_instability

    return find_instability(p.checkpoints, "reward") is not None


def dipped(p, by: float = 0.03) -> bool:
    m = [statistics.fmean(c.evals["reward"]) for c in p.checkpoints if c.evals.get("reward")]
    return len(m) > 1 and max(m[1:]) - m[-1] >= by


def probe_below_base(p) -> bool:
    from race.stats.instability import probe_fall

    return probe_fall(p.checkpoints, "reward") is not None


# candidate → (reads the pilot grid, reads the probe): each a predicate of one pilot, or None
CANDIDATES = {"some pilot fell back (the rule of race/stats/instability.py)": (fell, None),
              "some pilot's last checkpoint ≥ 0.03 below its best": (dipped, None),
              "the length probe fell back (pilots' rule; pre-registered)": (None, fell),
              "the length probe ended below its base (race.stats.instability.probe_fall)": (None, probe_below_base),
              "**frozen:** some pilot fell back, or the probe ended below its base": (fell, probe_below_base)}


def flagged(candidate: tuple, pilots: list, probe) -> bool | None:
    """Whether a candidate flags a grid; None when it needs a probe that did not run."""
    on_pilots, on_probe = candidate
    hit = bool(on_pilots and any(on_pilots(p) for p in pilots))
    if on_probe is None:
        return hit
    if probe is None:
        return None if not hit else True
    return hit or on_probe(V.pilots_of(probe)[0])


def probe_config(s: dict, kind: str) -> dict:
    """The length probe's config for setting ``s`` and its full-run grid ``kind`` (see the docstring)."""
    pilot = V.load_run(s["name"], "pilot")
    pv = V.verdict(pilot)
    cfg = V.grid_config(s, kind, 1)
    F = float(s["pilot_budget"]) * V.KINDS[kind]
    bp = int((cfg.get("schedule") or {}).get("prompts_per_step", 8))
    grid_cost = sum(p.flops.total for p in V.pilots_of(pilot))
    budget = min(F / bp, PROBE_SHARE * grid_cost)
    cfg.update(name=f"probe-{s['name']}-{kind}", budget=budget, grid=[round(pv.recommended_rho, 3)], seeds=1)
    cfg["schedule"] = {**(cfg.get("schedule") or {}), "prompts_per_step": 1}
    return cfg


def run_probe(s: dict, kind: str, storage: Path) -> Path:
    """One length probe, run in this process (one thread): planned by race.flops.grid at the probe's
    budget, run by race.engine.pilot.run_pilot (a single pilot: no grid, no verdict)."""
    import gzip
    import json
    import time

    import torch

    from race.config.configfile import config_from_dict
    from race.flops.grid import plan_grid
    from race.engine.pilot import run_pilot

    torch.set_num_threads(1)
    raw = probe_config(s, kind)
    rho = raw["grid"][0]
    raw["grid"] = [rho, round(rho + 0.05, 3), round(rho + 0.1, 3)]     # the config's 3-point minimum; only ρ runs
    cfg = config_from_dict(raw)
    sched = next(x for x in plan_grid(cfg).schedules if x.rho_target == rho)
    t0 = time.time()
    result = run_pilot(cfg, sched, 0)
    rec = {"setting": s["name"], "kind": kind, "probe": {"share_cap": PROBE_SHARE, "budget": raw["budget"], "rho": rho,
                                                         "prompts_per_step": sched.prompts_per_step,
                                                         "steps": sched.steps, "mu": sched.mu},
           "commit": V._commit(ROOT), "wall_seconds": round(time.time() - t0, 1), "config": raw,
           "pilots": [V.compact_pilot(result.to_dict())]}
    PROBES.mkdir(parents=True, exist_ok=True)
    path = PROBES / f"{s['name']}-{kind}.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(rec, fh, separators=(",", ":"))
    return path


# Item 2 of issue 33: full runs at the rate race.stats.rate recommends, on settings that collapsed at their
# constant rate. lr-x3 at 10 × B needs none: its recommended rate (η ÷ 3, cosine, 5 % warm-up) is
# default-cosine's config exactly, whose 15 committed full runs at 10 × B answer it.
RATE_RUNS = (("reasoner", "full10"), ("default", "full30"))
RATE_VARIANTS: tuple = ()      # (setting, kind, variant) rate runs at another rate, from the suite's `rate_variants`
RATE_SEEDS = (0, 1, 2)
RATES = ROOT / "research" / "validation" / "rates"
ROUND = 1


def use_suite(suite: dict) -> None:
    """Point this module at a suite's folders: round 2 keeps its own committed grids (``runs``),
    probes (``probes``), rate runs (``rates``) and pre-registered rate runs (``rate_runs``)."""
    global PROBES, RATES, RATE_RUNS, RATE_VARIANTS, ROUND
    RATE_VARIANTS = tuple(tuple(v) for v in suite.get("rate_variants") or ())
    if suite.get("round") != 2:
        return
    ROUND = 2
    V.RUNS = ROOT / suite["runs"]
    PROBES = ROOT / suite["probes"]
    RATES = ROOT / suite.get("rates", "research/validation/round2/rates")
    RATE_RUNS = tuple((name, kind) for name, kind in suite.get("rate_runs") or ())


def probe_as_record(rec: dict) -> dict:
    """A committed probe file as race.fullrun.probe's record (what race.stats.instability.stability_at reads)."""
    from race.stats.instability import probe_fall

    p = V.pilots_of(rec)[0]
    cps = sorted((c for c in p.checkpoints if c.evals.get("reward")), key=lambda c: c.fraction)
    fall = probe_fall(p.checkpoints, "reward")
    return {"status": "fell" if fall else "held", "fall": fall, "learning_rate": p.schedule.learning_rate,
            "steps": p.schedule.steps * p.schedule.mu, "covers": (rec.get("probe") or {}).get("covers", 1.0),
            "curve": [{"fraction": c.fraction, "step": c.step, "mean": statistics.fmean(c.evals["reward"])}
                      for c in cps]}


def rate_plan(s: dict, kind: str) -> dict:
    """What race recipe would run for setting ``s`` at F = B × the kind's factor: ρ (the range at F's
    recommended ρ, else the verdict's) and the rate (race.stats.rate, from the frozen stability rule)."""
    from race.stats.instability import stability, stability_at
    from race.stats.drift import range_record
    from race.stats.rate import configured_lr, full_run_rate

    pilot = V.load_run(s["name"], "pilot")
    pilots, diag = V.pilots_of(pilot), V.diagnosis(pilot)
    B = float(s["pilot_budget"])
    F = B * V.KINDS[kind]
    raw = V.grid_config(s, kind, 1)
    lr, full_lr = configured_lr(raw)
    # both rounds' rate runs were planned with the drift population frozen at f6862b9: their ρ stays that one
    rng = range_record(pilots, diag, pilot_budget=B, full_run_budget=F, constant_rate=lr.schedule == "constant",
                       population=V.FROZEN_POPULATION)
    rho = float(rng["recommended_rho"]) if "refused" not in rng else float(diag.primary.recommended_rho)
    probe = load_probe(s["name"], kind)
    probe = probe_as_record(probe) if probe else None
    at_f = stability_at(stability(pilots, "reward"), full_run_budget=F, pilot_budget=B, probe=probe,
                        partial_probe=False)
    # no cause: the rate as frozen at f6862b9 for the rate runs (η ÷ 3 whenever at risk; rule 5 came after them)
    rate = full_run_rate(lr, status=at_f["status"], factor=F / B, full_lr=full_lr, probe=probe)
    raw["learning_rate"] = {**(raw.get("learning_rate") or {}), "ref": lr.ref * rate["scale"],
                            "schedule": rate["schedule"], "warmup": rate["warmup"]}
    return {"rho": round(rho, 3), "F": F, "stability": at_f, "rate": rate, "config": raw, "eta_ref": lr.ref}


# Rate variants (development data: round 2's after its unsealing, round 1's since): name → (η scale, schedule,
# warm-up), replacing the recommendation's rate; the ρ stays the recommended one.
from race.stats.rate import LONG_WARMUP  # noqa: E402  (light: no torch)

VARIANTS = {"same-eta-cosine": (1.0, "cosine", LONG_WARMUP)}   # rule 3's rate: the configured η, cosine decay to 0


def run_rate(s: dict, kind: str, seed: int, variant: str | None = None) -> Path:
    """One full run at the recommended rate and ρ (race.engine.pilot.run_pilot in this process, one thread);
    with ``variant``, at that rate of VARIANTS instead (its own file, out of the scored table)."""
    import gzip
    import json
    import time

    import torch

    from race.config.configfile import config_from_dict
    from race.flops.grid import plan_grid

    torch.set_num_threads(1)
    plan = rate_plan(s, kind)
    raw, rho = dict(plan["config"]), plan["rho"]
    if variant is not None:
        scale, schedule, warmup = VARIANTS[variant]
        raw["learning_rate"] = {**raw["learning_rate"], "ref": plan["eta_ref"] * scale, "schedule": schedule,
                                "warmup": warmup}
        plan["rate"] = {"rule": variant, "scale": scale, "schedule": schedule, "warmup": warmup,
                        "line": f"rate for F: η × {scale:g} = {plan['eta_ref'] * scale:.3g} (η_ref), {schedule} with "
                                f"{warmup:.0%} warm-up (variant {variant})"}
    raw.update(name=f"rate-{s['name']}-{kind}", grid=[rho, round(rho + 0.05, 3), round(rho + 0.1, 3)], seeds=1)
    cfg = config_from_dict(raw)
    sched = next(x for x in plan_grid(cfg).schedules if x.rho_target == rho)   # the config's 3-point minimum
    from race.engine.pilot import run_pilot

    t0 = time.time()
    result = run_pilot(cfg, sched, seed)
    rec = {"setting": s["name"], "kind": kind, "seed": seed, "rho": rho, "stability": plan["stability"],
           "rate": plan["rate"], "commit": V._commit(ROOT), "wall_seconds": round(time.time() - t0, 1),
           "config": raw, "pilots": [V.compact_pilot(result.to_dict())]}
    RATES.mkdir(parents=True, exist_ok=True)
    path = RATES / f"{s['name']}-{kind}-{variant + '-' if variant else ''}s{seed}.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(rec, fh, separators=(",", ":"))
    return path


def run_product_probe(suite: dict, s: dict, kind: str) -> Path:
    """Round 2's probe of a setting's full-run budget: race.fullrun.probe planned on the committed pilot grid
    (its verdict's recommended ρ, F = B × the kind's factor), run in this process on one thread; the
    record holds race.fullrun.probe's record and the compact run. Written to the suite's ``probes`` folder."""
    import gzip
    import json
    import time

    import torch

    from race.engine.pilot import run_pilot
    from race.fullrun.probe import plan_probe, probe_record
    from race.stats.results import Results

    torch.set_num_threads(1)
    pilot = V.load_run(s["name"], "pilot")
    res = Results(pilots=tuple(V.pilots_of(pilot)), diagnosis=V.diagnosis(pilot), config=pilot["config"], plan={})
    plan = plan_probe(res, float(s["pilot_budget"]) * V.KINDS[kind])
    t0 = time.time()
    result = run_pilot(plan.config, plan.schedule, 0)
    wall = time.time() - t0
    rec = {"setting": s["name"], "kind": kind, "commit": V._commit(ROOT), "wall_seconds": round(wall, 1),
           "plan": plan.line(), "probe": probe_record(plan, result, target="reward", wall_seconds=wall),
           "pilots": [V.compact_pilot(result.to_dict())]}
    folder = ROOT / suite["probes"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{s['name']}-{kind}.json.gz"
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(rec, fh, separators=(",", ":"))
    tmp.replace(path)
    return path


def rate_lines() -> list[str]:
    """The validation of the rate for F (issue 33, item 2): per setting, the full runs at the
    recommended rate and ρ that are in (research/validation/rates/), their collapses and final held-out
    reward, against the constant rate's stable full runs at the nearest ρ of the committed grid.
    A suite's ``rate_variants`` (other rates at the same ρ) follow in a table of their own, not scored."""
    rows = [("lr-x3", "full10", None)] * (ROUND == 1) + [(n, k, None) for n, k in RATE_RUNS]
    out, held = _rate_table(rows)
    tot = [sum(h[i] for h in held) for i in range(1, 5)]
    out += ["", f"The rate holds on {sum(h[0] for h in held)} of {len(held)} grids whose runs are all in: no run at the "
            "recommended rate collapsed, and their mean final reward is not below the constant rate's stable runs by "
            "more than 2 SEs of the difference (Welch; where none of those held, no collapse suffices). On those grids "
            f"{tot[0]} of {tot[1]} runs at the recommended rate collapsed, and {tot[2]} of {tot[3]} at the constant rate."]
    if RATE_VARIANTS:
        more, _ = _rate_table([tuple(v) for v in RATE_VARIANTS])
        out += ["", ("After the unsealing (development data, not a score of the frozen rule), other rates at the same ρ:"
                     if ROUND == 2 else "Other rates at the same ρ (development data, written down before they ran):"),
                "", *more]
    return out


def _rate_table(rows: list[tuple]) -> tuple[list[str], list[bool]]:
    """rate_lines' table for (setting, kind, variant or None) rows, and whether each complete row holds."""
    import gzip
    import json

    out = ["| setting | F | rate (rule) | ρ | runs in | collapsed | final reward, mean (seeds) | constant rate's "
           "stable runs at the nearest ρ | holds? |", "|---|---|---|---|---|---|---|---|---|"]
    held = []
    for name, kind, variant in rows:
        if name == "lr-x3":      # η ÷ 3 with cosine is default-cosine's config: its committed runs answer it
            runs = V.pilots_of(V.load_run("default-cosine", kind))
            rate, rho = "η ÷ 3, cosine (2): default-cosine's runs", "all 5"
        else:
            recs = []
            head = f"{name}-{kind}-{variant + '-' if variant else ''}s"
            for path in sorted(RATES.glob(f"{head}*.json.gz")):
                if not path.name.removeprefix(head).removesuffix(".json.gz").isdigit():
                    continue                 # another rate's run (a variant's, or the recommended one's)
                with gzip.open(path, "rt", encoding="utf-8") as fh:
                    recs.append(json.load(fh))
            if not recs:
                out.append(f"| {name} | {kind[4:]}×B | — | — | 0/{len(RATE_SEEDS)} | | | | |")
                continue
            runs = [V.pilots_of(r)[0] for r in recs]
            r0 = recs[0]["rate"]
            rate = (f"{r0['line'].split('(')[0].removeprefix('rate for F: ').strip()} ({r0['rule']})" if not variant else
                    f"η × {r0['scale']:g}, {r0['schedule']} decay to 0 with {r0['warmup']:.0%} warm-up ({variant})")
            rho = f"{recs[0]['rho']:.3f}"
        finals = [statistics.fmean(p.evals["reward"]) for p in runs]
        grid = V.load_run(name, kind)
        if grid is None:            # its constant-rate grid has not landed yet
            out.append(f"| {name} | {kind[4:]}×B | {rate} | {rho} | {len(runs)}/{len(RATE_SEEDS)} | "
                       f"{sum(fell(p) for p in runs)} | {statistics.fmean(finals):.3f} ({len(finals)}) | not in yet | |")
            continue
        base = V.pilots_of(grid)
        target = runs[0].rho_target if name != "lr-x3" else None
        near = (base if target is None else
                [p for p in base if p.rho_target == min({q.rho_target for q in base}, key=lambda r: abs(r - target))])
        stable = [statistics.fmean(p.evals["reward"]) for p in near if not fell(p)]
        sd = f" ± {statistics.stdev(finals):.3f}" if len(finals) > 1 else ""
        ref = (f"{statistics.fmean(stable):.3f} ({len(stable)} of {len(near)} held)" if stable
               else f"none held ({len(near)} collapsed)")
        ok = rate_holds(finals, stable, collapsed=sum(fell(p) for p in runs))
        done = name == "lr-x3" or len(runs) == len(RATE_SEEDS)
        if done:                    # (holds?, its runs collapsed, its runs, the grid's constant-rate ones, all of those)
            held.append((ok, sum(fell(p) for p in runs), len(runs), sum(fell(p) for p in base), len(base)))
        out.append(f"| {name} | {kind[4:]}×B | {rate} | {rho} | {len(runs)}"
                   + (f"/{len(RATE_SEEDS)}" if name != "lr-x3" else "") + f" | {sum(fell(p) for p in runs)} | "
                   f"{statistics.fmean(finals):.3f}{sd} ({len(finals)}) | {ref} | "
                   f"{('yes' if ok else '**no**') if done else '(under way)'} |")
    return out, held


def rate_holds(finals: list[float], stable: list[float], *, collapsed: int) -> bool:
    """Issue 33's target for the rate for F on one grid, as scored here (fixed before round 2's rate
    runs were read past the first two settings): no run at the recommended rate collapsed, and its
    mean final reward is not below the constant rate's stable runs' by more than 2 SEs of the
    difference (Welch's, from the two samples; one sample of one run counts its SD as 0)."""
    if collapsed:
        return False
    if not stable:
        return True
    var = lambda xs: statistics.variance(xs) if len(xs) > 1 else 0.0  # noqa: E731
    se = (var(finals) / len(finals) + var(stable) / len(stable)) ** 0.5
    return statistics.fmean(finals) - statistics.fmean(stable) >= -2 * se


def load_probe(name: str, kind: str) -> dict | None:
    import gzip
    import json

    path = PROBES / f"{name}-{kind}.json.gz"
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", nargs="?", default="table",
                    choices=["table", "probe", "probes", "rate-plan", "rate", "rates"])
    ap.add_argument("--write", default=None, help="rates: write the table between the stability:rates markers")
    ap.add_argument("--check", default=None, help="rates: exit 1 unless FILE's table is what the committed runs give")
    ap.add_argument("--seeds", default=",".join(map(str, RATE_SEEDS)))
    ap.add_argument("--variant", default=None, choices=sorted(VARIANTS),
                    help="rate: run at this rate instead of the recommended one (after unsealing; its own files)")
    ap.add_argument("setting", nargs="?")
    ap.add_argument("kind", nargs="?", default="full10")
    ap.add_argument("--storage", default="/work/validation-runs/probes")
    ap.add_argument("--only", default=None, help="probes: SETTING:KIND,… in this order (default: all, suite order)")
    ap.add_argument("--suite", default=str(V.SUITE))
    return ap


def _rates(args: argparse.Namespace) -> int:
    """rates: the rate runs' table, printed, or checked (``--check``) or rewritten (``--write``) between
    the stability:rates markers of a document."""
    text = "\n".join(rate_lines())
    tag = "rates" if ROUND == 1 else "rates2"
    a, b = f"<!-- stability:{tag}:begin -->", f"<!-- stability:{tag}:end -->"
    if args.check:
        body = Path(args.check).read_text(encoding="utf-8")
        if a not in body or body.split(a)[1].split(b)[0].strip() != text.strip():
            print(f"{args.check}: the table between the stability:{tag} markers is not what the committed "
                  f"rate runs give; rewrite it with `rates --write {args.check}`", file=sys.stderr)
            return 1
        print(f"{args.check}: stability:{tag} table up to date")
        return 0
    if args.write:
        doc = Path(args.write)
        body = doc.read_text(encoding="utf-8")
        doc.write_text(body.split(a)[0] + a + "\n" + text + "\n" + b + body.split(b)[1], encoding="utf-8")
    print(text)
    return 0


def _table(suite: dict) -> None:
    """table: each candidate early-warning rule's detections and false alarms over the committed grids and
    their probes, then each grid's probe."""
    rows = []            # (setting, kind, pilots, probe, collapsed, runs)
    for s in suite["settings"]:
        pilots = V.pilots_of(V.load_run(s["name"], "pilot"))
        for k in ("full10", "full30"):
            if V.load_run(s["name"], k):
                full = V.pilots_of(V.load_run(s["name"], k))
                rows.append((s["name"], k, pilots, load_probe(s["name"], k), sum(fell(p) for p in full), len(full)))
    names = sorted({r[0] for r in rows}, key=[s["name"] for s in suite["settings"]].index)
    coll = {n: (sum(r[4] for r in rows if r[0] == n), sum(r[5] for r in rows if r[0] == n)) for n in names}
    risky = [n for n in names if coll[n][0] and coll[n][0] * 3 >= coll[n][1]]
    clean = [n for n in names if coll[n][0] == 0]
    ci = lambda k, n: "{:.2f} … {:.2f}".format(*V.wilson(k, n))  # noqa: E731
    print("| candidate | settings ≥ 1/3 collapsed, flagged (95 % CI) | settings with no collapse, flagged | "
          "grids with a collapse, flagged | collapsed full runs in flagged grids | stable full runs in flagged grids |")
    print("|---|---|---|---|---|---|")
    for name, cand in CANDIDATES.items():
        flag = {(r[0], r[1]): flagged(cand, r[2], r[3]) for r in rows}
        if any(v is None for v in flag.values()):
            print(f"| {name} | (a probe is missing: {', '.join(f'{a}:{b}' for (a, b), v in flag.items() if v is None)}) "
                  "| | | | |")
            continue
        by = {n: any(flag[(r[0], r[1])] for r in rows if r[0] == n) for n in names}
        det, fa = sum(by[n] for n in risky), sum(by[n] for n in clean)
        hit = [r for r in rows if r[4]]
        gh = sum(flag[(r[0], r[1])] for r in hit)
        cr = sum(r[4] for r in rows if flag[(r[0], r[1])]), sum(r[4] for r in rows)
        sr = sum(r[5] - r[4] for r in rows if flag[(r[0], r[1])]), sum(r[5] - r[4] for r in rows)
        print(f"| {name} | {det}/{len(risky)} ({ci(det, len(risky))}) | {fa}/{len(clean)} ({ci(fa, len(clean))}) | "
              f"{gh}/{len(hit)} ({ci(gh, len(hit))}) | {cr[0]}/{cr[1]} ({ci(*cr)}) | {sr[0]}/{sr[1]} ({ci(*sr)}) |")
    print()
    print("| setting | grid | collapsed full runs | pilots fell back | probe: base → end | probe fell back | "
          "probe below base | probe steps (share of the full run's) |")
    print("|---|---|---|---|---|---|---|---|")
    for n, k, pilots, probe, c, t in rows:
        pp = V.pilots_of(probe)[0] if probe else None
        cur = [statistics.fmean(c_.evals["reward"]) for c_ in sorted(pp.checkpoints, key=lambda c_: c_.fraction)
               if c_.evals.get("reward")] if pp else []
        steps = (probe.get("probe") or {}).get("steps") if probe else None
        cov = (probe.get("probe") or {}).get("covers") if probe else None
        print(f"| {n} | {k} | {c}/{t} | {sum(fell(p) for p in pilots)}/{len(pilots)} | "
              + (f"{cur[0]:.3f} → {cur[-1]:.3f} | {'yes' if fell(pp) else 'no'} | {'yes' if probe_below_base(pp) else 'no'} | "
                 f"{steps}" + (f" ({cov:.0%})" if cov is not None else "") if pp else "— | — | — | —") + " |")


def main() -> int:
    args = _parser().parse_args()
    suite = V.load_suite(Path(args.suite))
    use_suite(suite)
    if suite.get("round") == 2 and args.cmd not in ("probes", "rate-plan", "rate", "rates"):
        raise SystemExit("round 2: `probes` and the rate runs here (its scores: "
                         "research/scripts/validation_round2.py tables, after the freeze)")
    if suite.get("round") == 2 and args.cmd == "probes":
        for s in suite["settings"]:
            for kind in ("full10", "full30", "full100"):
                done = (ROOT / suite["probes"] / f"{s['name']}-{kind}.json.gz").is_file()
                if V.planned(s, kind) and not done and (not args.only or s["name"] in args.only.split(",")):
                    print(run_product_probe(suite, s, kind), flush=True)
        return 0
    if args.cmd == "probe":
        print(run_probe(V.setting(suite, args.setting), args.kind, Path(args.storage)))
        return 0
    if args.cmd == "rate-plan":
        todo = ([(args.setting, args.kind)] if args.setting else
                [(s["name"], k) for s in suite["settings"] for k in ("full10", "full30", "full100")
                 if V.planned(s, k) and V.data_path(s["name"], "pilot").is_file()] if ROUND == 2 else RATE_RUNS)
        for name, kind in todo:
            plan = rate_plan(V.setting(suite, name), kind)
            print(f"{name} {kind}: ρ {plan['rho']}, {plan['stability']['status']}; {plan['rate']['line']}")
        return 0
    if args.cmd == "rates":
        return _rates(args)
    if args.cmd == "rate":
        tag = f"{args.variant}-" if args.variant else ""
        for name, kind in ([(args.setting, args.kind)] if args.setting else RATE_RUNS):
            for seed in map(int, args.seeds.split(",")):
                if not (RATES / f"{name}-{kind}-{tag}s{seed}.json.gz").is_file():
                    print(run_rate(V.setting(suite, name), kind, seed, args.variant), flush=True)
        return 0
    if args.cmd == "probes":
        todo = ([tuple(x.split(":")) for x in args.only.split(",")] if args.only else
                [(s["name"], k) for s in suite["settings"] for k in ("full10", "full30")])
        for name, kind in todo:
            s = V.setting(suite, name)
            if True:
                if V.load_run(s["name"], kind) is not None and load_probe(s["name"], kind) is None:
                    try:
                        print(run_probe(s, kind, Path(args.storage)), flush=True)
                    except SystemExit as e:
                        print(e, flush=True)
        return 0
    _table(suite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
