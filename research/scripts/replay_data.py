"""The committed records of rounds 1–2 as research/scripts/replay.py reads them (issues 48 and 49):
both rounds' suites and each setting's records, a full-run grid's response (``Response``: on a prompt
set, at a budget fraction, with or without its collapsed runs), the round-1 drift backtest, a pilot as
it stood at one of its checkpoints, the leave-one-setting-out population drift, and the tables'
number formats. Moved out of replay.py unchanged (issue 52); replay.py re-exports every name."""
from __future__ import annotations

import math
import statistics
import sys
from functools import lru_cache
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, ROOT / "research" / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import validation as V  # noqa: E402

SUITES = (ROOT / "research" / "validation" / "suite.yaml", ROOT / "research" / "validation" / "round2.yaml")
FULL_KINDS = ("full10", "full30", "full100")
N_BOOT = 1000
Z90 = 1.6448536269514722


# ---------------------------------------------------------------- the data

@lru_cache(maxsize=1)
def suites() -> tuple[dict, dict]:
    """Both rounds' suites; every round-2 setting's records are read from its own folder."""
    r1 = V.load_suite(SUITES[0])
    r2 = V.load_suite(SUITES[1])
    runs2 = V.ROOT / r2["runs"]
    for s in r2["settings"]:
        V.RUNS_OF[s["name"]] = runs2
    for s in r1["settings"]:
        s.setdefault("round", 1)
    for s in r2["settings"]:
        s.setdefault("round", 2)
        s.setdefault("half", "round 2")
    return r1, r2


def all_settings() -> list[dict]:
    r1, r2 = suites()
    return list(r1["settings"]) + list(r2["settings"])


def load(name: str, kind: str) -> dict | None:
    return _load(name, kind)


@lru_cache(maxsize=None)
def _load(name: str, kind: str) -> dict | None:
    suites()
    return V.load_run(name, kind)


def constant_rate(s: dict) -> bool:
    rec = load(s["name"], "pilot")
    lr = ((rec or {}).get("config") or {}).get("learning_rate") or {}
    return (lr.get("schedule") or "constant") == "constant"


def label(g: dict) -> str:
    return f"{g['setting']} {g['factor']}×"


# ---------------------------------------------------------------- reading a full-run grid

def _interp_fraction(p, frac: float) -> list[float] | None:
    """A run's per-prompt reward on the checkpoint prompts at budget fraction ``frac``: its own
    checkpoints, linear in log FLOPs between the two around ``frac`` (the checkpoint itself when one
    sits there); None without checkpoints."""
    cps = sorted((c for c in p.checkpoints if c.fraction > 0 and c.evals.get("reward")), key=lambda c: c.fraction)
    if not cps:
        return None
    for c in cps:
        if abs(c.fraction - frac) < 1e-6:
            return list(c.evals["reward"])
    below = [c for c in cps if c.fraction < frac]
    above = [c for c in cps if c.fraction > frac]
    if not below:
        return list(above[0].evals["reward"])
    if not above:
        return list(below[-1].evals["reward"])
    a, b = below[-1], above[0]
    t = (math.log(frac) - math.log(a.fraction)) / (math.log(b.fraction) - math.log(a.fraction))
    return [(1 - t) * x + t * y for x, y in zip(a.evals["reward"], b.evals["reward"])]


def collapsed(p) -> bool:
    from race.stats.instability import find_instability

    return bool(p.checkpoints) and find_instability(p.checkpoints, "reward") is not None


def cells(full: dict, *, prompts: str = "final", frac: float = 1.0, drop_collapsed: bool = False) -> dict[float, list]:
    """ρ target → per-run per-prompt reward lists of a full-run grid: ``prompts`` "final" (the 500
    held-out prompts at the end; ``frac`` must be 1) or "ckpt" (the 100 checkpoint prompts at budget
    fraction ``frac``); collapsed runs left out with ``drop_collapsed``."""
    out: dict[float, list] = {}
    for p in V.pilots_of(full):
        if drop_collapsed and collapsed(p):
            continue
        if prompts == "final":
            assert frac == 1.0
            scores = list(p.evals["reward"])
        else:
            scores = _interp_fraction(p, frac)
            if scores is None:
                continue
        out.setdefault(p.rho_target, []).append(scores)
    return dict(sorted(out.items()))


class Response:
    """A full-run grid's response on one reading: per-ρ seed means on the measured axis, the best
    point, the pooled SE (validation.setting_row's: seed variance pooled over all points, over the
    best point's seed count), and a bootstrap over seeds and prompts (validation.boot_means')."""

    def __init__(self, full: dict, **kw):
        import numpy as np

        self.cells = cells(full, **kw)
        meas = V.measured_rho(full)
        self.rhos = [t for t in self.cells if self.cells[t]]
        self.axis = [meas[t] for t in self.rhos]
        self.means = {t: [float(np.mean(x)) for x in self.cells[t]] for t in self.rhos}
        self.mean = [statistics.fmean(self.means[t]) for t in self.rhos]
        i = int(np.argmax(self.mean))
        self.best_t, self.best_rho, self.best_mean = self.rhos[i], self.axis[i], self.mean[i]
        dfs = sum(len(v) - 1 for v in self.means.values() if len(v) > 1)
        ss = sum((len(v) - 1) * statistics.variance(v) for v in self.means.values() if len(v) > 1)
        self.pse = math.sqrt(ss / dfs) / math.sqrt(len(self.means[self.best_t])) if dfs else float("nan")
        self._boot = None

    def at(self, rho: float) -> float:
        import numpy as np

        return float(np.interp(rho, self.axis, self.mean))

    def regret(self, rho: float) -> float:
        """The regret at a measured ρ in pooled SEs."""
        return V._in_se(self.best_mean - self.at(rho), self.pse)

    def boot(self):
        import numpy as np

        if self._boot is None:
            rng = np.random.default_rng(0)
            arrs = [np.asarray(self.cells[t], dtype=float) for t in self.rhos]
            out = np.empty((N_BOOT, len(arrs)))
            for j, a in enumerate(arrs):
                s_idx = rng.integers(0, a.shape[0], (N_BOOT, a.shape[0]))
                p_idx = rng.integers(0, a.shape[1], (N_BOOT, a.shape[0], a.shape[1]))
                out[:, j] = a[s_idx[..., None], p_idx].mean(axis=(1, 2))
            self._boot = out
        return self._boot

    def gain_ci(self, rho: float, on_policy: float | None) -> tuple[float, float, float]:
        """(gain, 95 % CI low, high) of the response at ``rho`` over the on-policy point (nan without one)."""
        import numpy as np

        if on_policy not in self.rhos:
            return (float("nan"),) * 3
        j = self.rhos.index(on_policy)
        reps = self.boot()
        g = np.array([np.interp(rho, self.axis, row) for row in reps]) - reps[:, j]
        lo, hi = np.quantile(g, [0.025, 0.975])
        return self.at(rho) - self.mean[j], float(lo), float(hi)

    def diff_pse(self, rho_a: float, rho_b: float, other: "Response | None" = None) -> float:
        """(response at rho_a on this reading) − (at rho_b on ``other``, default this one), in this reading's pooled SEs."""
        other = other or self
        return V._in_se(self.at(rho_a) - other.at(rho_b), self.pse)


# ---------------------------------------------------------------- round 1's RACE at F, and number formats

@lru_cache(maxsize=1)
def round1_backtest() -> dict[tuple[str, float], float]:
    """Round 1's RACE at F: drift.py's leave-one-setting-out backtest, candidate "shrunk to the
    population" (its recommended ρ per (setting, factor)), recomputed with drift.py's own functions."""
    import drift as D
    from race.stats.drift import range_at, shrink

    r1, _ = suites()
    out = {}
    for s in r1["settings"]:
        if s["name"] in D.ALL_COLLAPSED:
            continue
        pilot = load(s["name"], "pilot")
        pv = V.verdict(pilot)
        pop = D.per_setting_drift(r1, exclude=s["name"])
        own = D.fit(D.levels(s, grids=("pilot",)))
        tau = max(pop["tau"], pop["se"])
        d, se = shrink(own.d if own else float("nan"), own.d_se if own else math.inf, pop["d"], tau)
        for kind, factor in D.FACTORS:
            r = range_at(pv.rho_range, pv.recommended_rho, pilot_budget=1.0, full_run_budget=factor, drift=d, drift_se=se)
            out[(s["name"], factor)] = (r.rho_range, r.recommended_rho)
    return out


def _med(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def _f(x: float, d: int = 2, sign: bool = False) -> str:
    if x is None or x != x:
        return "—"
    return f"{x:+.{d}f}" if sign else f"{x:.{d}f}"


def _beats(rows: list[dict], who: str) -> tuple[int, int]:
    """(grids where ``who``'s gain over on-policy is positive, grids where its 95 % CI excludes 0)."""
    sep = [r for r in rows if r[f"{who}_gain_ci"][0] > 0 or r[f"{who}_gain_ci"][1] < 0]
    return sum(r[f"{who}_gain"] > 0 for r in sep), len(sep)


# ---------------------------------------------------------------- issue 49: a pilot read at a checkpoint

# checkpoint fractions the designs read (the pilots' own log-spaced checkpoints nearest B/9 and B/4:
# no checkpoint sits at 1/9 or 1/4, and a read between two would be no run's)
EARLY, MID, LATE = 0.0928746, 0.304753, 0.552045


def _ckpt(p: dict, frac: float) -> dict:
    """The pilot's checkpoint at ``frac``, else its latest before it: a pilot of few steps records one
    checkpoint when a step crosses several fractions (at the largest), so at ``frac`` of its budget it
    stood where its previous checkpoint was (steps-prm: 3 pilots of 11 steps)."""
    before = [c for c in p["checkpoints"] if c["fraction"] <= frac + 1e-4]
    return max(before, key=lambda c: c["fraction"])


def truncated(p: dict, frac: float, *, rescale: bool = True):
    """A pilot (its committed dict) as it stood at budget fraction ``frac`` (one of its checkpoints):
    evaluations on the checkpoint prompts, FLOPs and measured ρ as spent, the checkpoints up to there
    (their fractions rescaled to the shorter budget with ``rescale``), the training curve up to there.
    ``frac`` = 1 gives the pilot as run."""
    from race.core.records import PilotResult

    if frac >= 1.0:
        return PilotResult.from_dict(p)
    c = _ckpt(p, frac)
    spent = sum(c["flops"].get(k, 0.0) for k in ("search", "learning", "reward"))
    cps = [{**x, "fraction": x["fraction"] / frac if rescale else x["fraction"]}
           for x in p["checkpoints"] if x["fraction"] <= c["fraction"] + 1e-9]
    curve = [pt for pt in p.get("curve") or [] if pt[0] <= spent] or (p.get("curve") or [])[:1]
    return PilotResult.from_dict({**p, "evals": dict(c["evals"]), "flops": dict(c["flops"]),
                                  "rho": c["flops"]["learning"] / spent if spent else p["rho"],
                                  "checkpoints": cps, "curve": curve})


def raw_pilots(name: str) -> list[dict]:
    return [p for p in load(name, "pilot")["pilots"] if p.get("status") == "complete"]


@lru_cache(maxsize=None)
def loso_population(name: str) -> tuple[float, float]:
    """The population drift and its spread (max of τ and the mean's SE, as drift.py's backtest) from
    every other setting of both rounds: the leave-one-setting-out population the designs use."""
    import drift as D

    suite = {"settings": [s for s in all_settings() if V.planned(s, "full10")]}
    pop = D.per_setting_drift(_COMBINED.setdefault("suite", suite), exclude=name)
    return pop["d"], max(pop["tau"], pop["se"])


_COMBINED: dict[str, dict] = {}


def _seed_var_of_best(pilots: Sequence, *, n_boot: int = N_BOOT) -> float:
    """race.stats.design.seed_var_of_best: the sampling variance of a pilot design's best ρ (measured), the
    σ² term a verdict's prior start uses."""
    from race.stats.design import seed_var_of_best

    return seed_var_of_best(pilots, "reward", n_boot=n_boot, seed=0)
