"""The live check of the replay (issue 49): the replay's winning pilot design run live, scored as the replay scored it.

    python research/scripts/live_design.py run [--pin PIN] [--only NAME,…]   # run (or resume) the plan's settings
    python research/scripts/live_design.py run --design default_ladder       # the plan's addendum: the default ladder until this check
    python research/scripts/live_design.py score                            # live against replay, per grid
    python research/scripts/live_design.py tables                           # docs/pilot.md's block
    python research/scripts/live_design.py tables --check docs/pilot.md     # exit 1 if the doc's block differs
    python research/scripts/live_design.py tables --write docs/pilot.md     # rewrite it

The plan, its settings, design and scoring rules were committed before any run:
research/validation/live49.yaml. ``run`` builds each setting's pilot config as research/scripts/validation.py
does (``grid_config(s, "pilot", seeds)``), refuses one whose budget, grid or seeds differ from the stored
pilot record's, runs ``race pilot --adaptive-policy budget-halving`` with the plan's ladder from the pinned
checkout ``PIN`` (its storage under the plan's ``storage``: the same command resumes a stopped grid), and
writes one gzipped JSON record per setting under the plan's ``records`` (the command, the pin's commit, the
wall time, the config, results.json's budget-halving record and its pilots, floats at 6 digits). A setting
with a record is not run again. The plan's addendum (``default_ladder``: the default ladder until this check, η 3, B/9
and B/3, keep ci) runs the same way into its own records and storage; the replay did not score that design,
so its table puts the nearest replay designs beside it, with no match rule.

``score`` and ``tables`` read committed records only, with research/scripts/replay.py's own functions
(``grids``, ``Response`` through ``response``, ``loso_population``, ``design_at``, ``evidence``,
``full_regime``): the live evidence is built exactly as ``replay.evidence`` builds the halving design's,
from the live pilots instead of truncated stored ones. Deterministic; no run, no clock.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "research" / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import replay as R  # noqa: E402
import validation as V  # noqa: E402

PLAN = ROOT / "research" / "validation" / "live49.yaml"
BEGIN, END = "<!-- live49:tables:begin -->", "<!-- live49:tables:end -->"
MATCH_SE = 1.0          # the plan's match rule: same coverage and regrets within 1.0 pooled SE


@lru_cache(maxsize=1)
def plan() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(PLAN.read_text(encoding="utf-8"))


def design(key: str = "design") -> dict[str, Any]:
    """The plan's design ``key`` ("design", or the addendum's "default_ladder", which takes the main design's
    seeds, engine, workers and policy)."""
    main = plan()["design"]
    return main if key == "design" else {**main, **plan()[key]}


def record_path(name: str, key: str = "design") -> Path:
    return ROOT / (plan()["records"] if key == "design" else plan()[key]["records"]) / f"{name}.json.gz"


def load_record(name: str, key: str = "design") -> dict | None:
    return V.read_gz_json(record_path(name, key))


# ---------------------------------------------------------------- run

def setting_of(name: str) -> tuple[dict, dict]:
    """The setting and its suite (rounds 1–2, as replay.py loads them)."""
    r1, r2 = R.suites()
    for suite in (r1, r2):
        for s in suite["settings"]:
            if s["name"] == name:
                return s, suite
    raise SystemExit(f"setting {name!r} is in neither round")


def live_config(name: str, pin: Path, key: str = "design") -> dict:
    """The setting's pilot config (validation.grid_config), checked against its stored pilot record."""
    s, suite = setting_of(name)
    seeds = int(design(key)["seeds"])
    cfg = V.grid_config(s, "pilot", seeds, root=pin, suite=suite)
    stored = R.load(name, "pilot")
    want = (float(stored["budget"]), sorted(float(r) for r in stored["grid"]), int(stored["seeds"]))
    got = (float(cfg["budget"]), sorted(float(r) for r in cfg["grid"]), int(cfg["seeds"]))
    if want != got:
        raise SystemExit(f"{name}: the built config (B, grid, seeds) {got} differs from the stored pilot grid's {want}")
    cfg["name"] = f"live49-{name}" + ("" if key == "design" else f"-{key.replace('_', '-')}")
    return cfg


def command(config_file: Path, out_dir: Path, pin: Path, key: str = "design") -> list[str]:
    d = design(key)
    lad = d["ladder"]
    return [sys.executable, "-m", V._cli_module(pin), "pilot", str(config_file), "--out", str(out_dir), "--quiet",
            "--format", "json", "--engine", d["engine"], "--workers", str(d["workers"]),
            "--adaptive-policy", d["policy"], "--halving-eta", str(lad["eta"]), "--halving-rungs", str(lad["rungs"]),
            "--halving-keep", str(lad["keep"])]


def compact(p: dict) -> dict:
    """A results.json pilot, floats at 6 digits, ``extra`` trimmed to what the scoring reads."""
    extra = p.get("extra") or {}
    keep = ("steps", "budget_halving", "pauses", "eval_flops", "software", "error")
    return V._round({**p, "extra": {k: extra[k] for k in keep if k in extra}})


def run_at_pin(cfg: dict, out_dir: Path, pin: Path, argv: Callable[[Path], list[str]], tag: str) -> tuple[dict, dict]:
    """``cfg`` written to ``out_dir``/config.yaml, ``argv(config_file)`` run from the pinned checkout ``pin``:
    its results.json and the record fields every live record shares (validation.provenance, the budget-halving
    record without its states, the compact pilots). A failed run stops here in one line; its storage keeps every
    finished stage, so the same command resumes it."""
    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    config_file = out_dir / "config.yaml"
    config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cmd = argv(config_file)
    t0 = time.time()
    # cwd = the pin, PYTHONPATH = the pin: the grid runs the pinned code (validation.run's reason)
    proc = subprocess.run(cmd, cwd=str(pin), env={**os.environ, "PYTHONPATH": str(pin)}, stdout=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"{tag}: race pilot ended with exit {proc.returncode}; its storage {out_dir} keeps every "
                         "finished stage (run the same command again)")
    res = json.loads((out_dir / "results.json").read_text())
    halving = {k: v for k, v in (res.get("budget_halving") or {}).items() if k != "states"}
    return res, {**V.provenance(res, commit=V._commit(pin), command=" ".join(["race", *cmd[3:]]),
                                wall_seconds=time.time() - t0),
                 "budget_halving": V._round(halving), "pilots": [compact(p) for p in res["pilots"]]}


def run_one(name: str, pin: Path, storage: Path, key: str = "design") -> Path:
    cfg = live_config(name, pin, key)
    _, shared = run_at_pin(cfg, storage / name, pin, lambda f: command(f, storage / name, pin, key), name)
    s, _ = setting_of(name)
    rec = {"setting": name, "round": s.get("round"), "design": design(key), "budget": cfg["budget"],
           "grid": cfg["grid"], "seeds": cfg["seeds"], **shared}
    return V.write_gz_json(record_path(name, key), rec)


# ---------------------------------------------------------------- score

def live_evidence(rec: dict) -> dict[str, Any]:
    """The live design's evidence, built as replay.evidence builds the halving design's: the kept pilots
    (reached B), the dropped ones at their last reading, the range at B over the kept ρ's measured ρ, the
    recommended ρ (best kept mean final reward), the compute in units of B, and the live diagnosis' regime."""
    from race.core.records import PilotResult

    pilots = [PilotResult.from_dict(p) for p in rec["pilots"] if p.get("status") == "complete"]
    full = [p for p in pilots if "budget_halving" not in p.extra]
    dropped = [p for p in pilots if "budget_halving" in p.extra]
    keep = sorted({p.rho_target for p in full})
    fm = {t: statistics.fmean(statistics.fmean(p.evals["reward"]) for p in full if p.rho_target == t) for t in keep}
    meas = {t: statistics.fmean(p.flops.rho for p in full if p.rho_target == t) for t in keep}
    best = max(keep, key=lambda t: fm[t])
    B = float(rec["budget"])
    return {"cost": sum(p.flops.total for p in pilots) / B, "pilots": full, "drift_pilots": full + dropped,
            "budget": B, "keep": keep, "rho_range": (min(meas.values()), max(meas.values())),
            "recommended": meas[best], "regime": live_regime(rec)}


def live_regime(rec: dict) -> str:
    """The live grid's regime: race.stats.regime.classify on its pilots (dropped ρ at their last reading), as
    the run's own diagnosis and validation.diagnosis read a grid."""
    return V.diagnosis(rec).primary.regime.value


def live_at(i: int, rec: dict) -> dict[str, Any]:
    """The live design at grid ``i``'s F, scored as replay.design_at scores the halving design."""
    from race.stats.drift import DriftError, range_for_pilots

    g = R.grids()[i]
    ev = live_evidence(rec)
    try:
        r = range_for_pilots(ev["drift_pilots"], target="reward", pilot_budget=ev["budget"], full_run_budget=g["F"],
                             rho_range=ev["rho_range"], recommended_rho=ev["recommended"],
                             constant_rate=g["constant"], population=R.loso_population(g["setting"]))
        (lo, hi), rho = r.rho_range, r.recommended_rho
    except DriftError:
        (lo, hi), rho = ev["rho_range"], ev["recommended"]
    rr = R.response(i)
    return {"cost": ev["cost"], "keep": ev["keep"], "regime": ev["regime"], "range": (lo, hi), "rho": rho,
            "width": hi - lo, "covered": V._within(rr.best_rho, lo, hi), "regret": rr.regret(rho)}


def rows(key: str = "design") -> list[dict[str, Any]]:
    """Per scored grid of every setting with a record of design ``key``: the live figures beside the replay's
    (the main design: the same design; the addendum: its nearest replay design and the flat grid)."""
    name = design(key)["name"]
    out = []
    for s in plan()["settings"]:
        rec = load_record(s["name"], key)
        if rec is None:
            continue
        for i, g in enumerate(R.grids()):
            if g["setting"] != s["name"] or not g["scored"]:
                continue
            live, rep = live_at(i, rec), R.design_at(i, name)
            d = live["regret"] - rep["regret"]
            out.append({"label": R.label(g), "best": R.response(i).best_rho, "live": live, "replay": rep,
                        "replay_keep": R.evidence(s["name"], name)["keep"], "full_regime": R.full_regime(i),
                        "flat": R.design_at(i, R.FLAT), "d_regret": d,
                        "match": live["covered"] == rep["covered"] and abs(d) <= MATCH_SE,
                        "wall_min": rec["wall_seconds"] / 60})
    return out


def _rng(r: tuple[float, float]) -> str:
    return f"{r[0]:.2f}–{r[1]:.2f}"


def _yn(x: bool) -> str:
    return "yes" if x else "no"


def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def _keep(ts: Sequence[float]) -> str:
    return ", ".join(f"{t:g}" for t in sorted(ts))


def _done(key: str) -> str:
    done = [s["name"] for s in plan()["settings"] if load_record(s["name"], key) is not None]
    return f"Settings run: {len(done)} of {len(plan()['settings'])} planned ({', '.join(done) or 'none'})."


def table_lines() -> list[str]:
    rs = rows()
    out = [_done("design"), "",
           "| grid | full-run best ρ | kept ρ: live; replay | range at F: live; replay | covered: live; replay "
           "| regret: live; replay (Δ) | compute (B): live; replay | regime: live; full runs | match |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lv, rp = r["live"], r["replay"]
        out.append(f"| {r['label']} | {r['best']:.2f} | {_keep(lv['keep'])}; {_keep(r['replay_keep'])} | "
                   f"{_rng(lv['range'])}; {_rng(rp['range'])} | {_yn(lv['covered'])}; {_yn(rp['covered'])} | "
                   f"{lv['regret']:.2f}; {rp['regret']:.2f} ({r['d_regret']:+.2f}) | {lv['cost']:.2f}; {rp['cost']:.2f} | "
                   f"{lv['regime']}; {r['full_regime']} | {_yn(r['match'])} |")
    if rs:
        out += ["", f"Over {len(rs)} grids: {sum(r['match'] for r in rs)} match (same coverage, regrets within "
                    f"{MATCH_SE:g} pooled SE); covered {sum(r['live']['covered'] for r in rs)} live, "
                    f"{sum(r['replay']['covered'] for r in rs)} replay; median regret "
                    f"{_med([r['live']['regret'] for r in rs]):.2f} live, {_med([r['replay']['regret'] for r in rs]):.2f} "
                    f"replay; median |Δ regret| {_med([abs(r['d_regret']) for r in rs]):.2f}; same kept ρ in "
                    f"{sum(sorted(r['live']['keep']) == sorted(r['replay_keep']) for r in rs)}; compute "
                    f"{_med([r['live']['cost'] for r in rs]):.2f} B live against {_med([r['replay']['cost'] for r in rs]):.2f} "
                    f"B replay (median)."]
    return out


def default_lines() -> list[str]:
    rs = rows("default_ladder")
    out = [_done("default_ladder"), "",
           "| grid | full-run best ρ | reached B: live; replay top 1 | range at F: live; top 1; flat | covered: live; "
           "top 1; flat | regret: live; top 1; flat | compute (B): live; top 1; flat | regime: live; full runs |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rs:
        lv, rp, fl = r["live"], r["replay"], r["flat"]
        out.append(f"| {r['label']} | {r['best']:.2f} | {_keep(lv['keep'])}; {_keep(r['replay_keep'])} | "
                   f"{_rng(lv['range'])}; {_rng(rp['range'])}; {_rng(fl['range'])} | {_yn(lv['covered'])}; "
                   f"{_yn(rp['covered'])}; {_yn(fl['covered'])} | {lv['regret']:.2f}; {rp['regret']:.2f}; "
                   f"{fl['regret']:.2f} | {lv['cost']:.2f}; {rp['cost']:.2f}; {fl['cost']:.2f} | "
                   f"{lv['regime']}; {r['full_regime']} |")
    if rs:
        out += ["", f"Over {len(rs)} grids: covered {sum(r['live']['covered'] for r in rs)} live, "
                    f"{sum(r['replay']['covered'] for r in rs)} top 1, {sum(r['flat']['covered'] for r in rs)} flat; "
                    f"median regret {_med([r['live']['regret'] for r in rs]):.2f} live, "
                    f"{_med([r['replay']['regret'] for r in rs]):.2f} top 1, {_med([r['flat']['regret'] for r in rs]):.2f} "
                    f"flat; compute {_med([r['live']['cost'] for r in rs]):.2f} B live (median)."]
    return out


def tables_text() -> str:
    sections = [("The replay's winning design, live (η 11, one rung, top half)", table_lines)]
    if any(load_record(s["name"], "default_ladder") for s in plan()["settings"]):
        sections.append(("Addendum: the default ladder until this check, live (η 3, B/9 and B/3, keep ci)", default_lines))
    return V.section_tables(sections)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "tables":
        return V.doc_command(argv[1:], tables_text, BEGIN, END, "research/scripts/live_design.py")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--pin", default=str(ROOT), help="the pinned checkout the grids run from")
    r.add_argument("--only", default=None, help="comma-separated settings (default: the plan's, in order)")
    r.add_argument("--design", default="design", choices=("design", "default_ladder"),
                   help="the plan's design, or its addendum (the default ladder until this check)")
    r.add_argument("--storage", default=None, help="default: the plan's (the addendum's for --design default_ladder)")
    sub.add_parser("score")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        key = args.design
        storage = Path(args.storage or (plan()["storage"] if key == "design" else plan()[key]["storage"]))
        names = args.only.split(",") if args.only else [s["name"] for s in plan()["settings"]]
        for name in names:
            if load_record(name, key) is not None:
                print(f"{name}: recorded", flush=True)
                continue
            print(f"{name}: running", flush=True)
            print(f"{name}: → {run_one(name, Path(args.pin), storage, key)}", flush=True)
        return 0
    sys.stdout.write(tables_text())
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
