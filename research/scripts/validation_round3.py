"""The third validation round (issue 48): the pilot design it scores, its freeze, and (after it) its scores.

    python research/scripts/validation.py --suite research/validation/round3.yaml status
    python research/scripts/validation.py --suite research/validation/round3.yaml queue --pin DIR
    python research/scripts/validation_round3.py design             # RACE's pilots per setting, from configs only
    python research/scripts/validation_round3.py freeze --rule C --drift C --probe C --rate C --design C

The batch (``research/validation/round3.yaml``) runs through round 1–2's machinery
(research/scripts/validation.py: a pinned checkout, storage outside the tree, compact records, sealed
kinds). What this module adds:

- **RACE's pilots per setting** (``design``): the user's config is the setting's base config with its
  overrides (its own pilot grid and seeds, as ``race init`` or a hand-written config gives them), the
  full run F of the suite, and ``race pilot --full-run F --design fit`` at the suite's share
  (race.run.sizing.size_pilots: the same function ``race pilot`` calls, held-out evaluation counted).
  It reads configs only: no run, sealed or not.
- **The freeze** (``freeze``): records once the commits of the regime rule, the drift model, the
  stability probe, the rate for F and the pilot design scored. Before it no sealed grid is read; after
  it a change is reported beside the frozen scores, never instead of them.

Invariant: nothing here opens a committed run of a sealed kind while the suite's ``freeze`` is null.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

FROZEN_KEYS = ("rule", "drift", "probe", "rate", "design")


def _v():
    import validation as v          # scripts/ is on sys.path when run as research/scripts/validation.py

    return v


def user_config(s: dict, suite: dict) -> Any:
    """The config a user of setting ``s`` runs ``race pilot`` on: the base config's own grid and seeds with the
    setting's overrides, and the full run F (a GridConfig)."""
    import yaml

    from race.config import presets
    from race.config.configfile import config_from_dict

    v = _v()
    raw = v.grid_config(s, "full10", 1, suite=suite)           # the base config with the overrides, at F
    base = dict(presets.DEFAULT) if s["base"] == "default" else yaml.safe_load((v.ROOT / s["base"]).read_text())
    raw.update(name=f"r3-{s['name']}-pilots", grid=list(base.get("grid", presets.DEFAULT["grid"])),
               seeds=int(base.get("seeds", presets.DEFAULT["seeds"])), full_run_budget=float(s["full_run"]))
    return config_from_dict(raw)


def design_rows(suite: dict) -> list[dict[str, Any]]:
    """Per setting: what ``race pilot --full-run F --design fit`` runs at the suite's share (or why none)."""
    from race.core.errors import RaceError
    from race.run.sizing import size_pilots

    rows = []
    for s in suite["settings"]:
        cfg = user_config(s, suite)
        row = {"setting": s["name"], "full_run": float(s["full_run"]), "grid": list(cfg.grid), "seeds": cfg.seeds}
        try:
            _, d = size_pilots(cfg, full_run=float(s["full_run"]), design="fit", share=float(suite["share"]))
            row.update(pilots=[tuple(p) for p in d["pilots"]], budget=d["budget"], factor=d["factor"],
                       eval_flops=d["eval_flops"], spent=d["spent"], why=d["why"])
        except RaceError as e:
            row.update(pilots=[], why=str(e))
        rows.append(row)
    return rows


def design_table(rows: list[dict[str, Any]]) -> str:
    out = ["| setting | F | config grid × seeds | RACE's pilots (ρ × seeds) | B per pilot | F / B | "
           "evaluation per pilot |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        grid = f"{', '.join(f'{x:g}' for x in r['grid'])} × {r['seeds']}"
        if not r["pilots"]:
            out.append(f"| {r['setting']} | {r['full_run']:.3g} | {grid} | none: the prior ρ 0.46 with the whole "
                       "compute | – | – | – |")
            continue
        count: dict[float, int] = {}
        for rho, _ in r["pilots"]:
            count[rho] = count.get(rho, 0) + 1
        pil = ", ".join(f"{rho:g}" + (f" ×{n}" if n > 1 else "") for rho, n in sorted(count.items()))
        out.append(f"| {r['setting']} | {r['full_run']:.3g} | {grid} | {pil} | {r['budget']:.3g} | "
                   f"{r['factor']:.3g} | {r['eval_flops']:.3g} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the scores (after the freeze)

BEGIN, END = "<!-- validation:round3:begin -->", "<!-- validation:round3:end -->"
N_BOOT = 2000


def load(name: str, kind: str) -> dict | None:
    """A committed complete record of the frozen round (None when absent); refused while the suite is sealed."""
    v = _v()
    if v.sealed(SUITE_OF["suite"], kind):
        raise SystemExit(f"round 3 is sealed: {kind} is not read before the freeze")
    return v.load_run(name, kind)


SUITE_OF: dict[str, dict] = {}


def runs(rec: dict, *, drop_collapsed: bool = False):
    """The runs of a record as (measured ρ, per-seed per-prompt final held-out rewards as a seeds × prompts array),
    per ρ target; collapsed runs (race.stats.instability's rule on their own checkpoints) left out on request."""
    import numpy as np

    import replay as R

    cells = R.cells(rec, prompts="final", drop_collapsed=drop_collapsed)
    meas = _v().measured_rho(rec)
    return {t: (meas[t], np.asarray(c, dtype=float)) for t, c in cells.items() if c}


def gain_ci(a, b, *, seed: int = 0) -> tuple[float, float, float]:
    """Mean of runs ``a`` minus mean of runs ``b`` (seeds × prompts arrays on the same prompts), and its 95 %
    bootstrap CI: seeds resampled on each side, prompts resampled jointly (both sides read the same prompts)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    P = a.shape[1]
    sa = rng.integers(0, a.shape[0], (N_BOOT, a.shape[0]))
    sb = rng.integers(0, b.shape[0], (N_BOOT, b.shape[0]))
    pi = rng.integers(0, P, (N_BOOT, P))
    ma = np.array([a[sa[k]][:, pi[k]].mean() for k in range(N_BOOT)])
    mb = np.array([b[sb[k]][:, pi[k]].mean() for k in range(N_BOOT)])
    lo, hi = np.quantile(ma - mb, [0.025, 0.975])
    return float(a.mean() - b.mean()), float(lo), float(hi)


def pooled_se(grid: dict) -> float:
    """The full-run grid's pooled SE of a point's mean (seed variance of per-seed means pooled over its points,
    over the best point's seed count: rounds 1–2's unit)."""
    import statistics

    per = {t: [float(x.mean()) for x in arr] for t, (_, arr) in grid.items()}
    dfs = sum(len(v) - 1 for v in per.values() if len(v) > 1)
    ss = sum((len(v) - 1) * statistics.variance(v) for v in per.values() if len(v) > 1)
    best = max(per, key=lambda t: statistics.fmean(per[t]))
    return (ss / dfs) ** 0.5 / len(per[best]) ** 0.5 if dfs else float("nan")


# F / P → the setting key that puts a setting in that ratio's runs (None: every setting), as round3.yaml's kinds say
RATIOS = {10: None, 30: "long_grid", 100: "longest_grid"}


def settings_at(suite: dict, ratio: int) -> list[dict]:
    return [s for s in suite["settings"] if RATIOS[ratio] is None or s.get(RATIOS[ratio])]


def share_cost(ratio: int) -> float:
    """What pilots at F / P = ``ratio`` cost the run, in pooled SEs (race.stats.design.pilot_value at a share of
    1 / ratio of F: 0.50 at 10, the figure the freeze wrote down)."""
    from race.stats.design import pilot_value

    return pilot_value(1.0 / ratio).cost


_SCORED: dict[tuple[str, int, bool], dict[str, Any] | None] = {}


def score_setting(s: dict, *, ratio: int = 10, drop_collapsed: bool = False) -> dict[str, Any] | None:
    """One setting's scores at F / P = ``ratio``, or None while its full-run grid at that ratio is not committed
    (worked out once per process: the score tables and the targets read the same rows)."""
    key = (s["name"], ratio, drop_collapsed)
    if key not in _SCORED:
        _SCORED[key] = _score_setting(s, ratio=ratio, drop_collapsed=drop_collapsed)
    return _SCORED[key]


def _score_setting(s: dict, *, ratio: int, drop_collapsed: bool) -> dict[str, Any] | None:
    from race.stats.instability import learned

    v = _v()
    full, prior, onp = (load(s["name"], f"{k}{ratio}") for k in ("full", "prior", "onpolicy"))
    if full is None:
        return None
    grid = runs(full, drop_collapsed=drop_collapsed)
    got = learned(v.pilots_of(full), "reward")
    best = max(grid, key=lambda t: grid[t][1].mean())
    se = pooled_se(grid)
    row = {"setting": s["name"], "learned": bool(got and got[0]), "best_target": best, "best_rho": grid[best][0],
           "best": float(grid[best][1].mean()), "se": se, "collapsed": sum(v.collapses(full).values()),
           "runs": sum(len(a) for _, a in grid.values()),
           "wall_full": run_wall(full)}
    if prior is None or onp is None:
        return row
    # with collapsed runs left out a baseline may have no run left: its gains are then undefined (None), not 0
    pr = next(iter(runs(prior, drop_collapsed=drop_collapsed).values()), (None, None))[1]
    op = next(iter(runs(onp, drop_collapsed=drop_collapsed).values()), (None, None))[1]
    row["prior_rho"] = next(iter(v.measured_rho(prior).values()))
    row["onpolicy_rho"] = next(iter(v.measured_rho(onp).values()))
    row["collapsed_prior"] = sum(v.collapses(prior).values())
    row["collapsed_onpolicy"] = sum(v.collapses(onp).values())
    # RACE's run is the prior's (no pilots fit); "oracle": the best full-run point at F against the prior at C
    row["over_onpolicy"] = gain_ci(pr, op) if pr is not None and op is not None else None
    row["oracle"] = gain_ci(grid[best][1], pr, seed=1) if pr is not None else None
    row["paid"] = paid_points(grid, pr, se, share_cost(ratio)) if pr is not None else None
    return row


def paid_points(grid: dict, prior, se: float, cost: float) -> list[float]:
    """The measured ρ of the full-run points whose mean beats the prior at C by more than the pilots' cost
    (``cost`` pooled SEs), lowest first: where a pilot grid's answer had to land to pay for itself (none: nowhere)."""
    return sorted(rho for rho, arr in grid.values() if se == se and (arr.mean() - prior.mean()) > cost * se)


def run_wall(rec: dict) -> float:
    """Mean wall seconds of one run of a record (the sum of its phases: setup, rollout, reward, update, sync,
    evaluation, checkpoints), on the queue's busy cores."""
    walls = [sum(p["wall_seconds"].values()) for p in rec["pilots"] if isinstance(p.get("wall_seconds"), dict)]
    return sum(walls) / len(walls) if walls else float("nan")


def _ci(g: tuple[float, float, float] | None, se: float) -> str:
    if g is None:
        return "— (no run of a baseline left)"
    d, lo, hi = g
    z = d / se if se == se and se > 0 else float("nan")
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] ({z:+.2f} SE)"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _z(g: tuple[float, float, float], se: float) -> float:
    return g[0] / se if se == se and se > 0 else float("nan")


def _row_line(s: dict, r: dict | None) -> str:
    if r is None:
        return f"| {s['name']} | full-run grid not run yet | | | | | | |"
    if "over_onpolicy" not in r:
        return (f"| {s['name']} | {'yes' if r['learned'] else 'no'} | {r['best_rho']:.3f} ({r['best']:.3f}) | "
                f"baselines not run yet | | | | {r['collapsed']} · – · – |")
    paid = r.get("paid")
    where = "— (no run of a baseline left)" if r["oracle"] is None else (
        ", ".join(f"{rho:.3f}" for rho in paid) if paid else "nowhere")
    return (f"| {s['name']} | {'yes' if r['learned'] else 'no: reported apart'} | {r['best_rho']:.3f} "
            f"({r['best']:.3f}) | {r['prior_rho']:.3f} · {r['onpolicy_rho']:.3f} | "
            f"{_ci(r['over_onpolicy'], r['se'])} | {_ci(r['oracle'], r['se'])} | {where} | "
            f"{r['collapsed']} · {r['collapsed_prior']} · {r['collapsed_onpolicy']} |")


def _counted(rows: list[dict | None]) -> list[dict]:
    """The rows a ratio's summary and targets count: settings that learned, with both gains defined."""
    return [r for r in rows if r and r.get("over_onpolicy") is not None and r.get("oracle") is not None
            and r["learned"]]


def _centre(z: list[float], lo: float, hi: float, cov: float, name: str = "") -> str:
    """The median with its order-statistic interval; one setting's own figure where there is only one."""
    if len(z) == 1:
        return f"{z[0]:+.2f} SEs (one setting: no median or interval)"
    return f"median {_median(z):+.2f} SEs ({name}{lo:+.2f} to {hi:+.2f}, coverage {cov:.2f})"


def _summary(rows: list[dict | None], ratio: int) -> list[str]:
    v = _v()
    out = []
    scored = _counted(rows)
    undefined = [r["setting"] for r in rows if r and "over_onpolicy" in r and r["learned"]
                 and (r["over_onpolicy"] is None or r["oracle"] is None)]
    if undefined:
        out += ["", f"Left out of the summary: {', '.join(undefined)} (every run of a baseline collapsed: no gain "
                "to score without collapsed runs)."]
    if not scored:
        return out
    over = [_z(r["over_onpolicy"], r["se"]) for r in scored]
    orc = [_z(r["oracle"], r["se"]) for r in scored]
    lo, hi, cov = v.median_ci(over)
    lo2, hi2, cov2 = v.median_ci(orc)
    cost = share_cost(ratio)
    return out + ["", f"Over the {len(scored)} scored setting{'s' if len(scored) != 1 else ''} that learned: RACE's run beats on-policy in "
                  f"{sum(r['over_onpolicy'][1] > 0 for r in scored)} (CI above 0) and loses in "
                  f"{sum(r['over_onpolicy'][2] < 0 for r in scored)} (CI below 0); "
                  f"{_centre(over, lo, hi, cov, 'order-statistic interval ')}. Perfect pilots would "
                  f"have paid (best at F above the prior at C, CI above 0) in {sum(r['oracle'][1] > 0 for r in scored)}"
                  f", not in {sum(r['oracle'][2] < 0 for r in scored)} (CI below 0); {_centre(orc, lo2, hi2, cov2)}. "
                  f"Declining to pilot was right (the prior's "
                  f"regret below the {cost:.2f} SEs pilots at F / P = {ratio} cost the run) in "
                  f"{sum(z < cost for z in orc)} of {len(scored)}."]


def score_lines(suite: dict, ratio: int = 10) -> list[str]:
    """Round 3's tables at F / P = ``ratio``: per setting (all runs; collapsed runs left out), then over the batch."""
    out = []
    for drop in (False, True):
        chosen = settings_at(suite, ratio)
        rows = [score_setting(s, ratio=ratio, drop_collapsed=drop) for s in chosen]
        out += ["", f"**F / P = {ratio}, {'collapsed runs left out' if drop else 'all runs'}** (final held-out reward "
                "on the 500 final-evaluation prompts; ρ measured; gains with 95 % bootstrap CIs over seeds and "
                "prompts, and in the full-run grid's pooled SEs):", "",
                "| setting | learned | full-run best ρ (reward) | prior ρ · on-policy ρ | RACE (= prior) − on-policy "
                "at C | best at F − prior at C (what perfect pilots could win) | ρ where pilots would have paid | "
                "collapsed (grid · prior · on-policy) |", "|---|---|---|---|---|---|---|---|"]
        out += [_row_line(s, r) for s, r in zip(chosen, rows)]
        out += _summary(rows, ratio)
    return out


def tables(suite: dict) -> str:
    """Every table of round 3's section of docs/validation.md, from the committed records."""
    SUITE_OF["suite"] = suite
    head = [f"Frozen {suite['freeze']['date']} (rule {suite['freeze']['rule']}, drift {suite['freeze']['drift']}, "
            f"probe {suite['freeze']['probe']}, rate {suite['freeze']['rate']}, design {suite['freeze']['design']}). "
            "RACE ran no pilots on any setting (P = 0: its pilot design's wall time is 0 s against the full runs' "
            "below), so its run at C is the prior's, its net gain over the prior is 0 by construction, and it has "
            "no range or regime at F to score.", "",
            "| setting | F / P | full-run grid | prior at C | on-policy at C | mean wall per full run |",
            "|---|---|---|---|---|---|"]
    for ratio in RATIOS:
        for s in settings_at(suite, ratio):
            head.append(_status_line(s, ratio))
    lines = head
    for ratio in RATIOS:
        lines += score_lines(suite, ratio)
    lines += target_lines(suite)
    return "\n".join(lines) + "\n"


def _scored(suite: dict, ratio: int) -> list[dict]:
    """The rows of a ratio's settings that its summary counts, all runs kept (``_counted``)."""
    return _counted([score_setting(s, ratio=ratio) for s in settings_at(suite, ratio)])


def _target_row(ratio: int, rows: list[dict]) -> list[str]:
    """Issue 48's targets at one ratio: (target, measured, held) cells, in the issue's order."""
    over = [_z(r["over_onpolicy"], r["se"]) for r in rows]
    regret = [_z(r["oracle"], r["se"]) for r in rows]
    sep = [r for r in rows if r["over_onpolicy"][1] > 0 or r["over_onpolicy"][2] < 0]
    wins = sum(r["over_onpolicy"][1] > 0 for r in rows)
    heavy = [r["setting"] for r in rows if r["runs"] and r["collapsed"] / r["runs"] >= 1 / 3]
    n = len(rows)
    gain_ok = bool(sep) and wins / len(sep) >= 0.8 and _median(over) >= 1
    return [
        f"| {ratio} | net gain over on-policy > 0 in ≥ 80 % of the settings where they separate, median ≥ +1 SE | "
        f"{wins} won of {len(sep)} separated ({n} scored); median {_median(over):+.2f} SEs | "
        f"{'met' if gain_ok else 'missed' if sep else 'no setting separates'} |",
        f"| {ratio} | net gain over the no-pilot prior ≥ 0 in ≥ 2/3, median > 0 | 0 in all {n} (RACE's run is the "
        "prior's) | missed: median 0 |",
        f"| {ratio} | best ρ in the range at F ≥ 80 %, median width ≤ 0.15 | no range stated (no pilots) | missed |",
        f"| {ratio} | median regret ≤ 0.5 SEs (best at F − RACE's run at C) | {_median(regret):+.2f} SEs | "
        f"{'met' if _median(regret) <= 0.5 else 'missed'} |",
        f"| {ratio} | same regime at F ≥ 0.9 where the full runs are conclusive | no regime stated (no pilots) | "
        "missed |",
        f"| {ratio} | every setting with ≥ 1/3 collapsed full runs flagged, ≤ 20 % false alarms | "
        f"{len(heavy)} such ({', '.join(heavy) or 'none'}); 0 flagged (no pilots, no probe) | "
        f"{'missed' if heavy else 'met: nothing to flag'} |",
        f"| {ratio} | P ≤ 10 % of C | P = 0 | met |"]


def target_lines(suite: dict) -> list[str]:
    """Issue 48's targets against each ratio's scored settings (all runs), once a ratio has any."""
    out = ["", "**Issue 48's targets** (frozen code; per ratio, over its scored settings that learned, all runs):", "",
           "| F / P | target | measured | held |", "|---|---|---|---|"]
    for ratio in RATIOS:
        rows = _scored(suite, ratio)
        out += _target_row(ratio, rows) if rows else [f"| {ratio} | every target | no setting scored yet | – |"]
    return out


def _status_line(s: dict, ratio: int) -> str:
    """Which of a setting's runs at F / P = ``ratio`` are committed (a full-run grid as ρ × seeds)."""
    v = _v()
    have = {k: v.data_path(s["name"], f"{k}{ratio}").is_file() for k in ("full", "prior", "onpolicy")}
    full = load(s["name"], f"full{ratio}") if have["full"] else None
    if full is not None:
        grid = runs(full)
        shape = f"{len(grid)} ρ × {max(len(a) for _, a in grid.values())} seeds"
    else:
        shape = "running" if v.data_path(s["name"], f"full{ratio}", partial=True).is_file() else "to run"
    wall = f"{run_wall(full):.0f} s" if full else "–"
    return (f"| {s['name']} | {ratio} | {shape} | {'5 seeds' if have['prior'] else 'to run'} | "
            f"{'5 seeds' if have['onpolicy'] else 'to run'} | {wall} |")


def freeze(suite_path: Path, commits: dict[str, str], *, date: str | None = None) -> dict:
    """Write the suite's ``freeze`` mapping once (the commits of ``FROZEN_KEYS``), as round 2's freeze does;
    refuse a second freeze."""
    import validation_round2 as v2

    return v2.freeze(suite_path, date=date, **{k: commits.get(k) for k in FROZEN_KEYS})


def main(argv: list[str] | None = None) -> int:
    import argparse

    v = _v()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=str(v.ROOT / "research" / "validation" / "round3.yaml"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("design", help="RACE's pilots per setting (configs only; nothing sealed is read)")
    t = sub.add_parser("tables", help="the scores (after the freeze), printed or checked / written into a doc")
    t.add_argument("--check", default=None)
    t.add_argument("--write", default=None)
    fz = sub.add_parser("freeze", help="record the commits of the rule, drift, probe, rate and design scored")
    for k in FROZEN_KEYS:
        fz.add_argument(f"--{k}", required=True)
    args = ap.parse_args(argv)
    suite = v.load_suite(Path(args.suite))
    if args.cmd == "design":
        sys.stdout.write(design_table(design_rows(suite)))
        return 0
    if args.cmd == "tables":
        if not suite.get("freeze"):
            raise SystemExit("round 3 is sealed: its scores come after `freeze`")
        v.RUNS = v.ROOT / suite["runs"]
        text = tables(suite)
        return v.apply_tables(text, {(BEGIN, END): text}, check=args.check, write=args.write, suite_arg=args.suite,
                              script="research/scripts/validation_round3.py")
    print(freeze(Path(args.suite), {k: getattr(args, k) for k in FROZEN_KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
