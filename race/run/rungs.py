"""Budget halving's record (``--adaptive-policy budget-halving``, race.run.adaptive.budget): the points it
dropped as the pilots the fit takes, and what results.json keeps of its rungs and its compute.

A ρ dropped at rung r enters the diagnosis as its seeds' last readings (``dropped_pilots``): a
``PilotResult`` per seed with the reading's per-prompt scores (the final evaluation's prompts, so it
aligns with the pilots that reached the top), the training FLOPs, steps, curve and checkpoints spent
up to the mark, and ``extra["budget_halving"]`` saying so (``rung``, ``mark``, ``dropped``). The fit
then mixes budgets: a dropped point had less training than the survivors, so the fit's curve favours
the survivors more than an IsoFLOP grid at the top budget would (docs/pilot.md, "Budget halving").

Invariants: no storage and no optuna here (the coordinator, race.run.study, passes the store's readings
and pilots in); every FLOP counted once: a survivor's checkpoints are in its final result, a dropped
point's in its last reading, and every reading's own evaluation in ``reading_eval_flops``.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from race.core.records import PilotResult, Schedule

Stage = tuple[float, int, int]


def last_readings(readings: Mapping[Stage, Any],
                  finished: set[tuple[float, int]]) -> dict[tuple[float, int], tuple[int, Any]]:
    """Each pilot (ρ, seed) that did not reach the top: the highest rung it paused at, and its reading there."""
    out: dict[tuple[float, int], tuple[int, Any]] = {}
    for (rho, seed, rung), paused in readings.items():
        key = (rho, seed)
        if key not in finished and (key not in out or rung > out[key][0]):
            out[key] = (rung, paused)
    return out


def dropped_pilots(readings: Mapping[Stage, Any], finished: set[tuple[float, int]],
                   schedules: Mapping[float, Schedule]) -> list[PilotResult]:
    """The pilots that stopped at a rung below the top, as the pilots the fit takes (module docstring)."""
    out = []
    for (rho, seed), (rung, p) in sorted(last_readings(readings, finished).items()):
        cps = sum(c.eval_flops.total for c in p.checkpoints)
        out.append(PilotResult(
            rho_target=rho, seed=seed, flops=p.flops, evals=dict(p.evals), schedule=schedules.get(rho),
            curve=tuple(p.curve), wall_seconds=dict(p.wall_seconds), checkpoints=tuple(p.checkpoints),
            extra={"steps": p.steps, "eval_flops": {"reading": p.eval_flops.total, **({"checkpoints": cps} if cps else {})},
                   "budget_halving": {"rung": rung, "mark": p.mark, "dropped": True}}))
    return out


def halving_record(attrs: Mapping[str, Any], marks: Sequence[float], readings: Mapping[Stage, Any],
                   pilots: Sequence[PilotResult], *, points: int, seeds: int, primary: str = "reward",
                   final: bool = False) -> dict[str, Any]:
    """What results.json's ``meta["budget_halving"]`` keeps: the ladder (η, rungs, keep rule, marks, state folder), each
    rung's points and readings, which ρ stopped at which rung (once the grid is ``final``), and the compute
    spent (``halving_compute``)."""
    top = [p for p in pilots if p.status == "complete" and p.extra.get("budget_halving") is None]
    rungs = []
    for r, mark in enumerate(marks[:-1]):
        here = sorted((k for k in readings if k[2] == r), key=lambda k: (k[0], k[1]))
        rungs.append({"rung": r, "mark": mark, "rho": sorted({k[0] for k in here}),
                      "readings": [{"rho": k[0], "seed": k[1], "reading": readings[k].score(primary),
                                    "flops": readings[k].flops.total, "steps": readings[k].steps,
                                    "eval_flops": readings[k].eval_flops.total} for k in here]})
    rungs.append({"rung": len(marks) - 1, "mark": marks[-1], "rho": sorted({p.rho_target for p in top}),
                  "scores": [{"rho": p.rho_target, "seed": p.seed, "score": p.score(primary),
                              "flops": p.flops.total, "steps": p.extra.get("steps")} for p in top]})
    out = {"eta": attrs.get("eta"), "rungs": attrs.get("rungs"), "keep": attrs.get("keep", "ci"), "marks": list(marks),
           "states": attrs.get("states"),
           "ladder": rungs, "compute": halving_compute(readings, pilots, flat=points * seeds * marks[-1]),
           "fit": "a ρ dropped at a rung enters the fit at its last reading (a lower budget: "
                  "extra.budget_halving of its pilots)"}
    if final:
        reached = {}
        for r in rungs:
            for rho in r["rho"]:
                reached[rho] = r["rung"]
        out["dropped"] = [{"rho": rho, "rung": g} for rho, g in sorted(reached.items()) if g < len(marks) - 1]
    return out


def halving_compute(readings: Mapping[Stage, Any], pilots: Sequence[PilotResult], *, flat: float) -> dict[str, float]:
    """The compute budget halving spent: training FLOPs (the top pilots' whole runs, the dropped ones' up to
    their last mark), the held-out evaluation (the readings at every mark, the top pilots' checkpoints and
    final evaluations, the dropped ones' checkpoints), their total, and the flat grid's training FLOPs at the
    top budget (``flat``) for scale. ``pilots``: the top pilots and ``dropped_pilots``."""
    done = [p for p in pilots if p.status == "complete"]
    training = sum(p.flops.total for p in done)
    readings_eval = sum(p.eval_flops.total for p in readings.values())
    other_eval = sum(v for p in done for k, v in (p.extra.get("eval_flops") or {}).items() if k != "reading")
    total = training + readings_eval + other_eval
    return {"training_flops": training, "reading_eval_flops": readings_eval, "other_eval_flops": other_eval,
            "total_flops": total, "flat_grid_training_flops": flat,
            "training_share_of_flat_grid": training / flat if flat else float("nan")}


def halving_line(record: Mapping[str, Any]) -> str:
    """One line for the diagnosis: the ladder, which ρ reached the top, which stopped at which rung, how
    they enter the fit, and the compute against the flat grid's training."""
    marks, top = record["marks"], record["ladder"][-1]["rho"]
    dropped = record.get("dropped") or []
    c = record["compute"]
    return (f"η {record['eta']}, keep {record.get('keep', 'ci')}, marks " + ", ".join(f"{m:.3g}" for m in marks)
            + " FLOPs; reached the top: ρ "
            + (", ".join(f"{r:g}" for r in top) or "none")
            + ("; stopped: " + ", ".join(f"ρ {d['rho']:g} at rung {d['rung']}" for d in dropped) if dropped else "")
            + " (in the fit at their last reading, a lower budget); training "
            + f"{c['training_share_of_flat_grid']:.2f} of the flat grid's, evaluation "
            + f"{c['reading_eval_flops'] + c['other_eval_flops']:.3g} FLOPs more")
