"""Pilot designs as objects: how a share of the full run becomes pilots, or none (issues 49 and 52). Pure.

A design reads what a config asks for (its ρ points and seeds), the full run F, the share s of F the
pilots may spend, the smallest budget whose steps plan (``min_budget``: ``MIN_STEPS`` optimizer steps of
the costliest point) and the FLOPs of one pilot's held-out evaluation (``eval_flops``: its checkpoints and
final evaluation, the same whatever the pilot's budget), and returns a ``DesignPlan``:
the pilots it runs (ρ, seed index), each pilot's budget B, the factor F / B, and one line saying why.

- ``FlatGrid`` (``flat``): every point × every seed within the share, as ``race pilot`` runs a config;
  refused in one line when a pilot would get less than ``min_budget`` or F / B passes the drift model's
  range (``race.stats.design.plan_share``).
- ``FitShare`` (``fit``, the default of ``race plan --full-run``): the flat grid when it fits; else
  fewer pilots: one seed per point and a second one at the point nearest the prior (the regime rule
  needs one point with two seeds), then only the points nearest the prior, down to ``MIN_GRID_POINTS``
  (the fewest a verdict reads). At each number of pilots, before it drops to fewer, it thins the held-out
  evaluation (``EvalCut``, ``eval_cuts``): the config's own first, then 4 checkpoint evaluations, then 3.
  When even that does not fit, no pilots: the run takes the whole share at the prior ρ.
- ``PriorOnly`` (``prior``): no pilots; the run at the prior ρ (``POPULATION_RHO``) with the share.
- ``Halving`` (``halving``): every point × every seed to B/11, the best half continued to B (budget halving's
  ladder η 11, one rung, keep ``top-half``: ``race pilot`` runs it as ``--adaptive-policy budget-halving``), B
  as large as the share allows; it spends points × seeds × B/η + kept × seeds × (B − B/η) of training plus
  the held-out evaluation budget halving counts (``halving_spend``: checkpoints, each pilot's reading at its
  last mark, the final passes), so at equal share its B is about 1.8 × the flat grid's. Where it does not
  fit it thins the evaluation as ``fit`` does, then refuses in one line that says what share would fit.

Why ``fit`` falls back to the prior rather than to weaker pilots: on rounds 1–2 no design cheaper than
the flat grid at B (1.2 full runs) beat the prior's median regret, and reads at a tenth of B lost the
regime in 14–16 of 17 grids (docs/pilot.md, "Replaying pilot designs"); pilots below ``MIN_STEPS``
steps learn nothing to read.

How ``fit`` thins evaluation, and why only so far (docs/pilot.md, "What held-out evaluation buys"): on rounds
1–2's flat grids, 3 checkpoint evaluations (base, 0.17 B, 0.55 B) on 100 prompts kept the grid's coverage
and regret (21/24, 0.63 pooled SEs against 0.60) at 62 % of the evaluation, while a final pass cut from
500 prompts to 200 raised the regret to 0.79: the final pass is never thinned. The thinnest cut keeps 3
budget levels (0.17, 0.55, 1) for the pilots' own drift (race.stats.drift.fit_joint needs 2); the cut of
4 (0.093, 0.17, 0.55) also keeps the ``MIN_PREFIX_POINTS`` (3) checkpoints below the end that the forecast
of reward at F (race.stats.forecast) backtests on, and is tried first.

Invariants: a plan never spends more than its share (``halving``: with every pilot counted at the most the
ladder keeps); no pilot gets less than ``min_budget``; a plan
with no pilots says so and gives its share back to the full run. ``DESIGNS`` is the one table of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from race.config.checkpoints import (DEFAULT_CHECKPOINT_PROMPTS, DEFAULT_CHECKPOINTS, checkpoint_fractions,
                                     checkpoint_prompts, checkpoints_on)
from race.core import arguments as A
from race.stats.design import (DEFAULT_SHARE, MIN_STEPS, POPULATION_GRIDS, POPULATION_RHO, POPULATION_RHO_SD,
                               DesignError, SharePlan, pilot_value, plan_share, shrink_to_prior)
from race.stats.drift import MAX_FACTOR, VALIDATED_FACTOR
from race.stats.regime import MIN_GRID_POINTS


_LADDER = checkpoint_fractions(DEFAULT_CHECKPOINTS)        # 1/64, 0.028, 0.051, 0.093, 0.17, 0.30, 0.55
# the checkpoint fractions below 1 a thinned evaluation keeps (the base and the end are implied), least thinned
# first: 4 evaluations keep the forecast's 3 points below the end; 3 are what the replay measured
THINNED_CHECKPOINTS = (tuple(round(_LADDER[i], 4) for i in (3, 4, 6)), tuple(round(_LADDER[i], 4) for i in (4, 6)))
THINNED_CHECKPOINT_PROMPTS = DEFAULT_CHECKPOINT_PROMPTS    # at most the 100 prompts per checkpoint the replay read


@dataclass(frozen=True)
class EvalCut:
    """A thinner held-out evaluation than the config's: ``eval.checkpoints`` as these fractions,
    ``eval.checkpoint_prompts`` this many, the final pass as configured; ``flops``: one pilot's evaluation
    with it, ``as_configured``: with the config's."""

    checkpoints: tuple[float, ...]
    checkpoint_prompts: int
    flops: float
    as_configured: float

    def to_dict(self) -> dict:
        return {"checkpoints": list(self.checkpoints), "checkpoint_prompts": self.checkpoint_prompts,
                "flops": self.flops, "as_configured": self.as_configured}

    @classmethod
    def from_dict(cls, d: dict) -> "EvalCut":
        return cls(tuple(d["checkpoints"]), int(d["checkpoint_prompts"]), d["flops"], d["as_configured"])

    def phrase(self) -> str:
        at = ", ".join(f"{f:.2g}" for f in self.checkpoints)
        return (f"held-out evaluation thinned to {1 + len(self.checkpoints)} checkpoint evaluations (base, {at}) of "
                f"{self.checkpoint_prompts} prompts, the final pass kept whole: {self.flops:.3g} FLOPs a pilot instead "
                f"of {self.as_configured:.3g}")


@dataclass(frozen=True)
class EvalLayout:
    """Where one pilot's held-out evaluation falls: ``base`` (the step-0 checkpoint, when checkpoints are on),
    checkpoint ``fractions`` of its budget of ``checkpoint_prompts`` each, a final pass (or a reading at a
    mark) of ``prompts``, each prompt ``per_prompt`` FLOPs. ``halving`` counts what a paused pilot spent."""

    fractions: tuple[float, ...]
    checkpoint_prompts: int
    prompts: int
    per_prompt: float
    base: bool = True

    def between(self, lo: float, hi: float) -> float:
        """FLOPs of the checkpoint evaluations at fractions in [lo, hi) (the base with lo 0)."""
        n = sum(1 for f in self.fractions if lo <= f < hi) + (1 if self.base and lo == 0 else 0)
        return n * self.checkpoint_prompts * self.per_prompt

    @property
    def final(self) -> float:
        return self.prompts * self.per_prompt

    def cut(self, cut: EvalCut) -> "EvalLayout":
        return EvalLayout(cut.checkpoints, cut.checkpoint_prompts, self.prompts, self.per_prompt, True)


def eval_layout(config, eval_flops: float) -> EvalLayout:
    """``config``'s held-out evaluation as an ``EvalLayout`` costing ``eval_flops`` a pilot in all."""
    e = config.eval
    on = checkpoints_on(e.checkpoints)
    fracs = tuple(checkpoint_fractions(e.checkpoints)) if on else ()
    cp = checkpoint_prompts(e.prompts, e.checkpoint_prompts)
    prompts = ((1 + len(fracs)) * cp if on else 0) + e.prompts
    return EvalLayout(fracs, cp, e.prompts, eval_flops / prompts if prompts else 0.0, on)


def eval_cuts(config, eval_flops: float) -> tuple[EvalCut, ...]:
    """The thinner evaluations ``fit`` may run for ``config`` (its ``eval``), least thinned first, each cheaper
    than the config's own (``eval_flops`` a pilot: race.flops.grid.eval_flops, which counts prompts × the same
    cost per prompt, so a cut costs ``eval_flops`` × its prompts over the config's). None with checkpoints off
    or already as thin."""
    e = config.eval
    cp = checkpoint_prompts(e.prompts, e.checkpoint_prompts)
    runs = 1 + len(checkpoint_fractions(e.checkpoints)) if checkpoints_on(e.checkpoints) else 0
    full = runs * cp + e.prompts
    thin_cp = min(cp, THINNED_CHECKPOINT_PROMPTS)
    out = []
    for fracs in THINNED_CHECKPOINTS:
        n = (1 + len(fracs)) * thin_cp + e.prompts
        if eval_flops > 0 and n < full:
            out.append(EvalCut(fracs, thin_cp, eval_flops * n / full, eval_flops))
    return tuple(out)


@dataclass(frozen=True)
class DesignPlan:
    """The pilots a design runs within ``share`` of ``full_run`` (none: ``pilots`` empty, the prior)."""

    design: str
    full_run: float
    share: float
    eval_flops: float                          # FLOPs of one pilot's held-out evaluation
    pilots: tuple[tuple[float, int], ...]      # (ρ, seed index 0 …)
    budget: float                              # FLOPs per pilot (0 with no pilots)
    why: str
    prior: float = POPULATION_RHO
    dropped: tuple[float, ...] = field(default=())
    eval_cut: EvalCut | None = None            # the thinner evaluation its pilots run (None: the config's)
    halving: dict | None = None                # ``halving``'s ladder and spend (``Halving``; None: one budget)

    @property
    def points(self) -> tuple[float, ...]:
        return tuple(sorted({r for r, _ in self.pilots}))

    @property
    def spent(self) -> float:
        """FLOPs the pilots spend, held-out evaluation counted."""
        return self.spent_at()

    def spent_at(self, eval_ratio: float = 1.0) -> float:
        """``spent`` with the held-out evaluation ``eval_ratio`` × its estimate (training is metered to B
        whatever the lengths: race.run.sizing.overrun_line, at the calibrated lengths)."""
        if self.halving:
            return self.halving["training"] + self.halving["evaluation"] * eval_ratio
        return len(self.pilots) * (self.budget + self.eval_flops * eval_ratio)

    @property
    def eval_share(self) -> float | None:
        """Held-out evaluation over a pilot's budget (None with no pilots)."""
        return self.eval_flops / self.budget if self.budget else None

    @property
    def factor(self) -> float | None:
        return self.full_run / self.budget if self.budget else None

    def to_dict(self) -> dict:
        return {"design": self.design, "full_run": self.full_run, "share": self.share, "eval_flops": self.eval_flops,
                "eval_share": self.eval_share,
                "pilots": [list(p) for p in self.pilots], "points": list(self.points), "budget": self.budget,
                "spent": self.spent, "factor": self.factor, "prior": self.prior, "dropped": list(self.dropped),
                "eval": self.eval_cut.to_dict() if self.eval_cut else None, "why": self.why,
                **({"halving": dict(self.halving)} if self.halving else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "DesignPlan":
        """The plan ``to_dict`` recorded (what ``line`` says of it)."""
        return cls(d["design"], d["full_run"], d["share"], d["eval_flops"], tuple(map(tuple, d["pilots"])),
                   d["budget"], d["why"], d.get("prior", POPULATION_RHO), tuple(d.get("dropped", ())),
                   EvalCut.from_dict(d["eval"]) if d.get("eval") else None, d.get("halving"))

    def line(self) -> str:
        if not self.pilots:
            return f"design {self.design}: no pilots; {self.why}"
        seeds = {r: sum(1 for q, _ in self.pilots if q == r) for r in self.points}
        grid = ", ".join(f"{r:g}" + (f" ×{n}" if n > 1 else "") for r, n in seeds.items())
        cut = f"; {self.eval_cut.phrase()}" if self.eval_cut else ""
        if self.halving:
            h = self.halving
            rungs = ", ".join(f"{a} ρ to {m:.3g}" for a, m in zip(h["alive"], h["marks"]))
            return (f"design {self.design}: {len(self.pilots)} pilots (ρ {grid}) on budget halving's ladder (η {h['eta']}, "
                    f"{h['rungs']} rung{'s' if h['rungs'] > 1 else ''} below B, keep {h['keep']}): {rungs} FLOPs, "
                    f"each seed continued from its mark; B = {self.budget:.3g} FLOPs, F / B = {self.factor:.3g}; spends "
                    f"{self.spent:.3g} FLOPs ({self.spent / self.full_run:.1%} of F): training {h['training']:.3g}, "
                    f"held-out evaluation {h['evaluation']:.3g} (checkpoints, each pilot's reading at its last mark, "
                    f"the final passes){cut}")
        return (f"design {self.design}: {len(self.pilots)} pilots (ρ {grid}) at {self.budget:.3g} FLOPs each, "
                f"F / B = {self.factor:.3g}; {self.why}" + cut)


class PilotDesign(Protocol):
    """One pilot design: its name (``race plan --design``) and how it spends a share of the full run."""

    name: str

    def plan(self, grid: Sequence[float], seeds: int, *, full_run: float, share: float, min_budget: float,
             eval_flops: float = 0.0, max_factor: float | None = None,
             thinner: Sequence[EvalCut] = (), layout: EvalLayout | None = None) -> DesignPlan:
        ...


def _checked(grid: Sequence[float], seeds: int, full_run: float, share: float, min_budget: float,
             eval_flops: float) -> tuple[list[float], int, float, float, float, float]:
    points = sorted(A.number("grid point", r, error=DesignError, gt=0, lt=1) for r in grid)
    if not points:
        raise DesignError("grid []: expected at least one ρ")
    return (points, A.whole("seeds", seeds, error=DesignError, ge=1),
            A.number("full_run", full_run, error=DesignError, gt=0),
            A.number("share", share, error=DesignError, gt=0, lt=1),
            A.number("min_budget", min_budget, error=DesignError, ge=0),
            A.number("eval_flops", eval_flops, error=DesignError, ge=0))


@dataclass(frozen=True)
class FlatGrid:
    """Every point × every seed within the share (race.stats.design.plan_share; refused in one line)."""

    name: str = "flat"

    def plan(self, grid: Sequence[float], seeds: int, *, full_run: float, share: float, min_budget: float,
             eval_flops: float = 0.0, max_factor: float | None = None,
             thinner: Sequence[EvalCut] = (), layout: EvalLayout | None = None) -> DesignPlan:
        points, n, F, s, lo, e = _checked(grid, seeds, full_run, share, min_budget, eval_flops)
        fit = plan_share(F, pilots=len(points) * n, share=s, eval_flops=e, min_budget=lo, max_factor=max_factor)
        return DesignPlan(self.name, F, s, e, tuple((r, k) for r in points for k in range(n)), fit.budget,
                          "the config's grid, every seed")


@dataclass(frozen=True)
class PriorOnly:
    """No pilots: the run at the prior ρ, with the share given back to it."""

    name: str = "prior"

    def plan(self, grid: Sequence[float], seeds: int, *, full_run: float, share: float, min_budget: float,
             eval_flops: float = 0.0, max_factor: float | None = None,
             thinner: Sequence[EvalCut] = (), layout: EvalLayout | None = None) -> DesignPlan:
        points, _, F, s, _, e = _checked(grid, seeds, full_run, share, min_budget, eval_flops)
        return DesignPlan(self.name, F, s, e, (), 0.0,
                          f"run at the prior ρ {POPULATION_RHO:g} ({_prior_range()}) with the whole compute (F plus the {s:.0%} share)")


@dataclass(frozen=True)
class FitShare:
    """The flat grid when it fits the share; else fewer pilots nearest the prior; else the prior. Before each
    drop to fewer pilots, the held-out evaluation ``thinner`` (``eval_cuts``, least thinned first)."""

    name: str = "fit"

    def plan(self, grid: Sequence[float], seeds: int, *, full_run: float, share: float, min_budget: float,
             eval_flops: float = 0.0, max_factor: float | None = None,
             thinner: Sequence[EvalCut] = (), layout: EvalLayout | None = None) -> DesignPlan:
        points, n, F, s, lo, e = _checked(grid, seeds, full_run, share, min_budget, eval_flops)
        evals: tuple[EvalCut | None, ...] = (None, *thinner)
        for cut in evals:
            ev = cut.flops if cut else e
            try:
                flat = FlatGrid().plan(points, n, full_run=F, share=s, min_budget=lo, eval_flops=ev,
                                       max_factor=max_factor)
            except DesignError:
                continue
            return DesignPlan(self.name, F, s, ev, flat.pilots, flat.budget, "the config's grid fits the share",
                              eval_cut=cut)
        near = sorted(points, key=lambda r: (abs(math.log(r) - math.log(POPULATION_RHO)), r))
        for k in range(len(points), MIN_GRID_POINTS - 1, -1):
            kept = sorted(near[:k])
            pilots = tuple((r, 0) for r in kept) + ((near[0], 1),)
            for cut in evals:
                ev = cut.flops if cut else e
                B = s * F / len(pilots) - ev
                if B > 0 and B >= lo and (max_factor is None or F / B <= max_factor):
                    dropped = tuple(r for r in points if r not in kept)
                    why = ("the flat grid does not fit the share: one seed per point, a second at the point nearest "
                           "the prior" + (f", points {', '.join(f'{r:g}' for r in dropped)} dropped" if dropped else ""))
                    return DesignPlan(self.name, F, s, ev, pilots, B, why, dropped=dropped, eval_cut=cut)
        thin = evals[-1]
        held = (f" plus {thin.flops:.3g} of held-out evaluation each (thinned to {1 + len(thin.checkpoints)} checkpoint "
                f"evaluations; {thin.as_configured:.3g} as configured)" if thin
                else f" plus {e:.3g} of held-out evaluation each" if e else "")
        return DesignPlan(self.name, F, s, e, (), 0.0,
                          f"not even {MIN_GRID_POINTS + 1} pilots ({MIN_GRID_POINTS} points, one with two seeds) of "
                          f"{lo:.3g} FLOPs{held} fit a {s:.0%} share: run at the prior ρ {POPULATION_RHO:g} "
                          f"({_prior_range()}) with the whole compute")


HALVING_ETA, HALVING_RUNGS, HALVING_KEEP = 11, 1, "top-half"   # the ladder of `halving` and budget halving's default


def ladder_alive(points: int, *, rungs: int = HALVING_RUNGS, keep: str | int = HALVING_KEEP,
                 eta: int = HALVING_ETA) -> list[int]:
    """How many ρ run at each rung 0 … ``rungs`` of budget halving from ``points`` (race.run.adaptive.budget
    .rung_survivors' most: ``top-half`` ⌈n/2⌉, k at most k, ``ci`` at most ⌈n/η⌉)."""
    alive = [points]
    for _ in range(rungs):
        n = alive[-1]
        alive.append(math.ceil(n / 2) if keep == "top-half" else math.ceil(n / eta) if keep == "ci" else min(int(keep), n))
    return alive


def halving_spend(points: int, seeds: int, budget: float, layout: EvalLayout, *, eta: int = HALVING_ETA,
                  rungs: int = HALVING_RUNGS, keep: str | int = HALVING_KEEP) -> tuple[float, float]:
    """(training, held-out evaluation) FLOPs of a grid of ``points`` × ``seeds`` on budget halving's ladder
    with top ``budget``, counted as race.run.rungs.halving_compute counts them: every ρ alive at rung r trains
    from mark r − 1 to mark r (marks ``budget`` / η^(rungs − r)), evaluates the checkpoints that fall there
    (the base at rung 0) and reads the final evaluation's prompts at its mark (at the top: its final pass)."""
    alive = ladder_alive(points, rungs=rungs, keep=keep, eta=eta)
    marks = [0.0] + [eta ** -(rungs - r) for r in range(rungs + 1)]
    train = sum(a * (marks[r + 1] - marks[r]) for r, a in enumerate(alive)) * seeds * budget
    ev = sum(a * (layout.between(marks[r], marks[r + 1]) + layout.final) for r, a in enumerate(alive)) * seeds
    return train, ev


@dataclass(frozen=True)
class Halving:
    """Every point × every seed to B/η, the best half on to B (η 11, one rung: the ladder docs/pilot.md's replay
    and live check measured at 0.54–0.55 of the flat grid's training with its coverage), B as large as the share
    allows with the evaluation counted (``halving_spend``); before refusing, the held-out evaluation
    ``thinner``; refused in one line saying what would fit. ``race pilot`` runs it as
    ``--adaptive-policy budget-halving`` with this ladder (race.run.options.RunOptions.rule)."""

    name: str = "halving"

    def plan(self, grid: Sequence[float], seeds: int, *, full_run: float, share: float, min_budget: float,
             eval_flops: float = 0.0, max_factor: float | None = None,
             thinner: Sequence[EvalCut] = (), layout: EvalLayout | None = None) -> DesignPlan:
        points, n, F, s, lo, e = _checked(grid, seeds, full_run, share, min_budget, eval_flops)
        base = layout or EvalLayout((), 0, 1, e, False)          # unknown layout: every reading costs it all
        depth = HALVING_ETA ** HALVING_RUNGS
        alive = ladder_alive(len(points))
        unit = halving_spend(len(points), n, 1.0, EvalLayout((), 0, 0, 0.0, False))[0]   # training per FLOP of B
        # B plans MIN_STEPS steps (as fit's pilots) and its mark at least one step: the live check paused pilots of
        # 11–16 steps at their first or second step (docs/pilot.md, "Live check of the replay")
        need = max(lo, lo / MIN_STEPS * depth, F / max_factor if max_factor else 0.0)
        for cut in (None, *thinner):
            lay = base.cut(cut) if cut else base
            ev = halving_spend(len(points), n, 0.0, lay)[1]
            B = (s * F - ev) / unit
            if B > 0 and B >= need:
                record = {"eta": HALVING_ETA, "rungs": HALVING_RUNGS, "keep": HALVING_KEEP, "alive": alive,
                          "marks": [B / HALVING_ETA ** (HALVING_RUNGS - r) for r in range(HALVING_RUNGS + 1)],
                          "training": unit * B, "evaluation": ev, "spent": unit * B + ev}
                return DesignPlan(self.name, F, s, cut.flops if cut else e, tuple((r, k) for r in points for k in range(n)),
                                  B, "every point × every seed to B/η, the best half continued to B", eval_cut=cut,
                                  halving=record)
        fits = (unit * need + ev) / F
        raise DesignError(f"design halving: {len(points)} ρ × {n} seeds to B/{depth}, the best {alive[-1]} on to B, need "
                          f"B ≥ {need:.3g} FLOPs ({MIN_STEPS} steps, one step by B/{depth}" + (f", F / B ≤ {max_factor:g}" if max_factor
                          else "") + f"): {unit * need + ev:.3g} FLOPs with held-out evaluation"
                          + (" thinned" if thinner else "") + f", {fits:.1%} of F, over a {s:.0%} share: expected "
                          + (f"--share {math.ceil(fits * 100) / 100:g} or more, " if fits < 1 else "")
                          + f"--full-run {_up(max(unit * need + ev, F * s) / s)} or more at this share, or --design fit")


def _up(x: float) -> str:
    """``x`` rounded up to 2 significant digits, as a full run to name."""
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return f"{math.ceil(x / scale - 1e-9) * scale:.2g}"


def _prior_range() -> str:
    """The prior alone's 90 % range (race.stats.design.shrink_to_prior with no pilots), as the no-pilot lines say it."""
    alone = shrink_to_prior(None, None)
    return f"90% range [{alone.low:.2f}, {alone.high:.2f}], the prior alone"


DESIGNS: dict[str, PilotDesign] = {d.name: d for d in (FitShare(), FlatGrid(), PriorOnly(), Halving())}   # the first: default


def design_named(name: str) -> PilotDesign:
    """The design called ``name``, or a one-line DesignError naming the choices."""
    if name not in DESIGNS:
        raise DesignError(f"pilot design {name!r} is unknown: expected one of grid (the config as written), "
                          f"{', '.join(DESIGNS)}")
    return DESIGNS[name]


def choose(plan, *, full_run: float, share: float = DEFAULT_SHARE, eval_flops: float = 0.0,
           design: str = "fit") -> DesignPlan:
    """What ``design`` runs within ``share`` of ``full_run`` for the planned grid ``plan``
    (race.flops.grid.Plan: its points, seeds and costliest step; ``eval_flops``: one pilot's held-out
    evaluation; ``fit`` may thin it, ``eval_cuts``). The one place ``race plan``, ``race pilot`` and ``race init`` size pilots from F."""
    c = plan.config
    F = A.number("full_run", full_run, error=DesignError, gt=0)
    per_step = max(s.flops_per_step.total for s in plan.schedules)
    return design_named(design).plan(c.grid, c.seeds, full_run=F, share=share, min_budget=MIN_STEPS * per_step,
                                     eval_flops=eval_flops, max_factor=MAX_FACTOR,
                                     thinner=eval_cuts(c, A.number("eval_flops", eval_flops, error=DesignError, ge=0)),
                                     layout=eval_layout(c, eval_flops))


def render_share(plan, *, full_run: float, share: float = DEFAULT_SHARE, eval_flops: float = 0.0,
                 design: str = "fit", fmt: str = "text") -> str:
    """``race plan --full-run F``: the grid's table (race.stats.report.render_plan), then what the grid costs of F,
    what ``share`` of F buys under pilot ``design`` (``choose``; ``flat`` refuses when a pilot would get fewer
    than ``MIN_STEPS`` steps of its costliest point, ``fit`` thins the held-out evaluation and falls back to fewer
    pilots, then to the prior, ``halving`` thins it and then refuses),
    and what pilots are worth (``pilot_value``). ``eval_flops``: one pilot's held-out evaluation. JSON: the
    plan's object with ``full_run`` added."""
    import json

    from race.stats.report import SCHEMA_VERSION, check_format, fmt_flops, render_plan

    check_format(fmt)
    c = plan.config
    pilots = len(plan.schedules) * c.seeds
    grid_cost = plan.grid_flops + pilots * eval_flops
    if design == "grid":         # the config as written, whatever its share (race pilot --design grid runs it)
        F = A.number("full_run", full_run, error=DesignError, gt=0)
        chosen, within = None, None
        value = pilot_value(A.number("share", share, error=DesignError, gt=0, lt=1))
    else:
        chosen = choose(plan, full_run=full_run, share=share, eval_flops=eval_flops, design=design)
        F = chosen.full_run
        within = SharePlan(F, chosen.share, len(chosen.pilots), chosen.budget, chosen.eval_flops,
                           chosen.factor).to_dict() if chosen.pilots else None     # the design's own plan, not recomputed
        if within is not None and chosen.halving:
            within["spent"] = chosen.spent                  # the ladder's spend: most pilots stop at B/η
        value = pilot_value(chosen.share)
    ev_share = eval_flops / c.budget
    info = {"full_run": F, "grid_cost": grid_cost, "grid_share": grid_cost / F, "grid_factor": F / c.budget,
            "within_share": within, "design": chosen.to_dict() if chosen else {"name": "grid"},
            "validated_factor": VALIDATED_FACTOR,
            "value": {"at_stake": value.at_stake, "cost": value.cost, "best_case": value.best_case,
                      "pays": value.pays, "line": value.line()},
            "prior": {"rho": POPULATION_RHO, "sd": POPULATION_RHO_SD, "grids": POPULATION_GRIDS,
                      "start": shrink_to_prior(None, None).to_dict()}}
    if fmt == "json":
        body = json.loads(render_plan(plan, "json"))
        return json.dumps({**body, "schema_version": SCHEMA_VERSION, "full_run": info}, indent=2)

    def reach(factor: float) -> str:
        return ("within the " if factor <= VALIDATED_FACTOR else "past the ") + \
            f"{VALIDATED_FACTOR:.0f} × the range at F is validated to"
    if chosen is None:
        within_line = "  design grid: the config as written, whatever the share (race pilot --design grid runs it)"
    else:
        within_line = (f"  within a {chosen.share:.0%} share: {chosen.line()} ({reach(chosen.factor)})" if chosen.pilots
                       else f"  within a {chosen.share:.0%} share: {chosen.line()}")
    lines = [render_plan(plan, fmt).rstrip("\n"), "",
             f"Against the full run F = {fmt_flops(F)} FLOPs:",
             f"  this grid: {pilots} pilots × {fmt_flops(c.budget)} = {fmt_flops(grid_cost)} FLOPs with held-out "
             f"evaluation (+{ev_share:.0%}), {grid_cost / F:.0%} of F; F / B = {F / c.budget:.3g} ({reach(F / c.budget)})",
             within_line,
             f"  before any: the prior ρ {POPULATION_RHO:g} (SD {POPULATION_RHO_SD:g}, {_prior_range()}: the median "
             f"full-run best of {POPULATION_GRIDS} grids of rounds 1–2); pilots move it only as far as their evidence "
             "allows (the verdict's prior-start line); race pilot checks the base pass rate after calibration",
             f"  {value.line()}", ""]
    return "\n".join(lines)
