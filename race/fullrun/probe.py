"""The length probe: the learning rate tested at the full run's length, before the full run.

A pilot grid tests η over a pilot's few hundred steps; a full run 10 × or 100 × longer can still
collapse (RACE's validation study, docs/stability.md). The probe runs η for the full run's number
of optimizer steps, cheaply:

- one run of the policy at the pilot verdict's recommended ρ (or ``rho``), with the full run's
  knobs at F (n_gen, n_train, μ) and its η held fixed (``lr`` overrides it), but **1 prompt per
  step** instead of the full plan's B_p, so it costs F / B_p FLOPs for the same step count;
- capped at ``PROBE_SHARE`` of the pilot grid's compute; a capped probe covers that share of the
  full run's steps, and its record says how much (``covers``);
- held-out checkpoints on (race.stats.instability), as every pilot; its verdict is
  ``race.stats.instability.probe_fall``: it *fell* when it ends below its base policy.

``race.run.api.run_probe`` runs it (race.engine.pilot.run_pilot, seed 0); ``race probe DIR --full-run F``
and ``race pilot --full-run F --probe`` call that. The record (``probe_record``) is a plain mapping stored in the results file under ``probes``
(one per full-run budget and η, a newer one replacing an older); the forecast, the report and
``race recipe`` read it through ``race.stats.instability.stability_at``.

Invariants: ``plan_probe`` is pure and refuses, as one line before any compute, what it cannot
probe (no complete pilots, no recommended ρ, F not above the pilot budget or past
race.stats.drift.MAX_FACTOR × it: ``check_full_run``; a probe that would cover under ``MIN_COVER`` of the
full run's steps); ``race pilot --probe`` and ``race.diagnose(probe=True)`` refuse those F-dependent
cases before calibration and before any pilot, from the config alone (``check_probe_config``); the record's ``covers`` is what the probe ran, ``planned_covers`` what its plan
promised, and a probe that held over less than the whole run vouches for no more than it ran
(race.stats.instability.stability_at); the probe never changes the pilots or the verdict of the results
it is stored in.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from race.stats.instability import probe_fall
from race.core.errors import RaceError

PROBE_SHARE = 0.25          # the probe's cost, at most, as a share of the pilot grid's compute
PROBE_PROMPTS = 1           # prompts per step of the probe (the full run's B_p otherwise)
MIN_COVER = 0.05            # a probe that would run under this share of the full run's steps is refused before it runs
# before the grid, the probe's coverage is known up to the pilots' real compute (a pilot stops on FLOPs and may
# run a step past its budget) and the full run's whole steps: refused then only when even this many times the
# config's estimate is under MIN_COVER (the cases between are plan_probe's, after the grid, on its real compute)
COVER_SLACK = 1.1


def check_full_run(pilot_budget: float, full_run_budget: float) -> float:
    """F over B, refused in one line (before any compute) unless B < F ≤ race.stats.drift.MAX_FACTOR × B."""
    from race.stats.drift import MAX_FACTOR

    B, F = float(pilot_budget), float(full_run_budget)
    if not F > B:
        raise RaceError(f"full-run budget {F:.3g} is not above the pilot budget {B:.3g}: the pilots already "
                        "ran that long; the probe is for longer runs")
    if F / B > MAX_FACTOR * (1 + 1e-9):
        raise RaceError(f"full-run budget {F:.3g} is {F / B:.3g} × the pilot budget {B:.3g}, past the "
                        f"{MAX_FACTOR:g} × RACE extrapolates to: a probe capped at {PROBE_SHARE:.0%} of the grid's "
                        f"compute would cover almost none of that run; run pilots of ≥ {F / MAX_FACTOR:.3g} FLOPs "
                        "each first")
    return F / B


def cover_bound(config: Any, full_run_budget: float, *, pilots: int | None = None) -> float:
    """The most of the full run's optimizer steps a probe after ``config``'s grid could cover, from the
    config alone: PROBE_SHARE · G · B_p / F, capped at 1, with G = ``pilots`` (default: the grid's
    points × seeds) × the budget per pilot and B_p the full run's prompts per step.

    Why it holds whatever the calibration finds and whatever ρ the verdict picks: the probe and the
    full run are planned at one ρ with the same knobs (race.flops.grid.choose_knobs depends on ρ and
    the lengths, not on the budget or the prompts per step), so a probe step of PROBE_PROMPTS prompt
    costs 1 / B_p of a full-run step, and the probe's budget is at most PROBE_SHARE × the grid's
    compute (``plan_probe``). Measured against ``plan_probe`` on docs/runs' grids: within 0.6 %."""
    n = int(pilots) if pilots is not None else len(config.grid) * int(config.seeds)
    grid_flops = n * float(config.budget)
    return min(1.0, PROBE_SHARE * grid_flops * config.schedule.prompts_per_step
               / (PROBE_PROMPTS * float(full_run_budget)))


def check_probe_config(config: Any, full_run_budget: float, *, pilots: int | None = None) -> float:
    """Every F-dependent refusal of the probe that the config alone decides, before calibration and
    before any pilot runs: F not above the budget or past MAX_FACTOR × it (``check_full_run``), and a
    probe that cannot cover MIN_COVER of the full run's steps (``cover_bound``, with COVER_SLACK).
    ``pilots``: the most pilots the grid can run (an adaptive grid's cap, an extension's added
    points), default its points × seeds. Returns the coverage bound."""
    B, F = float(config.budget), float(full_run_budget)
    check_full_run(B, F)
    cover = cover_bound(config, F, pilots=pilots)
    if cover * COVER_SLACK < MIN_COVER:
        n = int(pilots) if pilots is not None else len(config.grid) * int(config.seeds)
        raise RaceError(f"the length probe at F = {F:.3g} ({F / B:.3g} × B) could cover at most {cover:.1%} of the "
                        f"full run's optimizer steps (it is capped at {PROBE_SHARE:.0%} of the grid's compute, "
                        f"{n} pilots of {B:.3g} FLOPs), under the {MIN_COVER:.0%} it needs to say anything of the "
                        f"run's length: this grid's probe covers that much of runs up to about "
                        f"{F / B * cover / MIN_COVER:.3g} × B; run pilots with a larger budget (or more "
                        "of them) for this F; nothing was run")
    return cover


class ProgressLines:
    """The probe's progress for the person waiting on it (one run of many steps: no pilot lines):
    ``say(line)`` each time the FLOPs spent pass another tenth of its budget, with the step, the
    time so far and the time left at the pace so far. race.engine.pilot.run_pilot calls it after every
    step as ``(steps, flops spent)``; nothing is said at the last step (the report follows)."""

    def __init__(self, budget: float, steps: int, *, say: Callable[[str], Any], every: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget, self.steps, self.say, self.every, self.clock = budget, steps, say, every, clock
        self.start, self.next, self.first = clock(), every, None

    def __call__(self, steps: int, spent: float) -> None:
        done, now = spent / self.budget, self.clock()
        if self.first is None:           # the pace counts from the first step: loading and the base
            self.first = (now, done)     # policy's evaluation come before it
        if done < self.next or done >= 1.0:
            return
        while self.next <= done:
            self.next += self.every
        t1, d1 = self.first
        left = (now - t1) / (done - d1) * (1 - done) if done > d1 else None
        self.say(f"probe: {done:.0%} of its budget, step {steps:,} of about {self.steps:,}, "
                 f"{_clock(now - self.start)} elapsed" + (f", about {_clock(left)} left" if left is not None else ""))


def _clock(seconds: float) -> str:
    """``42 s``, ``7 min``, ``2 h 05 min``: a wait as a person reads it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass(frozen=True)
class ProbePlan:
    full_run_budget: float
    rho: float
    learning_rate: float       # η, held fixed over the probe (the full run's at F, or the one asked for)
    schedule: Any              # race.core.records.Schedule of the probe
    full_steps: int            # optimizer steps of the full run at F (its plan at ρ)
    full_prompts_per_step: int
    grid_flops: float          # the pilot grid's compute
    config: Any                # race.config.configfile.GridConfig the probe runs with

    @property
    def budget(self) -> float:
        return self.schedule.flops.total

    @property
    def covers(self) -> float:
        """Share of the full run's optimizer steps the probe makes (1 unless capped)."""
        return min(1.0, self.schedule.steps * self.schedule.mu / max(1, self.full_steps))

    @property
    def share(self) -> float:
        """The probe's cost as a share of the pilot grid's."""
        return self.budget / self.grid_flops if self.grid_flops else float("nan")

    def line(self) -> str:
        return (f"length probe at F = {self.full_run_budget:.3g}: ρ {self.rho:.2f}, η {self.learning_rate:.3g}, "
                f"{self.schedule.steps} steps of {self.schedule.prompts_per_step} prompt × {self.schedule.n_gen} "
                f"rollouts" + (f", μ {self.schedule.mu}: {self.schedule.steps * self.schedule.mu} optimizer steps"
                               if self.schedule.mu > 1 else "")
                + f" ({self.covers:.0%} of the full run's {self.full_steps} optimizer steps), {self.budget:.3g} FLOPs "
                f"= {self.share:.0%} of the pilot grid's compute")


def plan_probe(results: Any, full_run_budget: float, *, rho: float | None = None, lr: float | None = None,
               base_dir: str | None = None) -> ProbePlan:
    """The probe for ``results`` (race.stats.results.Results of a finished grid) at ``full_run_budget``."""
    from race.config.configfile import config_from_dict
    from race.flops.grid import CostModel, plan_schedule
    from race.flops.specs import policy_arch, reward_spec

    done = [p for p in results.pilots if p.status == "complete"]
    if not done:
        raise RaceError("the length probe needs a finished pilot grid: these results have no complete pilot")
    raw = dict(results.config or {})
    if not raw:
        raise RaceError("the length probe needs the run config stored in the results file; this one has none")
    budget = float(raw.get("budget") or 0.0)
    F = float(full_run_budget)
    check_full_run(budget, F)
    if rho is None:
        if results.diagnosis is None:
            raise RaceError("the length probe needs the grid's verdict (its recommended ρ), or --rho")
        rho = float(results.diagnosis.recommended_rho)
    if not 0.0 < rho < 1.0:
        raise RaceError(f"ρ {rho!r} is not in (0, 1)")
    if lr is not None and not (0.0 < lr < 1.0):
        raise RaceError(f"learning rate {lr!r} is not in (0, 1)")
    cfg = config_from_dict(raw, base_dir=base_dir)
    plan = results.plan or {}
    P = float(plan.get("prompt_len") or cfg.prompt_len)
    C = float(plan.get("completion_len") or cfg.completion_len)
    arch, rspec = policy_arch(cfg), reward_spec(cfg)
    full = plan_schedule(CostModel(replace(cfg, budget=F), arch, rspec, P, C), rho)
    eta = float(lr) if lr is not None else full.learning_rate
    grid_flops = sum(p.flops.total for p in done)
    probe_budget = min(F / full.prompts_per_step, PROBE_SHARE * grid_flops)
    pcfg = replace(cfg, budget=probe_budget, grid=(rho,), seeds=1, full_run_budget=None,
                   schedule=replace(cfg.schedule, prompts_per_step=PROBE_PROMPTS),
                   learning_rate=replace(cfg.learning_rate, ref=eta, fixed=True))
    sched = plan_schedule(CostModel(pcfg, arch, rspec, P, C), rho)
    plan = ProbePlan(full_run_budget=F, rho=rho, learning_rate=eta, schedule=sched,
                     full_steps=full.steps * full.mu, full_prompts_per_step=full.prompts_per_step,
                     grid_flops=grid_flops, config=pcfg)
    if plan.covers < MIN_COVER:
        raise RaceError(f"the length probe at F = {F:.3g} ({F / budget:.3g} × B) would cover {plan.covers:.1%} of the "
                        f"full run's {plan.full_steps:,} optimizer steps (it is capped at {PROBE_SHARE:.0%} of the "
                        f"grid's compute), under the {MIN_COVER:.0%} it needs to say anything of the run's length: this grid's "
                        f"probe covers that much of runs up to about {F / budget * plan.covers / MIN_COVER:.3g} × B; "
                        "run pilots with a larger budget for this F")
    return plan


def probe_record(plan: ProbePlan, pilot: Any, *, target: str, wall_seconds: float) -> dict[str, Any]:
    """The stored record of a probe that ran: its plan, its held-out curve and its verdict."""
    cps = sorted(pilot.checkpoints, key=lambda c: (c.flops.total, c.fraction))
    curve = [{"fraction": c.fraction, "step": c.step, "mean": sum(c.evals[target]) / len(c.evals[target])}
             for c in cps if c.evals.get(target)]
    fall = probe_fall(pilot.checkpoints, target)
    # what it ran, not what it planned: a probe stopped short covers only the steps it made
    made = max((c.step for c in pilot.checkpoints), default=0) * plan.schedule.mu
    covers = plan.covers if pilot.status == "complete" else min(plan.covers, made / max(1, plan.full_steps))
    return {"full_run_budget": plan.full_run_budget, "rho": plan.rho, "learning_rate": plan.learning_rate,
            "schedule_kind": plan.config.learning_rate.schedule, "steps": plan.schedule.steps * plan.schedule.mu,
            "prompts_per_step": plan.schedule.prompts_per_step, "n_gen": plan.schedule.n_gen,
            "full_steps": plan.full_steps, "covers": covers, "planned_covers": plan.covers, "budget": plan.budget, "share": plan.share,
            "target": target, "curve": curve, "status": "fell" if fall else "held", "fall": fall,
            "pilot_status": pilot.status, "wall_seconds": round(wall_seconds, 1)}
