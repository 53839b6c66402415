"""The pilot loop: the pilots ``(schedule, seed)`` of one grid point's seeds, each to its FLOP budget.

``pilot_events(config, schedule, seeds)`` is the one loop every pilot runs through, solo or grouped,
on the lean path or the peft one: a pilot is a seed axis of length 1. It steps a
race.engine.seed_axis.SeedAxisEngine (the policy is the engine's parameter) and yields events as
they happen: a ``PilotProgress`` after each seed's step, and each seed's ``PilotResult`` once it is
evaluated. ``run_pilots`` collects the results of several seeds, ``run_pilot`` the one result of one
seed; both only consume the events. race.run.processes runs a call in its own process. With
``stop_at`` and ``state_dir`` a seed pauses at a FLOP mark below its budget (a ``PilotPaused`` with
its held-out reading there replaces its result) and ``resume`` continues it from its saved state to
a later mark or to the end, bit for bit as if it had never stopped (race.engine.continuation).

Invariants: FLOPs are metered from the tokens actually processed in every step (not from the
plan); a seed stops when its next step would overshoot its budget by more than half a step
(race.engine.loop.PilotLoop), and leaves the batch (its adapter frozen from then on) while the
others go on. With ``eval.checkpoints`` a seed also evaluates held-out prompts at fractions of its
budget (``HeldOutCheckpoints``) with random streams of their own: training, and so every number a
pilot reports without checkpoints, stays bit-identical. Evaluation FLOPs and seconds are recorded
apart and never count towards the budget or ρ. A group of several seeds says so in each result's
``extra["engine"]``; a seed's numbers are otherwise the same alone or in a group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from race.config.configfile import GridConfig
from race.core.records import PilotResult, Schedule
from race.engine.continuation import Continuation, PilotPaused
from race.engine.evaluation import HeldOutCheckpoints
from race.engine.loop import PilotData, PilotLoop, finish_pilot
from race.engine.seed_axis import SeedAxisEngine
from race.tasks.taskdata import answer_check, task_problems

ProgressFn = Callable[[int, float], None]       # (steps done, FLOPs spent)


@dataclass(frozen=True)
class PilotProgress:
    """A seed's pilot after a step: the steps done and the FLOPs spent so far."""

    seed: int
    steps: int
    spent: float


def pilot_events(config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str = "cpu",
                 stop_at: float | None = None, state_dir: str | None = None,
                 resume: bool = False) -> Iterator[PilotProgress | PilotResult | PilotPaused]:
    """Run the pilots ``(schedule, seed)`` for ``seeds`` to their budgets (module docstring), yielding a
    ``PilotProgress`` after each seed's step and each seed's ``PilotResult`` (in ``seeds`` order) at the
    end. With ``stop_at`` (FLOPs, below the budget) a seed pauses at that mark instead: its state goes
    to ``state_dir`` and a ``PilotPaused`` (its held-out reading there) replaces its result; with
    ``resume`` each seed starts from its state in ``state_dir`` (race.engine.continuation). Every
    refusal comes before a model loads. The engine is closed when the loop ends, is closed early or fails."""
    plan = Continuation(config, schedule, seeds, stop_at=stop_at, state_dir=state_dir, resume=resume, device=device)
    engine = SeedAxisEngine(config, schedule, seeds, device=device)
    try:
        tok = engine.backend.tok
        data = PilotData.load(config, tok, device=device)
        engine.check = answer_check(config, data.evals)
        loops = [PilotLoop(config, schedule, s, task_problems(config, tok, split="train", seed=s)) for s in engine.seeds]
        views = [engine.view(s) for s in engine.seeds]
        checks = [HeldOutCheckpoints(v, data.evals, data.targets, s) for v, s in zip(views, engine.seeds)]
        plan.restore(engine, loops, checks)
        for k, cp in enumerate(checks):
            if cp.on and plan.states is None:
                cp.run(0.0, 0, loops[k].spent)                  # the base policy: the curve's start
        active = [k for k in range(len(engine.seeds)) if loops[k].wants_step(plan.mark)]
        while active:
            records = engine.step(active, [loops[k].next_problems() for k in active])
            for k, record in zip(active, records):
                loop = loops[k]
                loop.record(record)
                fraction = checks[k].due(loop.spent.total)
                if fraction is not None and loop.wants_step():      # not the last step
                    checks[k].run(fraction, loop.steps, loop.spent)
                yield PilotProgress(engine.seeds[k], loop.steps, loop.spent.total)
            active = [k for k in active if loops[k].wants_step(plan.mark)]
        group = {"engine": f"lockstep ({len(engine.seeds)} seeds)"} if len(engine.seeds) > 1 else {}
        for k, seed in enumerate(engine.seeds):
            if loops[k].wants_step():               # stopped at the mark, not at the budget
                yield plan.pause(engine, k, views[k], data, loops[k], checks[k])
                continue
            yield finish_pilot(views[k], views[k].backend, data, loops[k], checks[k], seed, wall=engine.walls[k],
                               device=device, extra={**group, **plan.extra(k)} or None)
    finally:
        engine.close()


def run_pilots(config: GridConfig, schedule: Schedule, seeds: list[int], *, device: str = "cpu",
               progress: Callable[[int, int, float], None] | None = None,
               **pause) -> list[PilotResult | PilotPaused]:
    """``pilot_events``' results (or pauses: ``pause`` holds its ``stop_at``, ``state_dir``, ``resume``)
    in ``seeds`` order; ``progress(seed, steps, spent)`` sees each step."""
    results = []
    for event in pilot_events(config, schedule, seeds, device=device, **pause):
        if isinstance(event, (PilotResult, PilotPaused)):
            results.append(event)
        elif progress:
            progress(event.seed, event.steps, event.spent)
    return results


def run_pilot(config: GridConfig, schedule: Schedule, seed: int, *, device: str = "cpu",
              progress: ProgressFn | None = None) -> PilotResult:
    """One pilot to its budget: ``pilot_events`` over a seed axis of length 1; ``progress(steps, spent)``."""
    return run_pilots(config, schedule, [seed], device=device,
                      progress=(lambda _seed, steps, spent: progress(steps, spent)) if progress else None)[0]
