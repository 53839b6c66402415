"""Rerun-confidence models scored on the committed reruns (issue 54 item 2). Research only.

research/scripts/reruns.py ``table`` showed that the rerun confidence (race.stats.confidence: a
parametric bootstrap about this grid's means, seed SD from its χ² posterior) misses observed
rerun agreement on the real reruns by 0.11–0.25 a bin. This script tries models of a rerun that
add what the real reruns show, each a switch of one simulation (``simulate``):

- **collapse** (a): a pilot whose score fell far below its point's other seeds (``collapsed``)
  is left out of the truth and of the seed SD this grid's reruns are drawn from, and each
  simulated rerun pilot collapses with probability ``q`` to (1 − ``kappa``) of its value;
- **sd** (b): the rerun's σ² drawn as ``lam`` · s² ν_eff / χ²_ν_eff (ν_eff = ``nu`` or this
  grid's ν): a 3-seed SD that looked tight is not trusted;
- **drift** (c): a between-run offset per point, N(0, ``tau``² σ²/n), that the rerun's own seeds do
  not see (a library-version shift would be one);
- **truth** (d): the truth drawn from its flat-prior posterior with weight ``w`` (0: the truth is
  this grid's means, as race.stats.confidence).

Hyperparameters are chosen leave-one-setting-out: for each of the 4 settings, the combination
with the smallest mean squared gap between confidence and observed agreement over the verdicts
of the other 3 settings is applied to the held-out setting's verdicts. The pooled held-out
confidences give the reliability table. Commands:

    python research/scripts/rerun_models.py collapses          # q and kappa, counted on every committed pilot
    python research/scripts/rerun_models.py loso               # the LOSO table (real reruns)
    python research/scripts/rerun_models.py power              # can a calibrated confidence pass the 0.1 test here?
    python research/scripts/rerun_models.py synthetic --repeats 20 --base 30000 [--collapse-q 0.015]
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "research" / "scripts"), str(ROOT)]
import rerun_calibration as calib  # noqa: E402
import reruns  # noqa: E402

from race.stats import regime as R  # noqa: E402
from race.stats.confidence import collapsed_pilots, simulate_mixture  # noqa: E402
from race.stats.fit import bootstrap_response, grid_scores  # noqa: E402

N_SIM = 200          # simulated reruns per verdict in the search (400 in the library)


@dataclass
class Prepared:
    """One grid, classified once: what every model needs."""

    name: str
    setting: str
    regime: object
    grid: object
    replicates: np.ndarray
    scale: float
    shares: np.ndarray
    stated: float
    rerun: float | None


def prepare(results, name: str, setting: str, n_boot: int = calib.N_BOOT) -> Prepared:
    complete = sorted((r for r in results if r.status == "complete"), key=lambda r: (r.rho_target, r.seed))
    v = R.classify(complete, primary_target="reward", n_boot=n_boot, seed=0, rerun_confidence=True).primary
    grid = R._grid(complete, "reward")
    scale = R.seed_scale(grid=grid, level=0.9)
    boot = bootstrap_response(grid=grid, n_boot=n_boot, seed=0, seed_resampling=R.SEED_RESAMPLING, seed_scale=scale)
    shares = np.array([f.shares()["reward"] for f in R._point_flops(complete, grid)])
    return Prepared(name, setting, v.regime, grid, boot.point_means, scale, shares, v.fits["bootstrap_share"],
                    v.fits["rerun_confidence"])


def confidence(p: Prepared, params: dict, n_sim: int = N_SIM) -> float | None:
    sims = simulate_mixture(grid=p.grid, replicates=p.replicates, seed_scale=p.scale, seed=0, n_reruns=n_sim, **params)
    if sims is None:
        return None
    return R.rerun_confidence(sims, rho=p.grid.rho, regime=p.regime, shares=p.shares, tau=R.REWARD_SHARE_THRESHOLD,
                              level=0.9)


def real_grids() -> list[Prepared]:
    """Every committed run of the rerun settings (31 verdicts), with its observed agreement."""
    from race.core.records import PilotResult

    out = []
    for r in reruns.committed_records():
        if "_pilots" in r:
            ps = [PilotResult.from_dict(p) for p in r["_pilots"] if p.get("status") == "complete"]
        else:
            ps = reruns.load_pilots(r["name"])
        p = prepare(ps, r["name"], r["setting"])
        assert p.regime.value == r["regime"], (r["name"], p.regime, r["regime"])
        out.append(p)
    return out


def agreement(preps: list[Prepared]) -> np.ndarray:
    """Per verdict: the share of the other runs of its setting stating its regime."""
    out = []
    for p in preps:
        others = [o for o in preps if o.setting == p.setting and o is not p]
        out.append(sum(o.regime == p.regime for o in others) / len(others))
    return np.array(out)


# ---------------------------------------------------------------- collapses counted

def all_committed_grids():
    """(label, setting family, pilots) of every committed pilot grid: the reruns, the README run and
    the validation rounds' stored pilot grids (pilot.json.gz and pilot-x1.json.gz)."""
    from race.core.records import PilotResult

    for p in sorted((ROOT / "research" / "reruns").glob("*.pilots.json.gz")):
        name = p.name.replace(".pilots.json.gz", "")
        yield name, name.rsplit("-s", 1)[0], [PilotResult.from_dict(d) for d in json.load(gzip.open(p, "rt"))
                                             if d.get("status") == "complete"]
    d = json.load(gzip.open(ROOT / "docs" / "runs" / "default.results.json.gz", "rt"))
    yield "docs/runs/default", "default", [PilotResult.from_dict(x) for x in d["pilots"] if x.get("status") == "complete"]
    for rnd, folder in (("r1", ROOT / "research" / "validation" / "runs"),
                        ("r2", ROOT / "research" / "validation" / "round2" / "runs")):
        for p in sorted(folder.glob("*/pilot*.json.gz")):
            pilots = json.load(gzip.open(p, "rt"))["pilots"]
            yield (f"{rnd}:{p.parent.name}/{p.name.replace('.json.gz', '')}", f"{rnd}-{p.parent.name}",
                   [PilotResult.from_dict(x) for x in pilots if x.get("status") == "complete"])


def count_collapses() -> dict:
    from race.stats.instability import stability

    rows, n_pilots = [], 0
    for label, family, ps in all_committed_grids():
        ps = sorted(ps, key=lambda r: (r.rho_target, r.seed))
        grid = grid_scores(rho_targets=[r.rho_target for r in ps], pilot_seeds=[r.seed for r in ps],
                           pilot_rho=[r.rho for r in ps], scores=[r.evals["reward"] for r in ps])
        st = stability(ps, "reward")
        flags = {(u.rho_target, u.seed) for u in st.unstable} if st else set()
        n_pilots += len(ps)
        hit = collapsed_pilots(grid, floor=0.0)
        x = grid.pilot_means
        for i in np.flatnonzero(hit):
            others = [x[j] for j in range(len(x)) if grid.point_index[j] == grid.point_index[i] and j != i]
            rows.append({"grid": label, "family": family, "rho": float(grid.rho_targets[grid.point_index[i]]),
                         "seed": int(grid.pilot_seeds[i]), "value": float(x[i]), "others": [float(o) for o in others],
                         "kappa": 1.0 - float(x[i]) / float(np.median(others)),
                         "drop": float(np.median(others)) - float(x[i]),
                         "flagged": (float(grid.rho_targets[grid.point_index[i]]), int(grid.pilot_seeds[i])) in flags})
    return {"pilots": n_pilots, "collapses": rows}


def collapse_rate(exclude_family: str | None = None, floor: float = 0.0) -> tuple[float, float, int, int]:
    """(q, kappa, collapses, pilots) over every committed grid, leaving out one family's grids; a
    collapse's fall at least ``floor``."""
    c = _COLLAPSES or _count()
    rows = [r for r in c["collapses"] if (exclude_family is None or not _same(r["family"], exclude_family))
            and r["drop"] >= floor]
    n = c["pilots"] - sum(k for f, k in c["per_family"].items() if exclude_family is not None and _same(f, exclude_family))
    kappa = float(np.mean([r["kappa"] for r in rows])) if rows else 0.5
    return len(rows) / n, kappa, len(rows), n


_COLLAPSES: dict = {}


def _same(family: str, setting: str) -> bool:
    """Whether a grid family belongs to a rerun setting (default ↔ default, docs/runs, r1-default;
    r1:steps-sparse ↔ r1-steps-sparse, …)."""
    key = setting.replace(":", "-")
    return family == key or (setting == "default" and family in ("default", "r1-default"))


def _count() -> dict:
    c = count_collapses()
    per: Counter = Counter()
    for label, family, ps in all_committed_grids():
        per[family] += len(ps)
    c["per_family"] = dict(per)
    _COLLAPSES.update(c)
    return c


# ---------------------------------------------------------------- scoring

def bin_gaps(conf: np.ndarray, agree: np.ndarray) -> list[dict]:
    rows = [{"confidence": float(c), "agreement": float(a)} for c, a in zip(conf, agree)]
    return [{**b, "gap": b["observed"] - b["stated"]} for b in calib.bins_of(rows, "confidence")]


def loss(conf: np.ndarray, agree: np.ndarray) -> float:
    return float(np.mean((conf - agree) ** 2))


GRID = {   # candidate name → list of parameter dicts searched (each a model)
    "plain": [{"floor": 0.0}],
    "collapse": [{"robust": True, "q": q, "q_weight": m, "floor": f} for f in (0.1, 0.2, 0.0)
                 for q in ("measured", 0.005, 0.015) for m in (None, 12.0)],
    "cm": [{"robust": True, "q": "measured", "q_weight": m, "floor": f} for f in (0.1, 0.2, 0.0)
           for m in (None, 12.0)],   # collapse, q measured
    "sd": [{"nu": nu, "lam": lam} for nu in (None, 6, 3) for lam in (1.0, 1.5, 2.0)],
    "drift": [{"tau": t} for t in (0.0, 0.5, 1.0, 1.5)],
    "truth": [{"w": w} for w in (0.0, 0.5, 1.0)],
    "chosen": [{"robust": True, "q": "measured", "floor": 0.2}],   # the library's model (race.stats.confidence)
}


def combos(names: list[str]) -> list[dict]:
    out = []
    for parts in itertools.product(*(GRID[n] for n in names)):
        d: dict = {}
        for p in parts:
            d.update(p)
        out.append(d)
    return out


def resolve(params: dict, setting: str | None) -> dict:
    """'measured' q and kappa: counted on every committed grid outside ``setting``'s family."""
    p = dict(params)
    if p.get("q") == "measured" or ("q" in p and "kappa" not in p):
        q, kappa, _, _ = collapse_rate(setting, p.get("floor", 0.0))
        if p.get("q") == "measured":
            p["q"] = q
        p.setdefault("kappa", kappa)
    return p


def loso(preps: list[Prepared], candidates: dict[str, list[dict]], n_sim: int = N_SIM, log=print) -> dict:
    """For each candidate: the LOSO-chosen parameters per held-out setting and the held-out confidences."""
    agree = agreement(preps)
    settings = sorted({p.setting for p in preps})
    out = {}
    for name, grid in candidates.items():
        # every verdict under every parameter set (q, kappa measured without the verdict's own setting)
        table = np.full((len(grid), len(preps)), np.nan)
        for k, params in enumerate(grid):
            for i, p in enumerate(preps):
                c = confidence(p, resolve(params, p.setting), n_sim)
                table[k, i] = np.nan if c is None else c
        held = np.full(len(preps), np.nan)
        chosen = {}
        for s in settings:
            train = np.array([p.setting != s for p in preps])
            losses = [loss(table[k, train], agree[train]) for k in range(len(grid))]
            k = int(np.argmin(losses))
            chosen[s] = grid[k]
            held[~train] = table[k, ~train]
        insample = int(np.argmin([loss(table[k], agree) for k in range(len(grid))]))
        out[name] = {"grid": grid, "table": table, "held": held, "chosen": chosen, "insample": grid[insample],
                     "insample_conf": table[insample]}
        log(f"{name}: LOSO loss {loss(held, agree):.4f}; chosen {chosen}; in-sample best {grid[insample]}")
    return out


def table_lines(title: str, conf: np.ndarray, agree: np.ndarray) -> list[str]:
    lines = [f"### {title}", "| bin | verdicts | mean stated | observed agreement | gap |", "|---|---|---|---|---|"]
    for b in bin_gaps(conf, agree):
        lines.append(f"| {b['lo']:.2f}–{b['hi']:.2f} | {b['n']} | {b['stated']:.3f} | {b['observed']:.3f} | {b['gap']:+.3f} |")
    lines.append(f"| all | {len(conf)} | {conf.mean():.3f} | {agree.mean():.3f} | {agree.mean() - conf.mean():+.3f} |")
    worst = max(abs(b["gap"]) for b in bin_gaps(conf, agree))
    lines.append(f"\nworst |gap| {worst:.3f}; mean squared gap {loss(conf, agree):.4f}")
    return lines


# ---------------------------------------------------------------- power

def oracle_power(preps_settings: list[str], preps_regimes: list[str], n_sims: int = 20_000, seed: int = 0,
                 tol: float = 0.1, smooth: float = 0.0, scale: int = 1) -> dict:
    """How often a perfectly calibrated confidence passes the 0.1 test on data shaped like these.

    Each setting's runs are drawn iid from its regime frequencies (the observed ones, optionally
    add-``smooth`` smoothed); a run's calibrated confidence is the probability of its own regime in
    its setting (then E[agreement | c] = c exactly); agreement is the share of the setting's other
    runs stating the same regime, bins as rerun_calibration.bins_of (≥ 5 verdicts). Returns the share of
    draws whose every bin is within ``tol``, and the distribution of the worst gap. ``scale``: each
    setting with that many times its runs (how many reruns the test would need)."""
    rng = np.random.default_rng(seed)
    by: dict[str, Counter] = {}
    for s, g in zip(preps_settings, preps_regimes):
        by.setdefault(s, Counter())[g] += 1
    settings = sorted(by)
    probs = {}
    for s in settings:
        regs = sorted(set(by[s]) | {"other"})
        w = np.array([by[s].get(g, 0) + smooth for g in regs], float)
        probs[s] = (regs, w / w.sum())
    passes, worsts = 0, []
    for _ in range(n_sims):
        conf, agree = [], []
        for s in settings:
            regs, p = probs[s]
            n = sum(by[s].values()) * scale
            draw = rng.choice(len(regs), size=n, p=p)
            for i, g in enumerate(draw):
                others = np.delete(draw, i)
                conf.append(p[g] + rng.uniform(-1e-9, 1e-9))      # ties broken at random, as a continuous confidence would
                agree.append(float(np.mean(others == g)))
        gaps = [abs(b["gap"]) for b in bin_gaps(np.array(conf), np.array(agree))]
        worst = max(gaps)
        worsts.append(worst)
        passes += worst <= tol
    w = np.array(worsts)
    return {"pass": passes / n_sims, "worst_median": float(np.median(w)), "worst_q90": float(np.quantile(w, 0.9)),
            "probs": {s: dict(zip(*probs[s])) for s in settings}}


def binomial_power(conf: np.ndarray, n_others: np.ndarray, n_sims: int = 20_000, seed: int = 0, tol: float = 0.1) -> float:
    """The same test when each verdict's agreement were an independent Binomial(n_others, c)/n_others
    at its own confidence c (verdicts independent: a best case; on real reruns they share runs)."""
    rng = np.random.default_rng(seed)
    ok = 0
    for _ in range(n_sims):
        agree = rng.binomial(n_others, conf) / n_others
        ok += max(abs(b["gap"]) for b in bin_gaps(conf, agree)) <= tol
    return ok / n_sims


# ---------------------------------------------------------------- synthetic

def synthetic_rows(repeats: int, base: int, models: dict[str, dict], collapse_q: float = 0.0, kappa: float = 0.5,
                   n_sim: int = N_SIM) -> list[dict]:
    """rerun_calibration.calibration's synthetic grids (its TRUTHS, the default design, generator seeds ``base`` + k),
    each pilot collapsing with probability ``collapse_q`` to (1 − ``kappa``) of its scores; each verdict's
    confidence under every model, and its agreement with the other grids of its truth."""
    sys.path[:0] = [str(ROOT / "tests")]
    from dataclasses import replace as dc_replace

    from test_regime import synthetic_results  # noqa: E402

    rows = []
    rng = np.random.default_rng([base, 54])
    for name, response in calib.TRUTHS.items():
        runs = []
        for rep in range(repeats):
            res = synthetic_results(response=response, n_seeds=3, seed_sd=0.024, n_prompts=500,
                                    grid=(0.5, 0.62, 0.74, 0.85), seed=base + rep)
            if collapse_q > 0:
                hit = rng.random(len(res)) < collapse_q
                res = [dc_replace(r, evals={k: tuple(v * (1 - kappa) for v in vs) for k, vs in r.evals.items()})
                       if h else r for r, h in zip(res, hit)]
            p = prepare(res, f"{name}#{rep}", name)
            row = {"setting": name, "regime": p.regime.value, "bootstrap_share": p.stated, "rerun": p.rerun}
            for m, params in models.items():
                row[m] = confidence(p, params, n_sim)
            runs.append(row)
        for i, r in enumerate(runs):
            others = [o for j, o in enumerate(runs) if j != i]
            rows.append({**r, "agreement": sum(o["regime"] == r["regime"] for o in others) / len(others)})
    return rows


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("collapses")
    lo = sub.add_parser("loso")
    lo.add_argument("--candidates", nargs="*", default=["plain", "collapse", "sd", "drift", "truth", "cm+sd",
                                                        "cm+drift", "cm+truth"])
    lo.add_argument("--n-sim", type=int, default=N_SIM)
    lo.add_argument("--save", type=Path, default=None)
    sub.add_parser("power")
    sy = sub.add_parser("synthetic")
    sy.add_argument("--repeats", type=int, default=20)
    sy.add_argument("--base", type=int, default=30_000)
    sy.add_argument("--collapse-q", type=float, default=0.0)
    sy.add_argument("--model", action="append", default=[], help="NAME=JSON parameters of simulate_mixture")
    sy.add_argument("--n-sim", type=int, default=N_SIM)
    return ap


def _collapses(a: argparse.Namespace) -> None:
    """The committed pilots that collapsed (race.stats.confidence.collapsed_pilots) and the collapse rate
    each setting left out gives."""
    c = _count()
    print(f"{len(c['collapses'])} collapsed pilots (race.stats.confidence.collapsed_pilots) of {c['pilots']} committed pilots")
    print("| grid | ρ | seed | score | its point's other seeds | κ = 1 − score/median | stability flag |\n|---|---|---|---|---|---|---|")
    for r in c["collapses"]:
        print(f"| {r['grid']} | {r['rho']:g} | {r['seed']} | {r['value']:.3f} | "
              f"{', '.join(f'{o:.3f}' for o in r['others'])} | {r['kappa']:.2f} | {'yes' if r['flagged'] else 'no'} |")
    for floor in (0.0, 0.1, 0.2):
        for s in (None, "default", "r1:steps-sparse", "r2:small", "r2:reasoner-math"):
            q, kappa, k, n = collapse_rate(s, floor)
            print(f"floor {floor}: without {s or '(none)'}: q = {k}/{n} = {q:.4f}, kappa {kappa:.3f}")


def _loso(a: argparse.Namespace) -> None:
    """The candidate rerun models chosen leave-one-setting-out on the real rerun verdicts, with the
    references without simulation, as tables (``--save``: their numbers as JSON)."""
    preps = real_grids()
    agree = agreement(preps)
    cands = {c: combos(c.split("+")) for c in a.candidates}
    res = loso(preps, cands, a.n_sim, log=lambda s: print(s, flush=True))
    print()
    print("\n".join(table_lines("bootstrap share (stated)", np.array([p.stated for p in preps]), agree)))
    print()
    print("\n".join(table_lines("rerun confidence (race.stats.confidence, 400 reruns)",
                                np.array([p.rerun for p in preps]), agree)))
    for name, r in res.items():
        print()
        print("\n".join(table_lines(f"{name}: LOSO held-out confidences", r["held"], agree)))
        print()
        print("\n".join(table_lines(f"{name}: in-sample best {r['insample']} (tuned on these verdicts)",
                                    r["insample_conf"], agree)))
    # references without simulation: a constant (the other settings' mean agreement) and a linear
    # recalibration a + b·c of the rerun confidence, both fitted on the other settings (LOSO)
    rerun = np.array([p.rerun for p in preps])
    const, recal = np.zeros(len(preps)), np.zeros(len(preps))
    for s in sorted({p.setting for p in preps}):
        train = np.array([p.setting != s for p in preps])
        const[~train] = agree[train].mean()
        b, a0 = np.polyfit(rerun[train], agree[train], 1)
        recal[~train] = np.clip(a0 + b * rerun[~train], 0, 1)
    print()
    print("\n".join(table_lines("constant: the other settings' mean agreement (LOSO)", const + 1e-9 * np.arange(len(preps)), agree)))
    print()
    print("\n".join(table_lines("rerun confidence recalibrated a + b·c (LOSO)", recal, agree)))
    print("\n| verdict | regime | agreement | stated | rerun | " + " | ".join(res) + " |")
    print("|---|---|---|---|---|" + "---|" * len(res))
    for i, p in enumerate(preps):
        print(f"| {p.name} | {p.regime.value} | {agree[i]:.3f} | {p.stated:.3f} | {p.rerun:.3f} | "
              + " | ".join(f"{r['held'][i]:.3f}" for r in res.values()) + " |")
    if a.save:
        a.save.write_text(json.dumps({"names": [p.name for p in preps], "settings": [p.setting for p in preps],
                                      "regimes": [p.regime.value for p in preps], "agreement": agree.tolist(),
                                      "stated": [p.stated for p in preps], "rerun": [p.rerun for p in preps],
                                      "candidates": {n: {"held": r["held"].tolist(), "chosen": r["chosen"],
                                                         "grid": r["grid"], "table": r["table"].tolist()}
                                                     for n, r in res.items()}}, default=str))


def _power(a: argparse.Namespace) -> None:
    """How often the 0.1-per-bin target passes for a perfectly calibrated confidence (oracle and binomial)."""
    recs = reruns.committed_records()
    settings = [r["setting"] for r in recs]
    regimes = [r["regime"] for r in recs]
    for smooth in (0.0, 0.5):
        o = oracle_power(settings, regimes, smooth=smooth)
        print(f"oracle (regime frequencies, +{smooth} smoothing): P(pass) = {o['pass']:.3f}; worst gap median "
              f"{o['worst_median']:.3f}, 90th pct {o['worst_q90']:.3f}; {o['probs']}")
    n_others = np.array([sum(s == t for t in settings) - 1 for s in settings])
    for scale in (2, 4, 8):
        o = oracle_power(settings, regimes, n_sims=2000, scale=scale)
        print(f"oracle with {scale}× the runs of every setting: P(pass) = {o['pass']:.3f}; worst gap median "
              f"{o['worst_median']:.3f}")
    stated = np.array([r["confidence"] for r in recs])
    print(f"independent binomial verdicts at the stated confidences: P(pass) = {binomial_power(stated, n_others):.3f}")
    for c in (0.5, 0.7, 0.85, 0.95):
        print(f"independent binomial verdicts, all at c = {c}: P(pass) = {binomial_power(np.full(len(settings), c), n_others):.3f}")


def _synthetic(a: argparse.Namespace) -> None:
    """Reliability by fixed bin on synthetic grids for each ``--model``."""
    models = {}
    for m in a.model:
        k, _, v = m.partition("=")
        models[k] = json.loads(v)
    rows = synthetic_rows(a.repeats, a.base, models, collapse_q=a.collapse_q, n_sim=a.n_sim)
    for k in ("bootstrap_share", "rerun", *models):
        part = [r for r in rows if r[k] is not None]
        print()
        print("\n".join(calib.fixed_bin_lines(part, k, f"{k}: {len(part)} verdicts (collapse q {a.collapse_q})")))


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    {"collapses": _collapses, "loso": _loso, "power": _power, "synthetic": _synthetic}[a.cmd](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
