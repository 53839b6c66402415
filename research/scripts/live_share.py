"""Issue 49's last question, live: which design should `race init` default to, each run at the share it sizes.

    python research/scripts/live_share.py plan                    # what race sizes for each grid and design (no run)
    python research/scripts/live_share.py run [--pin PIN]         # run (or resume) every sized (grid, design)
    python research/scripts/live_share.py tables                  # docs/pilot.md's block
    python research/scripts/live_share.py tables --check docs/pilot.md   # exit 1 if the doc's block differs
    python research/scripts/live_share.py tables --write docs/pilot.md   # rewrite it

The plan is research/validation/live49.yaml's ``at_share`` (committed before any of its runs). For every scored
full-run grid of rounds 1–2 (research/scripts/replay.py ``grids``) and each design of ``at_share``, ``plan`` sizes
the setting's pilot config (research/scripts/validation.py ``grid_config(s, "pilot", seeds)``, its F as
``full_run_budget``) with race.run.sizing.size_pilots at the plan's share, as ``race pilot --full-run F --design D``
sizes it, and the least share at which each design fits (arithmetic on the configs, no run). ``run`` runs, on the
grids where every design is sized, each design with exactly that command from the pinned checkout ``PIN``
(storage under the plan's ``storage``: the same command resumes a stopped grid) and writes one gzipped JSON
record per (grid, design) under the plan's ``records``. A (grid, design) with a record is not run again.

``tables`` reads committed records only. Halving is scored as research/scripts/live_design.py scores its live
design (``live_at``: the kept ρ to B, the dropped ones at their last reading); a grid design (``fit``) as
``replay.design_at`` scores a grid design (race.stats.regime.classify on its pilots for the range at B and the
recommended ρ, then race.stats.drift.range_for_pilots to F with the other settings' population), both on the
grid's frozen reading of its full runs. Deterministic; no run, no clock.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "research" / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import live_design as L  # noqa: E402
import replay as R  # noqa: E402
import validation as V  # noqa: E402

BEGIN, END = "<!-- live49-share:tables:begin -->", "<!-- live49-share:tables:end -->"
PRIOR = "prior alone (no pilots)"
NEAR_SE = 0.5          # the plan's decision rule: halving's median regret at most this far above fit's


def spec() -> dict[str, Any]:
    return L.plan()["at_share"]


def scored_grids() -> list[int]:
    """Indices into replay.grids() of every scored full-run grid of rounds 1–2."""
    return [i for i, g in enumerate(R.grids()) if g["scored"]]


def planned_grids(pin: Path = ROOT) -> list[int]:
    """The plan's grids: the scored ones where race sizes every design of the plan at its share."""
    return [i for i in scored_grids() if all(sized(i, d, pin)[0] is not None for d in spec()["designs"])]


def least_share(i: int, design: str, pin: Path = ROOT, steps: int = 10) -> float | None:
    """The least share (to within 0.99 / 2^steps) at which race sizes ``design`` for grid ``i``; None when not
    even 0.99 of F buys it (a share must be < 1)."""
    lo, hi = 0.0, 0.99
    if sized(i, design, pin, hi)[0] is None:
        return None
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if sized(i, design, pin, mid)[0] is not None else (mid, hi)
    return hi


def key_of(i: int, design: str) -> str:
    return f"{R.label(R.grids()[i]).replace(' ', '-').replace('×', 'x')}-{design}"


def record_path(i: int, design: str) -> Path:
    return ROOT / spec()["records"] / f"{key_of(i, design)}.json.gz"


def load_record(i: int, design: str) -> dict | None:
    return V.read_gz_json(record_path(i, design))


# ---------------------------------------------------------------- plan and run

def base_config(i: int, pin: Path) -> dict:
    """The grid's setting's pilot config (as live_design.live_config builds it), with the grid's F."""
    g = R.grids()[i]
    s, suite = L.setting_of(g["setting"])
    cfg = V.grid_config(s, "pilot", int(spec()["seeds"]), root=pin, suite=suite)
    return {**cfg, "full_run_budget": float(g["F"])}


@lru_cache(maxsize=None)
def sized(i: int, design: str, pin: Path, share: float | None = None) -> tuple[dict | None, str]:
    """race.run.sizing.size_pilots on the grid's config: (the design's record, its one line), or (None, why
    race refuses it)."""
    from race.config.configfile import config_from_dict
    from race.core.errors import RaceError
    from race.run.sizing import size_pilots

    cfg = config_from_dict(base_config(i, pin), base_dir=str(pin))
    try:
        _, d = size_pilots(cfg, full_run=cfg.full_run_budget, design=design,
                           share=float(spec()["share"] if share is None else share))
    except RaceError as e:                  # SizingError, or the design's DesignError: race pilot's one line
        return None, str(e)
    return d, f"B {d['budget']:.3g}, F / B {cfg.full_run_budget / d['budget']:.1f}, {len(d['pilots'])} pilots"


def command(config_file: Path, out_dir: Path, pin: Path, F: float, design: str) -> list[str]:
    sp = spec()
    return [sys.executable, "-m", V._cli_module(pin), "pilot", str(config_file), "--out", str(out_dir), "--quiet",
            "--format", "json", "--engine", sp["engine"], "--workers", str(sp["workers"]),
            "--full-run", f"{F:.6g}", "--design", design, "--share", f"{float(sp['share']):g}"]


def run_one(i: int, design: str, pin: Path, storage: Path) -> Path:
    g = R.grids()[i]
    cfg = {**base_config(i, pin), "name": f"live49-share-{key_of(i, design)}"}
    out_dir = storage / key_of(i, design)
    res, shared = L.run_at_pin(cfg, out_dir, pin, lambda f: command(f, out_dir, pin, float(g["F"]), design),
                               key_of(i, design))
    rec = {"setting": g["setting"], "grid": R.label(g), "F": float(g["F"]), "design_name": design,
           "share": float(spec()["share"]), "budget": float(res["config"]["budget"]),
           "points": res["config"]["grid"], "seeds": res["config"]["seeds"],
           "design": (res.get("diagnosis") or {}).get("meta", {}).get("design") or res.get("design"), **shared}
    return V.write_gz_json(record_path(i, design), rec)


# ---------------------------------------------------------------- score

def grid_at(i: int, rec: dict) -> dict[str, Any]:
    """A grid design's live pilots at grid ``i``'s F, scored as replay.design_at scores a grid design."""
    from race.core.records import PilotResult
    from race.stats.drift import DriftError, range_for_pilots
    from race.stats.regime import classify

    g = R.grids()[i]
    pilots = [PilotResult.from_dict(p) for p in rec["pilots"] if p.get("status") == "complete"]
    diag = classify(pilots, targets=["reward"], primary_target="reward", n_boot=R.N_BOOT, seed=0,
                    rerun_confidence=False)
    at_b, rho_b = tuple(diag.primary.rho_range), diag.primary.recommended_rho
    try:
        r = range_for_pilots(pilots, target="reward", pilot_budget=float(rec["budget"]), full_run_budget=g["F"],
                             rho_range=at_b, recommended_rho=rho_b, constant_rate=g["constant"],
                             population=R.loso_population(g["setting"]))
        (lo, hi), rho = r.rho_range, r.recommended_rho
    except DriftError:
        (lo, hi), rho = at_b, rho_b
    rr = R.response(i)
    return {"regime": diag.primary.regime.value, "range": (lo, hi), "rho": rho, "width": hi - lo,
            "covered": V._within(rr.best_rho, lo, hi), "regret": rr.regret(rho)}


def _eval_flops(p: dict) -> float:
    ev = (p.get("extra") or {}).get("eval_flops") or 0.0
    return float(sum(ev.values()) if isinstance(ev, dict) else ev)


def spent(rec: dict) -> float:
    """Everything the pilots spent (training C_total and held-out evaluation), over F: budget halving's own
    count where the run kept one (its readings at the rung included), else the pilots' FLOPs and evaluation."""
    c = (rec.get("budget_halving") or {}).get("compute")
    total = c["total_flops"] if c else sum(p["flops"]["total"] + _eval_flops(p) for p in rec["pilots"])
    return total / float(rec["F"])


def rows() -> list[dict[str, Any]]:
    out = []
    for i in planned_grids():
        prior = R.design_at(i, PRIOR)
        for d in spec()["designs"]:
            rec = load_record(i, d)
            if rec is None:
                continue
            sc = L.live_at(i, rec) if d == "halving" else grid_at(i, rec)
            out.append({"i": i, "label": R.label(R.grids()[i]), "design": d, "best": R.response(i).best_rho,
                        "B": float(rec["budget"]), "reach": float(rec["F"]) / float(rec["budget"]),
                        "pilots": len(rec["pilots"]), "spent": spent(rec), "score": sc, "prior": prior,
                        "wall_min": rec["wall_seconds"] / 60})
    return out


def decision(rs: Sequence[dict], pin: Path = ROOT) -> str:
    """The plan's decision rule: (a) halving sizes on at least as many scored grids as fit at the share; (b) over
    the grids where both ran, it covers at least as many with a median regret at most NEAR_SE above fit's."""
    n = {d: sum(sized(i, d, pin)[0] is not None for i in scored_grids()) for d in ("halving", "fit")}
    a = n["halving"] >= n["fit"]
    first = (f"(a) at the {float(spec()['share']):.0%} share halving sizes pilots on {n['halving']} of "
             f"{len(scored_grids())} grids, fit on {n['fit']}: {'holds' if a else 'fails'}.")
    both = {r["i"] for r in rs if r["design"] == "halving"} & {r["i"] for r in rs if r["design"] == "fit"}
    if not both:
        b, second = False, "(b) no grid has both designs recorded yet."
    else:
        h = [r for r in rs if r["design"] == "halving" and r["i"] in both]
        f = [r for r in rs if r["design"] == "fit" and r["i"] in both]
        ch, cf = sum(r["score"]["covered"] for r in h), sum(r["score"]["covered"] for r in f)
        mh = statistics.median(r["score"]["regret"] for r in h)
        mf = statistics.median(r["score"]["regret"] for r in f)
        b = ch >= cf and mh <= mf + NEAR_SE
        second = (f"(b) over the {len(both)} grids both ran, halving covered {ch}, fit {cf}; median regret {mh:.2f} "
                  f"against {mf:.2f} pooled SEs: {'holds' if b else 'fails'}.")
    verdict = "`halving` becomes `race init`'s default." if a and b else "`fit` stays `race init`'s default."
    return f"{first} {second} {verdict}"


def table_lines() -> list[str]:
    rs = rows()
    out = ["| grid | full-run best ρ | design | B (F / B) | pilots | spent / F | range at F (width) | covered | "
           "regret | prior alone: regret | wall (min) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        s = r["score"]
        out.append(f"| {r['label']} | {r['best']:.2f} | {r['design']} | {r['B']:.3g} ({r['reach']:.1f}) | "
                   f"{r['pilots']} | {r['spent']:.3f} | {L._rng(s['range'])} ({s['width']:.2f}) | {L._yn(s['covered'])} | "
                   f"{s['regret']:.2f} | {r['prior']['regret']:.2f} | {r['wall_min']:.1f} |")
    per = []
    for d in spec()["designs"]:
        ds = [r for r in rs if r["design"] == d]
        if ds:
            per.append(f"{d} covered {sum(r['score']['covered'] for r in ds)} of {len(ds)}, median width "
                       f"{L._med([r['score']['width'] for r in ds]):.2f}, median regret "
                       f"{L._med([r['score']['regret'] for r in ds]):.2f}, spent {min(r['spent'] for r in ds):.3f}–"
                       f"{max(r['spent'] for r in ds):.3f} of F")
    grids = sorted({r["i"] for r in rs})
    if grids:
        per.append(f"the prior alone: median regret {L._med([R.design_at(i, PRIOR)['regret'] for i in grids]):.2f}")
    return out + ["", f"Over {len(grids)} grids: " + "; ".join(per) + ".", "", decision(rs)]


def sizing_lines(pin: Path = ROOT) -> list[str]:
    """Every scored grid of rounds 1–2: what race sizes for each design at the plan's share (arithmetic on the
    configs, no run), and the least share at which each design fits."""
    ds = spec()["designs"]
    out = ["| grid | F | " + " | ".join(f"{d} at {float(spec()['share']):.0%}: B (F / B), pilots | {d}: least share"
                                        for d in ds) + " |", "|---|---|" + "---|---|" * len(ds)]
    for i in scored_grids():
        g, cells = R.grids()[i], []
        for d in ds:
            rec, _ = sized(i, d, pin)
            least = least_share(i, d, pin)
            cells.append((f"{rec['budget']:.3g} ({float(g['F']) / rec['budget']:.0f}), {len(rec['pilots'])}" if rec
                          else "refused") + f" | {f'{least:.2f}' if least is not None else '> 0.99'}")
        out.append(f"| {R.label(g)} | {float(g['F']):.3g} | " + " | ".join(cells) + " |")
    n = {d: sum(sized(i, d, pin)[0] is not None for i in scored_grids()) for d in ds}
    least = {d: statistics.median(x if x is not None else 1.0 for x in (least_share(i, d, pin) for i in scored_grids()))
             for d in ds}
    return out + ["", f"At the {float(spec()['share']):.0%} share, of {len(scored_grids())} scored grids: "
                  + ", ".join(f"{d} sized on {n[d]}" for d in ds) + f"; the plan's grids (every design sized): "
                  f"{len(planned_grids(pin))}. The median least share (> 0.99 counted as 1): "
                  + ", ".join(f"{d} {least[d]:.2f}" for d in ds) + "."]


def tables_text() -> str:
    return V.section_tables([("What race sizes at the share, per grid (arithmetic on the configs, no run)", sizing_lines),
                             ("`race init`'s designs at the share they size, live (plan `at_share`)", table_lines)])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tables":
        return V.doc_command(argv[1:], tables_text, BEGIN, END, "research/scripts/live_share.py")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--pin", default=str(ROOT), help="the pinned checkout the grids run from")
    args = ap.parse_args(argv)
    pin = Path(args.pin)
    if args.cmd == "plan":
        sys.stdout.write("\n".join(sizing_lines(pin)) + "\n")
        return 0
    storage = Path(spec()["storage"])
    for i in planned_grids(pin):
        for d in spec()["designs"]:
            tag = key_of(i, d)
            if load_record(i, d) is not None:
                print(f"{tag}: recorded", flush=True)
                continue
            print(f"{tag}: running ({sized(i, d, pin)[1]})", flush=True)
            print(f"{tag}: → {run_one(i, d, pin, storage)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
