"""The learning rate and schedule RACE recommends for the full run's length. Pure.

From the stability line at F (race.stats.instability.stability_at) and, when one ran, the length probe
(race.fullrun.probe), in this order:

1. a length probe at F that **held at a lower η** than the full run's: that η (the probe is the
   evidence), on the run's schedule;
2. **at risk because pilots fell back** (or at risk with no cause given, or a probe that fell at a
   lower η than the run's): η ÷ RATE_CUT, cosine decay to 0 with LONG_WARMUP warm-up. First round
   (docs/stability.md): η × 3 lost all 15 full runs at 10 × B at a constant rate and all 15 with
   cosine decay; at η (÷ 3) with cosine decay it lost none of 15, and its reward was the highest
   of the three;
5. **at risk by the length probe alone** (no pilot fell back; the probe fell at the run's η): the
   same η, cosine decay to 0 with LONG_WARMUP warm-up. Validation (development data, written down
   before the runs): on the four grids flagged this way, η with cosine decay lost none of 12 full
   runs and ended above η ÷ 3 on all four (docs/stability.md, "The graded rate");
3. a run of LONG_RUN or more pilot budgets on a **constant** rate: the same η, cosine decay to 0
   with LONG_WARMUP warm-up. First round at 10 × B: cosine decay beat the constant rate at every
   one of 5 ρ (0.76–0.86 against 0.69–0.82 mean held-out reward, 3 seeds each), with no collapse;
4. otherwise the configured rate and schedule.

``full_run_rate`` returns a record: ``scale`` (the factor on η_ref), ``schedule``, ``warmup``,
``rule`` (1–5; 5 is listed after 2, the case it splits off) and ``line``; ``apply_rate`` turns it into the ``LearningRate`` a recipe uses.
Invariant: the recommendation never raises η. Every public function checks its arguments on entry
(race.core.arguments; a ``RateError`` naming the argument, its value and what was expected).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from race.core import arguments as A
from race.stats.instability import LONG_RUN
from race.config.configfile import LearningRate, ScheduleKnobs
from race.config.rules import LR_SCHEDULES
from race.core.errors import RaceError

RATE_CUT = 3.0          # at risk: η divided by this
LONG_WARMUP = 0.05      # warm-up share of the decayed schedules recommended
# rule 5's evidence (research/scripts/stability.py rates, the rate variants of both rounds): grids flagged at
# risk by the length probe alone, and the full runs at the same η with cosine decay on them
GRADED_GRIDS, GRADED_RUNS = 4, 12
STATUSES = ("stable", "at risk", "not tested")      # race.stats.instability.stability_at's
CAUSES = ("pilots", "probe")                         # why stability_at says at risk


class RateError(RaceError):
    """Bad input to the rate for F (a status it does not know, η that is not a positive number …)."""


def full_run_rate(lr: LearningRate, *, status: str, factor: float, full_lr: float,
                  probe: Mapping[str, Any] | None = None, cause: str | None = None) -> dict[str, Any]:
    """The recommendation (see the module docstring). ``status`` and ``cause``: the stability line's
    (race.stats.instability.stability_at); ``factor``: F over the pilot budget; ``full_lr``: η of the full
    run at F by the config (√B rule or fixed)."""
    if not isinstance(lr, LearningRate):
        raise RateError(f"lr {str(lr)[:60]!r} must be a race.config.configfile.LearningRate")
    A.one_of("status", status, STATUSES, error=RateError)
    factor = A.number("factor", factor, gt=0, error=RateError)
    full_lr = A.number("full_lr", full_lr, gt=0, error=RateError)
    if cause is not None:
        A.one_of("cause", cause, CAUSES, error=RateError)
    if probe is not None:
        A.mapping("probe", probe, error=RateError)
        if "status" not in probe or "learning_rate" not in probe:
            raise RateError(f"probe {str(dict(probe))[:60]}: expected a length probe's record with its status and "
                            "learning_rate (race.fullrun.probe)")
        if probe.get("learning_rate") is not None:
            A.number("probe['learning_rate']", probe["learning_rate"], gt=0, error=RateError)
    plr = float(probe["learning_rate"]) if probe and probe.get("learning_rate") else None
    if probe and probe.get("status") == "held" and plr is not None and plr < full_lr * (1 - 1e-6):
        scale = plr / full_lr
        return {"rule": 1, "scale": scale, "schedule": lr.schedule, "warmup": lr.warmup,
                "line": f"rate for F: η × {scale:.3g} = {plr:.3g}, {lr.schedule} (the length probe held at that η)"}
    if status == "at risk" and cause == "probe" and plr is not None and plr >= full_lr * (1 - 1e-3):
        return {"rule": 5, "scale": 1.0, "schedule": "cosine", "warmup": LONG_WARMUP,
                "line": f"rate for F: η {full_lr:.3g}, cosine decay to 0 with {LONG_WARMUP:.0%} warm-up (at risk by "
                        f"the length probe alone, no pilot fell back; in RACE's validation study, on the {GRADED_GRIDS} "
                        f"grids flagged this way, η with cosine decay lost 0 of {GRADED_RUNS} full runs and ended above "
                        f"η ÷ {RATE_CUT:g} on all {GRADED_GRIDS}). race probe DIR --full-run F --lr X tests a rate at F"}
    if status == "at risk":
        return {"rule": 2, "scale": 1 / RATE_CUT, "schedule": "cosine", "warmup": LONG_WARMUP,
                "line": f"rate for F: η ÷ {RATE_CUT:g} = {full_lr / RATE_CUT:.3g}, cosine decay to 0 with "
                        f"{LONG_WARMUP:.0%} warm-up (at risk: pilots fell back; first validation round: η × 3 lost 30 of 30 full runs "
                        "at 10 × B, constant or cosine; η ÷ 3 with cosine lost 0 of 15; sealed second round: 0 of 21 "
                        "runs at this rate collapsed, against 61 of 229 at the constant rates of the same grids, and "
                        "it lost reward on 1 of 7 grids, one only the length probe had flagged). race probe DIR "
                        "--full-run F --lr X tests a rate at F"}
    if factor >= LONG_RUN and lr.schedule == "constant":
        return {"rule": 3, "scale": 1.0, "schedule": "cosine", "warmup": LONG_WARMUP,
                "line": f"rate for F: η {full_lr:.3g}, cosine decay to 0 with {LONG_WARMUP:.0%} warm-up instead of "
                        f"a constant rate (a run {factor:.3g} × B long; first validation round at 10 × B: cosine "
                        "beat the constant rate at all 5 ρ, no collapse)"}
    return {"rule": 4, "scale": 1.0, "schedule": lr.schedule, "warmup": lr.warmup,
            "line": f"rate for F: η {full_lr:.3g}, {lr.schedule} as configured"}


def configured_lr(raw: Mapping[str, Any]) -> tuple[LearningRate, float]:
    """The ``LearningRate`` of a stored run config (a mapping) and η at its configured batch
    (B_p × n_train; the √B rule unless fixed): the rate a full run would use."""
    import math
    from dataclasses import fields

    A.mapping("raw", raw, error=RateError)
    given = A.mapping("learning_rate", raw.get("learning_rate") or {}, error=RateError)
    kinds = {"ref": lambda n, v: A.number(n, v, gt=0, strings=True, error=RateError),
             "ref_batch": lambda n, v: A.whole(n, v, ge=1, error=RateError),
             "fixed": lambda n, v: A.flag(n, v, error=RateError),        # the string 'false' is not True
             "schedule": lambda n, v: A.one_of(n, v, LR_SCHEDULES, error=RateError),
             "warmup": lambda n, v: A.number(n, v, ge=0, lt=1, strings=True, error=RateError),
             "decay": lambda n, v: A.number(n, v, ge=0, le=1, strings=True, error=RateError)}
    lr = LearningRate(**{f.name: kinds[f.name](f"learning_rate.{f.name}", given[f.name])
                         for f in fields(LearningRate) if f.name in given})
    sched = raw.get("schedule") if isinstance(raw.get("schedule"), Mapping) else {}
    batch = A.whole("schedule.prompts_per_step", sched.get("prompts_per_step", ScheduleKnobs.prompts_per_step),
                    ge=1, error=RateError) * A.whole("schedule.n_train", sched.get("n_train", ScheduleKnobs.n_train),
                                                     ge=1, error=RateError)
    return lr, (float(lr.ref) if lr.fixed else float(lr.ref) * math.sqrt(batch / float(lr.ref_batch)))


def apply_rate(lr: LearningRate, rate: Mapping[str, Any]) -> LearningRate:
    """The ``LearningRate`` of the recommendation (η_ref scaled; schedule and warm-up set)."""
    if not isinstance(lr, LearningRate):
        raise RateError(f"lr {str(lr)[:60]!r} must be a race.config.configfile.LearningRate")
    A.mapping("rate", rate, error=RateError)
    A.number("rate['scale']", rate.get("scale"), gt=0, le=1, error=RateError)   # the rate for F never raises η
    A.one_of("rate['schedule']", rate.get("schedule"), LR_SCHEDULES, error=RateError)
    A.number("rate['warmup']", rate.get("warmup"), ge=0, lt=1, error=RateError)
    return replace(lr, ref=lr.ref * float(rate["scale"]), schedule=str(rate["schedule"]),
                   warmup=float(rate["warmup"]))
