"""Does a verdict survive a rerun? (issue 54) Reruns of a pilot grid with other seed sets.

A rerun is a grid config (the embedded default, or a stored setting of the validation rounds)
with ``first_seed`` set, so its seeds are first_seed … first_seed + seeds − 1. It runs as

    python -m race pilot CONFIG --out DIR --quiet --format json --workers 1

from this checkout (OMP_NUM_THREADS=1), stored under /work/reruns-storage/NAME (rerunning the same
command resumes: finished pilots are kept), and leaves two files in research/reruns/:

- NAME.json: what the grid said (regime, ρ range, recommended ρ, confidence, support), its
  per-point means, the commit, the software versions and the command;
- NAME.pilots.json.gz: its pilots, compact (no reward curves), enough to classify the grid again.

    python research/scripts/reruns.py run default --first-seed 3
    python research/scripts/reruns.py queue default:3 default:6 r2:small:3 --commit
    python research/scripts/reruns.py table            # agreement and reliability, committed data only

Settings: ``default`` (race.config.presets.DEFAULT), ``r1:NAME`` (research/validation/suite.yaml) and
``r2:NAME`` (research/validation/round2.yaml), whose pilot grids are built by
research/scripts/validation.py's ``grid_config(setting, "pilot", 3)`` (read only). Rerun 0 of each
setting is its committed run: docs/runs/default.results.json.gz for ``default``, the rounds'
pilot.json.gz for the others.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gzip
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "research" / "scripts"))
from rerun_calibration import (MIN_BIN, N_BOOT, bin_table, bins_of, calibration, calibration_lines,  # noqa: E402
                               fixed_bins, reliability_lines, rerun_agreement, synthetic)

OUT = ROOT / "research" / "reruns"
STORAGE = Path(os.environ.get("RACE_RERUNS_STORAGE", "/work/reruns-storage"))
SUITES = {"r1": ROOT / "research" / "validation" / "suite.yaml", "r2": ROOT / "research" / "validation" / "round2.yaml"}
COMMITTED = {"r1": ROOT / "research" / "validation" / "runs", "r2": ROOT / "research" / "validation" / "round2" / "runs"}
DEFAULT_RUN = ROOT / "docs" / "runs" / "default.results.json.gz"


def _validation():
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation  # noqa: E402  (read only: grid_config, compact_pilot)

    return validation


def setting_config(setting: str) -> dict[str, Any]:
    """The pilot grid of ``setting`` as a config mapping (seeds 3, from seed 0)."""
    if setting == "default":
        from race.config import presets

        return json.loads(json.dumps(presets.DEFAULT))
    rnd, _, name = setting.partition(":")
    if rnd not in SUITES or not name:
        raise SystemExit(f"unknown setting {setting!r}: expected default, r1:NAME or r2:NAME")
    V = _validation()
    suite = V.load_suite(SUITES[rnd])
    return V.grid_config(V.setting(suite, name), "pilot", 3, suite=suite)


def rerun_name(setting: str, first_seed: int) -> str:
    return f"{setting.replace(':', '-')}-s{first_seed}"


def software() -> dict[str, str]:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for pkg in ("torch", "transformers", "peft", "numpy"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _commit() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def _dirty() -> list[str]:
    """Files of the package with uncommitted changes when the rerun started (a shared tree)."""
    r = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "race"], capture_output=True, text=True)
    return sorted(line[3:] for line in r.stdout.splitlines() if line.strip())


def _round(x: Any, digits: int = 6) -> Any:
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, (list, tuple)):
        return [_round(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    return x


def point_means(pilots: list[dict], target: str = "reward") -> dict[str, dict[str, Any]]:
    """ρ target → mean held-out score over its complete seeds, and the per-seed means."""
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(pilots, key=lambda p: (p["rho_target"], p["seed"])):
        if p.get("status") != "complete" or target not in (p.get("evals") or {}):
            continue
        v = p["evals"][target]
        row = out.setdefault(f"{float(p['rho_target']):g}", {"seeds": {}})
        row["seeds"][str(p["seed"])] = round(sum(v) / len(v), 5)
    for row in out.values():
        row["mean"] = round(sum(row["seeds"].values()) / len(row["seeds"]), 5)
    return out


def verdict_fields(diag: dict) -> dict[str, Any]:
    """The primary verdict of a diagnosis dict (CLI JSON or results.json's ``diagnosis``)."""
    v = (diag.get("verdicts") or {}).get(diag.get("primary_target", "reward"), {})
    fits = v.get("fits") or {}
    out = {"regime": diag.get("regime", v.get("regime")), "rho_range": _round(diag.get("rho_range", v.get("rho_range")), 4),
           "recommended_rho": _round(diag.get("recommended_rho"), 4), "confidence": diag.get("confidence"),
           "support": v.get("support") or fits.get("support"), "open_side": diag.get("open_side")}
    if "bootstrap_share" in fits:       # since issue 54 the stated confidence may be the rerun confidence
        out.update(bootstrap_share=fits["bootstrap_share"], confidence_method=fits.get("confidence_method"))
    return out


# ---------------------------------------------------------------- running

def run(setting: str, first_seed: int, *, name: str | None = None, storage: Path = STORAGE,
        extra_config: dict | None = None) -> Path:
    """Run (or resume) one rerun; write research/reruns/NAME.json and NAME.pilots.json.gz."""
    import yaml

    name = name or rerun_name(setting, first_seed)
    cfg = {**setting_config(setting), **(extra_config or {}), "first_seed": int(first_seed)}
    cfg["name"] = f"rerun-{name}"
    folder = storage / name
    folder.mkdir(parents=True, exist_ok=True)
    cfg_path = folder / "config.yaml"
    if not cfg_path.exists():
        cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = folder / "run"
    argv = [sys.executable, "-m", "race", "pilot", str(cfg_path), "--out", str(out), "--quiet",
            "--format", "json", "--workers", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    commit, dirty = _commit(), _dirty()
    t0 = time.time()
    with open(folder / "stderr.log", "a") as err:
        r = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"{name}: race pilot exited {r.returncode} (see {folder / 'stderr.log'})")
    diag = json.loads(r.stdout)
    results = json.loads((out / "results.json").read_text())
    V = _validation()
    pilots = [V.compact_pilot({k: v for k, v in p.items() if k != "curve"}) for p in results["pilots"]]
    versions = sorted({json.dumps((p.get("extra") or {}).get("software"), sort_keys=True) for p in pilots
                       if (p.get("extra") or {}).get("software")})
    record = {"name": name, "setting": setting, "first_seed": int(first_seed), "seeds": cfg["seeds"],
              "seed_ids": list(range(int(first_seed), int(first_seed) + int(cfg["seeds"]))),
              "budget": float(cfg["budget"]), "grid": cfg["grid"], **verdict_fields(diag),
              "unstable_pilots": [[u.get("rho_target"), u.get("seed")] for u in (diag.get("stability") or {}).get("unstable", [])
                                  if isinstance(u, dict)],
              "points": point_means(pilots), "commit": commit, "uncommitted": dirty, "software": software(),
              "pilot_software": [json.loads(v) for v in versions],
              "command": " ".join(shlex.quote(a) for a in ["OMP_NUM_THREADS=1", "python", *argv[1:]]),
              "made_by": f"python research/scripts/reruns.py run {setting} --first-seed {first_seed}",
              "wall_seconds": round(wall, 1),
              "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    with gzip.open(OUT / f"{name}.pilots.json.gz", "wt", encoding="utf-8") as fh:
        json.dump(pilots, fh, separators=(",", ":"))
    return path


def git_commit(paths: list[Path], message: str) -> None:
    rel = [str(p.relative_to(ROOT)) for p in paths]
    for _ in range(30):
        if not (ROOT / ".git" / "index.lock").exists():
            a = subprocess.run(["git", "-C", str(ROOT), "add", *rel], capture_output=True, text=True)
            if a.returncode == 0:
                c = subprocess.run(["git", "-C", str(ROOT), "commit", "-q", "-m", message, "--", *rel],
                                   capture_output=True, text=True)
                if c.returncode == 0:
                    return
        time.sleep(2)
    print(f"could not commit {rel}", file=sys.stderr)


# ---------------------------------------------------------------- reading

def committed_records() -> list[dict]:
    """Every rerun record in research/reruns/, plus rerun 0 of each of their settings (the
    committed run, classified as it was stated); ``default`` has two: docs/runs' (the README's)
    and round 1's `default` pilot grid (the same config and seeds 0–2, transformers 5.19.0, run
    at an older commit, commit 84614f2, before the lockstep engine: another noise draw)."""
    recs = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]
    for r in recs:                      # a record from before issue 54 stated the bootstrap share as its confidence
        r.setdefault("bootstrap_share", r["confidence"])
    settings = sorted({r["setting"] for r in recs})
    for s in settings:
        zero = rerun_zero(s)
        if zero is not None:
            recs.append(zero)
        if s == "default":                  # round 1's `default` pilot grid: the same grid and seeds, an older commit
            other = rerun_zero("r1:default")
            if other is not None:
                recs.append({**other, "setting": "default", "name": "r1-default-s0-committed"})
    return recs


def rerun_zero(setting: str) -> dict | None:
    if setting == "default":
        d = json.load(gzip.open(DEFAULT_RUN, "rt"))
        pilots, diag, sw = d["pilots"], d["diagnosis"], (d["pilots"][0].get("extra") or {}).get("software")
        command = "race pilot (the embedded default grid; README's first run)"
    else:
        rnd, _, name = setting.partition(":")
        path = COMMITTED[rnd] / name / "pilot.json.gz"
        if not path.is_file():
            return None
        d = json.load(gzip.open(path, "rt"))
        pilots, command = d["pilots"], d.get("command")
        sw = (pilots[0].get("extra") or {}).get("software")
        diag = _classify_dict(pilots)
    return {"name": f"{setting.replace(':', '-')}-s0-committed", "setting": setting, "first_seed": 0, "seeds": 3,
            **verdict_fields(diag), "points": point_means(pilots), "software": sw, "command": command,
            "committed_run": True, "_pilots": pilots}


def _classify_dict(pilots: list[dict]) -> dict:
    """The diagnosis of a committed grid as it was stated: its confidence the bootstrap share (the
    rule's number before the rerun confidence, which ``rescore`` adds beside it)."""
    from race.core.records import PilotResult
    from race.stats.regime import classify

    ps = [PilotResult.from_dict(p) for p in pilots if p.get("status") == "complete"]
    return classify(ps, primary_target="reward", n_boot=N_BOOT, seed=0, rerun_confidence=False).to_dict()


def _record_pilots(r: dict) -> list | None:
    """A record's complete pilots: its own (``_pilots``), else its committed pilots file; None without either."""
    from race.core.records import PilotResult

    if "_pilots" in r:
        return [PilotResult.from_dict(p) for p in r["_pilots"] if p.get("status") == "complete"]
    if (OUT / f"{r['name']}.pilots.json.gz").exists():
        return load_pilots(r["name"])
    return None


def rescore(recs: list[dict]) -> None:
    """Each record classified again from its pilots with the current rule: ``bootstrap_share`` (the
    confidence as the rule stated it before issue 54's fix) and ``rerun_confidence`` (the predicted
    rerun agreement, race.stats.regime.rerun_confidence), and ``regime_now`` (the rule is unchanged,
    so it should be ``regime``)."""
    from race.stats.regime import classify

    for r in recs:
        ps = _record_pilots(r)
        if ps is None:
            continue
        v = classify(ps, primary_target="reward", n_boot=N_BOOT, seed=0, rerun_confidence=True).primary
        r.update(regime_now=v.regime.value, bootstrap_share=v.fits["bootstrap_share"],
                 rerun_confidence=v.fits["rerun_confidence"])


def reliability(recs: list[dict], key: str = "bootstrap_share") -> tuple[list[dict], list[dict]]:
    """Per verdict: stated confidence c (``key``) and its observed agreement (the share of the *other*
    reruns of its setting that state the same regime); bins of ≥ MIN_BIN verdicts by c. The default is
    the bootstrap share, the confidence stated before issue 54 (``committed_records`` gives every record
    one)."""
    by: dict[str, list[dict]] = {}
    for r in recs:
        by.setdefault(r["setting"], []).append(r)
    rows = []
    for s, rs in by.items():
        for r in rs:
            others = [o for o in rs if o is not r]
            if not others:
                continue
            agree = sum(o["regime"] == r["regime"] for o in others) / len(others)
            rows.append({"setting": s, "name": r["name"], "regime": r["regime"], "confidence": r[key],
                         "agreement": agree})
    rows.sort(key=lambda x: x["confidence"])
    return rows, [{**b, "gap": b["observed"] - b["stated"]} for b in bins_of(rows, "confidence")]


def add_predicted(recs: list[dict]) -> None:
    """Each record's predicted rerun agreement (``rerun_agreement``, unwidened: the candidates of
    research/reruns/synthetic.md), from its pilots."""
    for r in recs:
        ps = _record_pilots(r)
        if ps is None:
            continue
        r.update({k: v for k, v in rerun_agreement(ps, unwiden=True).items() if k.startswith("predicted")})


def _reliability_sections(recs: list[dict], *, predicted: bool) -> list[str]:
    """``table``'s reliability sections: the stated confidence, the rerun confidence where the records
    have it, and (``predicted``) the predicted-agreement candidates, each against the observed agreement."""
    lines: list[str] = []
    rows, bins = reliability(recs)
    lines.append(f"## Reliability: stated confidence vs agreement with the other runs of the setting "
                 f"({len(rows)} verdicts, bins of ≥ {MIN_BIN})")
    lines.append("| confidence bin | verdicts | mean stated | observed agreement | gap |")
    lines.append("|---|---|---|---|---|")
    for b in bins:
        lines.append(f"| {b['lo']:.2f}–{b['hi']:.2f} | {b['n']} | {b['stated']:.3f} | {b['observed']:.3f} | "
                     f"{b['gap']:+.3f} |")
    if rows:
        c = sum(x["confidence"] for x in rows) / len(rows)
        a = sum(x["agreement"] for x in rows) / len(rows)
        lines.append(f"| all | {len(rows)} | {c:.3f} | {a:.3f} | {a - c:+.3f} |")
    scored = [r for r in recs if "rerun_confidence" in r]
    rerun_rows = reliability(scored, "rerun_confidence")[0] if scored else []
    if rerun_rows:
        lines += ["", "## Reliability of the rerun confidence (race.stats.regime.rerun_confidence, the collapse "
                      "mixture of race.stats.confidence, recomputed from each run's pilots; its floor was chosen "
                      "leave-one-setting-out on these runs: research/scripts/rerun_models.py loso)",
                  *reliability_lines(rerun_rows, "confidence", f"rerun confidence vs agreement ({len(rerun_rows)} verdicts)")[1:]]
    lines += _fixed_bin_sections(rows, rerun_rows)
    if predicted:
        by_name = {r["name"]: r for r in recs}
        for key in ("predicted_agreement", "predicted_rule", "predicted_gate"):
            part = [{**row, key: by_name[row["name"]][key]} for row in rows if key in by_name[row["name"]]]
            if part:
                lines += ["", *reliability_lines(part, key, f"{key} (unwidened) vs observed agreement")]
    return lines


def _fixed_bin_sections(rows: list[dict], rerun_rows: list[dict]) -> list[str]:
    """Both confidences (``reliability`` rows of the bootstrap share and of the rerun confidence) in
    reliability-diagram bins 0.1 wide (issue 54's target: within 0.1 of the observed agreement in every
    bin of ≥ MIN_BIN verdicts; smaller bins are listed, not judged)."""
    out = []
    parts = [("bootstrap share (the confidence stated before issue 54)", rows),
             ("rerun confidence (the stated confidence since issue 54)", rerun_rows)]
    for title, part in (p for p in parts if p[1]):
        bins = fixed_bins(part, "confidence")
        judged = [b for b in bins if b["n"] >= MIN_BIN]
        worst = max((abs(b["observed"] - b["stated"]) for b in judged), default=float("nan"))
        within = sum(abs(b["observed"] - b["stated"]) <= 0.1 for b in judged)
        out += ["", *bin_table(part, "confidence", f"{title} in bins 0.1 wide ({len(part)} verdicts): "
                                                   f"{within} of {len(judged)} bins of ≥ {MIN_BIN} within 0.1, "
                                                   f"worst {worst:.3f}", bins, digits=1)]
    return out


def table(recs: list[dict], *, predicted: bool = False) -> str:
    lines = []
    rescore(recs)
    if predicted:
        add_predicted(recs)
    by: dict[str, list[dict]] = {}
    for r in recs:
        by.setdefault(r["setting"], []).append(r)
    for s in sorted(by):
        rs = sorted(by[s], key=lambda r: r["first_seed"])
        counts = Counter(r["regime"] for r in rs)
        mode, k = counts.most_common(1)[0]
        fresh = [r for r in rs if not r.get("committed_run")]
        kf = sum(r["regime"] == mode for r in fresh)
        nz = len(rs) - len(fresh)
        lines.append(f"## {s}: {len(rs)} runs ({len(fresh)} reruns{f' + {nz} committed' if nz else ''}); most common regime "
                     f"{mode} in {k}/{len(rs)} (reruns: {kf}/{len(fresh)}); "
                     + ", ".join(f"{g} {n}" for g, n in counts.most_common()))
        if predicted:
            lines.append("| run | seeds | regime | ρ range | confidence (stated) | rerun confidence | predicted agreement "
                         "| means by ρ | transformers |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
        else:
            lines.append("| run | seeds | regime | ρ range | confidence (stated) | rerun confidence | means by ρ | transformers |")
            lines.append("|---|---|---|---|---|---|---|---|")
        for r in rs:
            rng = r.get("rho_range") or [None, None]
            rng_s = f"[{rng[0]:.2f}, {rng[1]:.2f}]" if rng and rng[0] is not None else "—"
            means = " / ".join(f"{v['mean']:.4f}" for _, v in sorted(r["points"].items(), key=lambda kv: float(kv[0])))
            sw = r.get("software") or {}
            seeds = f"{r['first_seed']}–{r['first_seed'] + r.get('seeds', 3) - 1}"
            pred = f" {r['predicted_agreement']:.3f} |" if predicted and "predicted_agreement" in r else (" — |" if predicted else "")
            now = f"{r['rerun_confidence']:.3f}" if "rerun_confidence" in r else "—"
            if r.get("regime_now", r["regime"]) != r["regime"]:
                now += f" (now {r['regime_now']})"
            lines.append(f"| {r['name']} | {seeds} | {r['regime']} | "
                         f"{rng_s} | {r['confidence']:.3f} | {now} |{pred} {means} | {sw.get('transformers', '?')} |")
        lines.append("")
    lines += _reliability_sections(recs, predicted=predicted)
    return "\n".join(lines)


# ---------------------------------------------------------------- paired seeds

def load_pilots(name: str) -> list:
    from race.core.records import PilotResult

    with gzip.open(OUT / f"{name}.pilots.json.gz", "rt", encoding="utf-8") as fh:
        return [PilotResult.from_dict(p) for p in json.load(fh) if p.get("status") == "complete"]


def _seed_deviation_pairs(runs: list[list], grid: list[float], score: Any) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """For each pair of grid points (i, j): every seed's (deviation at i, deviation at j) from the point
    means of its own rerun, pooled over ``runs`` (``pairing``'s correlation across ρ)."""
    pairs: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for ps in runs:
        by = {(p.rho_target, p.seed): score(p) for p in ps}
        seeds = sorted({p.seed for p in ps})
        pm = {r: np.mean([by[(r, s)] for s in seeds if (r, s) in by]) for r in grid}
        for s in seeds:
            for i in range(len(grid)):
                for j in range(i + 1, len(grid)):
                    if (grid[i], s) in by and (grid[j], s) in by:
                        pairs.setdefault((i, j), []).append((by[(grid[i], s)] - pm[grid[i]], by[(grid[j], s)] - pm[grid[j]]))
    return pairs


def pairing(setting: str) -> list[str]:
    """What pairing (every ρ of a seed with the same adapter init, prompt order and sampling seeds)
    buys, from the reruns of ``setting`` alone, at equal compute (12 pilots a grid):

    - the correlation across ρ of a seed's deviation from its point mean (pooled over reruns):
      pairing can only help a contrast between points when it is positive;
    - paired grids (each rerun as run) against unpaired ones of the same pilots (grid k takes
      point i from rerun k + i, so no two points share a seed): the rerun-to-rerun SD of the
      log-linear slope and how often the grids state their most common regime."""
    from race.stats.fit import fit_loglinear
    from race.stats.regime import classify

    recs = sorted((json.loads(p.read_text()) for p in OUT.glob("*.json")), key=lambda r: r["first_seed"])
    recs = [r for r in recs if r["setting"] == setting and (OUT / f"{r['name']}.pilots.json.gz").exists()]
    if len(recs) < 3:
        return [f"{setting}: {len(recs)} reruns with pilots; pairing needs at least 3"]
    runs = [load_pilots(r["name"]) for r in recs]
    grid = sorted({p.rho_target for p in runs[0]})
    score = lambda p: float(np.mean(p.evals["reward"]))   # noqa: E731
    pairs = _seed_deviation_pairs(runs, grid, score)
    lines = [f"## Paired seeds: {setting}, {len(runs)} reruns", "",
             "| ρ pair | seeds | correlation of seed deviations |", "|---|---|---|"]
    allx, ally = [], []
    for (i, j), xy in sorted(pairs.items()):
        x, y = np.array(xy).T
        allx += list(x)
        ally += list(y)
        lines.append(f"| {grid[i]:g} – {grid[j]:g} | {len(xy)} | {np.corrcoef(x, y)[0, 1]:+.2f} |")
    lines.append(f"| all pairs | {len(allx)} | {np.corrcoef(allx, ally)[0, 1]:+.2f} |")

    def grid_of(parts: list[list]) -> tuple[float, str, float]:
        ps = [p for part in parts for p in part]
        means = np.array([[np.mean([score(p) for p in ps if p.rho_target == r]) for r in grid]])
        rho = np.array([np.mean([p.rho for p in ps if p.rho_target == r]) for r in grid])
        slope = float(fit_loglinear(rho=rho, y=means).coef[0, 1])
        d = classify(ps, targets=["reward"], primary_target="reward", n_boot=N_BOOT, seed=0,
                     rerun_confidence=False).primary
        return slope, d.regime.value, d.confidence

    n = len(runs)
    paired = [grid_of([[p for p in runs[k]]]) for k in range(n)]
    unpaired = [grid_of([[p for p in runs[(k + i) % n] if p.rho_target == r] for i, r in enumerate(grid)])
                for k in range(n)]
    lines += ["", "| design (same pilots, 12 a grid) | grids | slope mean | slope SD across grids | regimes | "
              "most common | agreement |", "|---|---|---|---|---|---|---|"]
    for label, g in (("paired (as run)", paired), ("unpaired (point i from rerun k+i)", unpaired)):
        slopes = np.array([x[0] for x in g])
        counts = Counter(x[1] for x in g)
        mode, k = counts.most_common(1)[0]
        lines.append(f"| {label} | {len(g)} | {slopes.mean():+.4f} | {slopes.std(ddof=1):.4f} | "
                     f"{', '.join(f'{a} {b}' for a, b in counts.most_common())} | {mode} | {k}/{len(g)} |")
    return lines


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run (or resume) one rerun and write its record")
    r.add_argument("setting")
    r.add_argument("--first-seed", type=int, required=True)
    q = sub.add_parser("queue", help="run SETTING:FIRST_SEED reruns one at a time (records already written are skipped)")
    q.add_argument("specs", nargs="+")
    q.add_argument("--commit", action="store_true", help="git-commit each record as it lands")
    tb = sub.add_parser("table", help="agreement and reliability from the committed records")
    tb.add_argument("--predicted", action="store_true", help="and the predicted-agreement candidates, from the pilots")
    ca = sub.add_parser("calibration", help="bootstrap share and rerun confidence against the agreement of "
                                            "independent synthetic reruns, in bins")
    ca.add_argument("--repeats", type=int, default=40)
    ca.add_argument("--base", type=int, default=30_000, help="first generator seed of each truth's grids")
    ca.add_argument("--shrinks", type=int, nargs="*", default=[], help="James–Stein dof to compare (0 = flat prior)")
    pa = sub.add_parser("pairing", help="what paired seeds buy, from a setting's reruns")
    pa.add_argument("setting", nargs="?", default="default")
    sy = sub.add_parser("synthetic", help="stated vs predicted confidence against rerun agreement on synthetic grids")
    sy.add_argument("--repeats", type=int, default=10)
    sy.add_argument("--unwiden", action="store_true", help="simulated reruns without the t/z widening of the seed noise")
    return ap


def _run(a: argparse.Namespace) -> None:
    """run: one rerun, its record's path printed."""
    print(run(a.setting, a.first_seed))


def _queue(a: argparse.Namespace) -> None:
    """queue: SETTING:FIRST_SEED reruns one at a time, records already written skipped (``--commit``: each committed)."""
    for spec in a.specs:
        setting, _, seed = spec.rpartition(":")
        name = rerun_name(setting, int(seed))
        if (OUT / f"{name}.json").exists():
            continue
        print(f"{_dt.datetime.now():%H:%M:%S} {name} …", flush=True)
        try:
            path = run(setting, int(seed))
        except SystemExit as e:
            print(e, flush=True)
            continue
        rec = json.loads(path.read_text())
        print(f"{_dt.datetime.now():%H:%M:%S} {name}: {rec['regime']} {rec['rho_range']} "
              f"confidence {rec['confidence']} ({rec['wall_seconds']} s)", flush=True)
        if a.commit:
            git_commit([path, OUT / f"{name}.pilots.json.gz"],
                       f"reruns: {name} — {rec['regime']}, confidence {rec['confidence']} (issue 54)")


def _calibration(a: argparse.Namespace) -> None:
    """calibration: the bootstrap share and rerun confidence against synthetic reruns' agreement, in bins."""
    rows = calibration(a.repeats, base=a.base, shrinks=tuple(a.shrinks))
    keys = ("bootstrap_share", "rerun", *(f"rerun_k{k}{p}" for k in a.shrinks for p in ("", "_plugin")))
    print("\n".join(calibration_lines(rows, keys)))


def _pairing(a: argparse.Namespace) -> None:
    """pairing: what paired seeds buy, from a setting's reruns."""
    print("\n".join(pairing(a.setting)))


def _synthetic(a: argparse.Namespace) -> None:
    """synthetic: stated and predicted confidence against rerun agreement on synthetic grids."""
    rows = synthetic(a.repeats, unwiden=a.unwiden)
    by = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    print("| truth | verdicts | mean stated | predicted (replicates) | predicted (rule) | predicted (rule + gate) | agreement |\n|---|---|---|---|---|---|---|")
    for s, rs in by.items():
        counts = Counter(r["regime"] for r in rs)
        print(f"| {s} | {', '.join(f'{g} {n}' for g, n in counts.most_common())} | "
              f"{np.mean([r['confidence'] for r in rs]):.3f} | {np.mean([r['predicted_agreement'] for r in rs]):.3f} | "
              f"{np.mean([r['predicted_rule'] for r in rs]):.3f} | {np.mean([r['predicted_gate'] for r in rs]):.3f} | "
              f"{np.mean([r['agreement'] for r in rs]):.3f} |")
    print()
    print("\n".join(reliability_lines(rows, "confidence", "stated confidence")))
    for label, part in (("decisive", [r for r in rows if r["regime"] != "inconclusive"]),
                        ("inconclusive", [r for r in rows if r["regime"] == "inconclusive"])):
        for key in ("confidence", "predicted_agreement", "predicted_rule", "predicted_gate"):
            if part:
                print()
                print("\n".join(reliability_lines(part, key, f"{key}, {label} verdicts")))
    print()
    print("\n".join(reliability_lines(rows, "predicted_agreement", "predicted rerun agreement (replicate rule)")))
    print()
    print("\n".join(reliability_lines(rows, "predicted_rule", "predicted rerun agreement (the rule, CIs as wide as this grid's)")))
    print()
    print("\n".join(reliability_lines(rows, "predicted_gate", "predicted rerun agreement (the rule and its support gate)")))


def _table(a: argparse.Namespace) -> None:
    """table: agreement and reliability from the committed records (``--predicted``: and the candidates)."""
    print(table(committed_records(), predicted=a.predicted))


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    {"run": _run, "queue": _queue, "calibration": _calibration, "pairing": _pairing, "synthetic": _synthetic, "table": _table}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
