"""What RACE knows before a pilot runs, and what pilots within a share of the full run can buy (issue 49).

Pure pieces, no torch:

- **The population prior** of the best update fraction at the full run: the median full-run best ρ
  (measured) of the two validation rounds' 10 × B grids that learned something and did not all
  collapse (21 grids: ``POPULATION_RHO``), and their spread (``POPULATION_RHO_SD``). RACE with no pilots
  recommends the prior; pilots move it only as far as their evidence allows (``shrink_to_prior``:
  an empirical-Bayes normal–normal shrinkage, w = τ² / (τ² + σ²), τ = ``POPULATION_RHO_TAU`` the spread net of
  each grid's sampling noise). ``prior_start`` is the one rule a verdict's range at F states beside itself and
  the replay of rounds 1–2 scores: σ² = the pilots' seed variance of their best ρ (``seed_var_of_best``) + the
  variance of the drift's move to F (``move_sd``).
- **The signal check** (``signal``): a 0/1 reward over a group of g rollouts gives GRPO a gradient only
  where the group's rewards differ, which happens with probability 1 − pᵍ − (1 − p)ᵍ at base pass rate
  p. Below ``p*(g) = 1 − 2^(−1/g)`` (0.083 for g = 8, the bar of Aphale & Liu, arXiv 2606.18487, whose
  advantage variance is p(1 − p)(g − 1)/g) fewer than half the groups carry any signal; above 1 − p*(g)
  the reward is saturated. On rounds 1–2 the rule names every grid that learned nothing for want of
  signal (`hard`, p = 0.007; `small` and `small-reserve`, 0.053) and no grid that learned
  (docs/pilot.md, "Replaying pilot designs").
- **What pilots are worth** (``pilot_value``): the prior alone's expected regret against what a share of
  the compute costs the run, both in pooled full-run SEs (the replay of rounds 1–2).
- **A design within a share** (``plan_share``): the budget per pilot that puts every pilot, held-out
  evaluation included, inside ``share`` × F, what that buys (F / B, against the drift model's
  validated and largest factors), and a refusal when it buys nothing.

Invariants: every figure here is tied by a test to the committed data it came from
(tests/test_design.py; POPULATION_RHO_TAU: tests/test_replay.py); a verdict's prior start and the replay's are one
function; nothing imports torch; every public function checks its arguments on entry
(race.core.arguments: a ``DesignError`` naming the argument, its value and what was expected).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from race.core import arguments as A
from race.stats.drift import Z90
from race.core.errors import RaceError
from race.core.records import PilotResult

# The no-pilot prior: rounds 1–2's 10 × B full-run grids (research/validation/suite.yaml, round2.yaml), the
# best point of each by mean final held-out reward, its measured ρ; `hard` (learned nothing) and `lr-x3`,
# `lr-x3-cosine` (every run collapsed) left out. research/scripts/replay.py prior prints them.
POPULATION_RHO = 0.46
POPULATION_RHO_SD = 0.136
POPULATION_GRIDS = 21
# The between-setting SD of the best ρ net of each grid's own sampling noise (its best ρ's bootstrap variance over
# seeds and prompts, mean over the same 21 grids: sqrt(0.136² − 0.0061)); the prior's weight in the shrinkage.
# research/scripts/replay.py population prints it.
POPULATION_RHO_TAU = 0.112
# What pilots can win back and what they cost, in the same units (pooled full-run SEs of held-out reward),
# from the same replay (research/scripts/replay.py designs / slope; docs/pilot.md, "Replaying pilot designs"):
# the prior alone's median regret over rounds 1–2's 24 scored grids, the flat grid's (4 ρ × 3 seeds at B,
# 1.2 full runs of compute at F = 10 × B), and the median reward the last stretch of a full run buys per
# doubling of compute at its best point (23 grids).
PRIOR_REGRET = 0.60
FLAT_GRID_REGRET = 0.60
SE_PER_DOUBLING = 3.27
DEFAULT_SHARE = 0.10          # race init's share of the full run spent on pilots
MIN_STEPS = 10                # a pilot with fewer optimizer steps than this buys nothing
MIN_SIGNAL = 0.5              # groups with any reward variance: below half, the grid learns (next to) nothing


class DesignError(RaceError):
    """A pilot design that cannot be planned (a share that buys no pilot, bad arguments)."""


def p_star(group: int) -> float:
    """The base pass rate below which fewer than half the groups of ``group`` rollouts hold two
    different 0/1 rewards: 1 − 2^(−1/g) (0.083 for g = 8)."""
    g = A.whole("group", group, error=DesignError, ge=2)
    return 1.0 - 2.0 ** (-1.0 / g)


def signal_share(pass_rate: float, group: int) -> float:
    """The share of prompts whose group of ``group`` rollouts holds two different 0/1 rewards:
    1 − pᵍ − (1 − p)ᵍ (a group that scores alike has zero advantages: no gradient)."""
    p = A.number("pass_rate", pass_rate, error=DesignError, ge=0, le=1)
    g = A.whole("group", group, error=DesignError, ge=2)
    return 1.0 - p ** g - (1.0 - p) ** g


@dataclass(frozen=True)
class Signal:
    """The signal check's verdict on a base pass rate: ``status`` is ``ok``, ``too hard`` or
    ``saturated``; ``line`` is the one line RACE prints (None when ok)."""

    pass_rate: float
    group: int
    share: float
    status: str
    line: str | None

    def to_dict(self) -> dict:
        return {"pass_rate": self.pass_rate, "group": self.group, "signal_share": self.share,
                "status": self.status, "line": self.line}


def signal(pass_rate: float, group: int) -> Signal:
    """Whether a grid can learn from a base pass rate ``pass_rate`` with groups of ``group`` rollouts,
    and what would help when it cannot (a larger group, an easier split, a denser reward)."""
    p = A.number("pass_rate", pass_rate, error=DesignError, ge=0, le=1)
    g = A.whole("group", group, error=DesignError, ge=2)
    share = signal_share(p, g)
    if share >= MIN_SIGNAL:
        return Signal(p, g, share, "ok", None)
    hard = p < 0.5
    need = next((k for k in (16, 32, 64, 128) if k > g and signal_share(p, k) >= MIN_SIGNAL), None)
    bigger = f"a group of {need} rollouts per prompt (schedule.n_train) would give {signal_share(p, need):.0%}" \
        if need else "no group up to 128 rollouts would give half"
    if hard:
        line = (f"the base policy passes {p:.1%} of training prompts: only {share:.0%} of groups of {g} rollouts "
                f"hold a reward that varies, so GRPO gets (next to) no gradient and the grid would learn nothing "
                f"(below p* = {p_star(g):.3f} for g = {g}); {bigger}, or use an easier split of the task or a "
                "denser reward (structured or dense partial credit)")
    else:
        line = (f"the base policy passes {p:.1%} of training prompts: only {share:.0%} of groups of {g} rollouts "
                f"hold a reward that varies, so the reward is saturated and the grid would learn nothing "
                f"(above 1 − p* = {1 - p_star(g):.3f} for g = {g}); use a harder split of the task, or {bigger}")
    return Signal(p, g, share, "too hard" if hard else "saturated", line)


@dataclass(frozen=True)
class Shrunk:
    """A recommended ρ shrunk toward the population prior: ``rho`` = prior + ``weight`` · (own − prior),
    its posterior SD, and the 90 % range around it (clipped to (0, 1)). ``own`` / ``own_sd``: the pilots'
    ρ at F and its SD (None: no pilots, the prior alone, whose range is the prior's observed spread)."""

    rho: float
    sd: float
    weight: float
    low: float
    high: float
    own: float | None = None
    own_sd: float | None = None
    prior: float = POPULATION_RHO
    prior_sd: float = POPULATION_RHO_TAU

    def line(self) -> str:
        if self.own is None:
            return (f"prior start: ρ {self.rho:.2f}, 90% range [{self.low:.2f}, {self.high:.2f}] (the prior alone: "
                    f"the median full-run best of {POPULATION_GRIDS} grids of rounds 1–2, no pilots to move it)")
        return (f"prior start: ρ {self.rho:.2f}, 90% range [{self.low:.2f}, {self.high:.2f}] (the pilots' "
                f"{self.own:.2f}, SD {self.own_sd:.3f}, shrunk toward the prior {self.prior:g}, SD {self.prior_sd:g}: "
                f"weight {self.weight:.2f} on the pilots; beside the range at F, not instead of it, docs/pilot.md)")

    def to_dict(self) -> dict:
        return {"rho": self.rho, "sd": self.sd, "weight": self.weight, "rho_range": [self.low, self.high],
                "own_rho": self.own, "own_sd": self.own_sd, "prior": self.prior, "prior_sd": self.prior_sd,
                "line": self.line()}


def shrink_to_prior(own_rho: float | None, own_sd: float | None, *, prior: float = POPULATION_RHO,
                    prior_sd: float = POPULATION_RHO_TAU, spread: float = POPULATION_RHO_SD) -> Shrunk:
    """The pilots' own best ρ at F (``own_rho``, with its SD ``own_sd``: bootstrap and drift together)
    pulled toward the population prior by precision weights, w = τ² / (τ² + σ²) with τ = ``prior_sd`` (the
    between-setting SD net of each grid's own sampling noise); ``own_rho`` None (no pilots) gives the prior
    alone, its range from ``spread`` (the observed SD of the full-run best ρ, the prior-alone design's)."""
    prior = A.number("prior", prior, error=DesignError, gt=0, lt=1)
    tau = A.number("prior_sd", prior_sd, error=DesignError, gt=0)
    if own_rho is None:
        sd = A.number("spread", spread, error=DesignError, gt=0)
        rho, w, own, sig = prior, 0.0, None, None
    else:
        own = A.number("own_rho", own_rho, error=DesignError, gt=0, lt=1)
        sig = A.number("own_sd", own_sd, error=DesignError, ge=0)
        w = tau ** 2 / (tau ** 2 + sig ** 2) if sig > 0 else 1.0
        rho = prior + w * (own - prior)
        sd = math.sqrt(w) * sig if sig > 0 else 0.0
    return Shrunk(rho, sd, w, max(1e-3, rho - Z90 * sd), min(1 - 1e-3, rho + Z90 * sd), own, sig, prior, tau)


def seed_var_of_best(pilots: Sequence, target: str = "reward", *, n_boot: int = 1000, seed: int = 0) -> float:
    """The sampling variance of a pilot grid's best ρ (measured): each point's seeds resampled (their final
    held-out ``target`` means), the best point's measured ρ read per resample. Floored at (step / 2)² / 3,
    the variance of a uniform error over half the grid's median step: a grid locates no finer than its step.
    Complete pilots only; fewer than one complete pilot per point leaves that point out."""
    import numpy as np

    pilots = A.items("pilots", pilots, error=DesignError, what="race.core.records.PilotResult")
    for i, p in enumerate(pilots):
        A.instance(f"pilots[{i}]", p, PilotResult, error=DesignError, expected="a race.core.records.PilotResult")
    A.text("target", target, error=DesignError)
    n_boot = A.whole("n_boot", n_boot, error=DesignError, ge=1)
    by: dict[float, list[float]] = {}
    rho: dict[float, list[float]] = {}
    for p in pilots:
        if p.status != "complete" or not p.evals.get(target):
            continue
        by.setdefault(p.rho_target, []).append(sum(p.evals[target]) / len(p.evals[target]))
        rho.setdefault(p.rho_target, []).append(p.flops.rho)
    if not by:
        raise DesignError(f"pilots hold no complete pilot with held-out {target!r} scores: expected a pilot grid's results")
    ts = sorted(by)
    axis = [sum(rho[t]) / len(rho[t]) for t in ts]
    rng = np.random.default_rng(seed)
    picks = [axis[int(np.argmax([np.mean(rng.choice(by[t], len(by[t]))) for t in ts]))] for _ in range(n_boot)]
    steps = sorted(b - a for a, b in zip(axis, axis[1:]))
    step = (steps[(len(steps) - 1) // 2] + steps[len(steps) // 2]) / 2 if steps else 0.1
    return max(float(np.var(picks)), (step / 2) ** 2 / 3)


def move_sd(range_at_f: Mapping[str, Any]) -> float:
    """The SD of the drift's move from B to F in a range-at-F record (race.stats.drift.RangeAtBudget.to_dict):
    its 90 % CI's half-width over Z90 (past the validated factor that CI is already widened)."""
    rec = A.mapping("range_at_f", range_at_f, error=DesignError)
    if "shift_ci" not in rec or "recommended_rho" not in rec:
        raise DesignError(f"range_at_f {str(dict(rec))[:60]!r} must be a range at F record "
                          "(race.stats.drift.RangeAtBudget.to_dict: shift_ci, recommended_rho), not a refusal")
    lo, hi = rec["shift_ci"]
    return (float(hi) - float(lo)) / 2 / Z90


def prior_start(pilots: Sequence, range_at_f: Mapping[str, Any] | None, *, target: str = "reward",
                prior: float = POPULATION_RHO, prior_sd: float = POPULATION_RHO_TAU, spread: float = POPULATION_RHO_SD,
                n_boot: int = 1000, seed: int = 0) -> Shrunk:
    """RACE's prior-start recommendation at F (issue 49 item 7), the one rule both a verdict and the replay
    (research/scripts/replay.py, design "prior start + …") use: the range at F's recommended ρ, with
    σ² = the grid's seed variance of its best ρ (``seed_var_of_best``) + the drift move's variance
    (``move_sd``), shrunk toward the prior (``shrink_to_prior``). No range at F (None): the prior alone, its
    range from ``spread``."""
    if range_at_f is None:
        return shrink_to_prior(None, None, prior=prior, prior_sd=prior_sd, spread=spread)
    sigma2 = seed_var_of_best(pilots, target, n_boot=n_boot, seed=seed) + move_sd(range_at_f) ** 2
    return shrink_to_prior(float(range_at_f["recommended_rho"]), math.sqrt(sigma2), prior=prior, prior_sd=prior_sd)


@dataclass(frozen=True)
class SharePlan:
    """Pilots within ``share`` × F: ``pilots`` runs at ``budget`` FLOPs each, every one of them plus its
    held-out evaluation (``eval_flops`` per pilot, whatever its budget) inside the share; ``factor`` = F / budget."""

    full_run: float
    share: float
    pilots: int
    budget: float
    eval_flops: float
    factor: float

    @property
    def eval_share(self) -> float:
        """Held-out evaluation over a pilot's budget."""
        return self.eval_flops / self.budget

    @property
    def spent(self) -> float:
        return self.pilots * (self.budget + self.eval_flops)

    def to_dict(self) -> dict:
        return {"full_run": self.full_run, "share": self.share, "pilots": self.pilots, "budget": self.budget,
                "eval_flops": self.eval_flops, "eval_share": self.eval_share, "factor": self.factor,
                "spent": self.spent}


def plan_share(full_run: float, *, pilots: int, share: float = DEFAULT_SHARE, eval_flops: float = 0.0,
               min_budget: float = 0.0, max_factor: float | None = None) -> SharePlan:
    """The budget per pilot that spends ``share`` of ``full_run`` on ``pilots`` pilots, held-out
    evaluation counted (``eval_flops`` per pilot: its checkpoints and final evaluation cost the same
    whatever the pilot's budget, so a smaller pilot pays a larger share of it). Refused in one line when a
    pilot would get less than ``min_budget`` (the smallest budget whose steps plan: it buys nothing) or
    when F / B would pass ``max_factor`` (race.stats.drift.MAX_FACTOR: no range at F past it)."""
    F = A.number("full_run", full_run, error=DesignError, gt=0)
    n = A.whole("pilots", pilots, error=DesignError, ge=1)
    s = A.number("share", share, error=DesignError, gt=0, lt=1)
    E = A.number("eval_flops", eval_flops, error=DesignError, ge=0)
    B = s * F / n - E
    if B <= 0 or (min_budget and B < min_budget):
        raise DesignError(f"a share of {s:.0%} of a {F:.3g}-FLOP full run gives each of {n} pilots {max(B, 0.0):.3g} "
                          f"FLOPs after its {E:.3g} of held-out evaluation, under the {min_budget:.3g} its steps need: "
                          f"the pilots would buy nothing; raise the share to {n * (min_budget + E) / F:.0%}, run fewer "
                          f"pilots, or run at the prior (ρ {POPULATION_RHO:g}) without pilots")
    if max_factor and F / B > max_factor:
        raise DesignError(f"a share of {s:.0%} gives pilots of {B:.3g} FLOPs, {F / B:.0f} × below the full run: past "
                          f"the {max_factor:.0f} × the drift model extrapolates to; raise the share or run fewer pilots")
    return SharePlan(F, s, n, B, E, F / B)


@dataclass(frozen=True)
class PilotValue:
    """What pilots within ``share`` of the compute can win and what they cost, in pooled full-run SEs of
    held-out reward (rounds 1–2): ``at_stake`` is the prior alone's median regret (what a perfect pilot
    design would win back), ``cost`` what the share takes from the run (SE_PER_DOUBLING × log2(1/(1 − s))),
    ``best_case`` = at_stake − cost, and ``pays`` whether a perfect design would pay for itself."""

    share: float
    at_stake: float
    cost: float

    @property
    def best_case(self) -> float:
        return self.at_stake - self.cost

    @property
    def pays(self) -> bool:
        return self.best_case > 0

    def line(self) -> str:
        head = (f"What pilots can buy: the prior alone (ρ {POPULATION_RHO:g}) missed the full-run best by a median "
                f"{self.at_stake:.2f} pooled SEs on rounds 1–2; spending {self.share:.0%} of the compute on pilots costs "
                f"the run about {self.cost:.2f} (the reward a full run gains per doubling near its end, "
                f"{SE_PER_DOUBLING:g} SEs, × log2(1/(1 − {self.share:g})))")
        if not self.pays:
            return head + ("; even pilots that found the best ρ exactly would not pay for themselves at this share "
                           f"in a setting like the past ones: run at ρ {POPULATION_RHO:g} without pilots, or pilot "
                           "only where the setting is unlike rounds 1–2 (docs/pilot.md)")
        return head + (f"; pilots that found the best ρ exactly would gain at most {self.best_case:.2f} SEs net. On "
                       f"rounds 1–2 the flat grid missed by {FLAT_GRID_REGRET:.2f} (as much as the prior) at 1.2 full "
                       "runs of compute, and no cheaper design did better: expect the pilots to pay only where the "
                       "setting is unlike the past ones (docs/pilot.md, \"Replaying pilot designs\")")


def pilot_value(share: float) -> PilotValue:
    """The value of a pilot share (see ``PilotValue``)."""
    s = A.number("share", share, error=DesignError, ge=0, lt=1)
    return PilotValue(s, PRIOR_REGRET, SE_PER_DOUBLING * math.log2(1.0 / (1.0 - s)))
