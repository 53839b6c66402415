"""The instability rule: a pilot whose held-out checkpoints fell back, and a grid's stability. Pure.

When checkpoints fire and their random streams: race.config.checkpoints.

**The instability rule** (``find_instability``), on the per-prompt scores of one target (the
primary, held-out reward). For checkpoints c_0 (base) … c_n (end) with means m_k over the same
K prompts, checkpoint j is a fall from its best earlier checkpoint b = argmax_{k<j} m_k when

1. m_j ≤ m_0 + COLLAPSE_KEEP · (m_b − m_0): it kept at most half of the gain over the base
   that it had at its best (with no gain, b is the base and this says "at or below the base");
2. m_b − m_j ≥ MIN_DROP: an absolute drop that evaluation noise on a flat curve rarely reaches;
3. m_b − m_j ≥ DROP_SE · SE, SE = sd(x_b − x_j) / √K over the paired per-prompt scores: the
   drop is resolved by the prompts themselves.

A pilot with such a checkpoint is *unstable*; the first one is recorded, with the end's mean
(whether it came back). ``stability`` summarises a grid: unstable pilots per grid point. A grid where at
least ``UNSTABLE_GRID_SHARE`` of the pilots fell back is an unstable grid (``unstable_grid``), and
``stability_notes`` words the diagnosis's note on it (race.stats.regime adds it to the warnings).

Why these constants (simulated in ``tests/test_checkpoints.py``: 9 checkpoints, per-prompt
scores of 4 samples): with 2 SEs a flat curve on 100 prompts was flagged in ~15 % of pilots,
since the best of up to 8 earlier checkpoints meets each of the later ones; with 3.5 SEs and
MIN_DROP 0.05 in ~1 %, on 500 prompts ≤ 2 %; a curve that rises and saturates, never; a fall
from 0.75 back to 0.365 (base 0.33: the 10× grid's collapsed run), always; a fall that gives
back 56 % of a 0.27 gain, in 80–90 %.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from race.core.records import Checkpoint, Instability, PilotResult, Stability, StabilityPoint


COLLAPSE_KEEP = 0.5                # f: a fall keeps at most this share of the best gain over the base
MIN_DROP = 0.05                    # absolute drop from the best earlier checkpoint
DROP_SE = 3.5                      # and this many paired standard errors (3.5, not 2: the best of the
                                   # earlier checkpoints against each later one is many comparisons)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def find_instability(checkpoints: Sequence[Checkpoint], target: str) -> dict[str, Any] | None:
    """The first checkpoint that fell from its best earlier one by the module's rule, or None.

    Returns ``{"fraction", "step", "flops", "value", "best", "best_fraction", "base", "drop_se",
    "final"}`` (means of ``target`` over the checkpoint prompts; ``drop_se`` the paired SE of
    the drop). Checkpoints without ``target`` or with another prompt count than the base's are
    left out; fewer than two left: None."""
    cps = [c for c in sorted(checkpoints, key=lambda c: (c.flops.total, c.fraction)) if c.evals.get(target)]
    if len(cps) < 2:
        return None
    k = len(cps[0].evals[target])
    cps = [c for c in cps if len(c.evals[target]) == k]
    means = [_mean(c.evals[target]) for c in cps]

    def paired_se(b: int, j: int) -> float:
        drop = means[b] - means[j]
        diffs = [x - y for x, y in zip(cps[b].evals[target], cps[j].evals[target])]
        sd = math.sqrt(sum((d - drop) ** 2 for d in diffs) / (k - 1)) if k > 1 else 0.0
        return sd / math.sqrt(k)

    hit = first_fall(means, paired_se)
    if hit is None:
        return None
    j, b, se = hit
    return {"fraction": cps[j].fraction, "step": cps[j].step, "flops": cps[j].flops.total,
            "value": means[j], "best": means[b], "best_fraction": cps[b].fraction, "base": means[0],
            "drop_se": se, "final": means[-1]}


def first_fall(means: Sequence[float], se: Any) -> tuple[int, int, float] | None:
    """The rule over a curve of means (the base first): the first j that fell from its best earlier
    b by the three conditions of the module docstring, ``se(b, j)`` the SE of that drop (paired over
    prompts in ``find_instability``; race.fullrun.watch.check_means passes an unpaired one). Returns (j, b,
    the SE), or None."""
    base = means[0]
    for j in range(1, len(means)):
        b = max(range(j), key=lambda i: (means[i], -i))
        drop = means[b] - means[j]
        if means[j] > base + COLLAPSE_KEEP * (means[b] - base) or drop < MIN_DROP:
            continue
        s = se(b, j)
        if drop >= DROP_SE * s:
            return j, b, s
    return None


# The length probe's rule (race.fullrun.probe): the probe ends below its base policy. Its held-out mean at the
# end is at least MIN_DROP and END_SE paired SEs under the base's, on the same checkpoint prompts. One
# comparison (base against end), so 2 SEs, not DROP_SE. Chosen on the first round's 15 probes
# (docs/stability.md): a fall the probe recovers from (cosine decay's) is not a flag.
END_SE = 2.0


def probe_fall(checkpoints: Sequence[Checkpoint], target: str) -> dict[str, Any] | None:
    """Whether a length probe ended below its base policy, by the rule above: ``{"base", "final",
    "drop", "drop_se", "step"}`` (the end's step), or None (it held, or fewer than two checkpoints
    of ``target`` on the same prompts)."""
    cps = [c for c in sorted(checkpoints, key=lambda c: (c.flops.total, c.fraction)) if c.evals.get(target)]
    if len(cps) < 2:
        return None
    base, end = cps[0].evals[target], cps[-1].evals[target]
    if len(base) != len(end):
        return None
    diffs = [x - y for x, y in zip(base, end)]
    drop = _mean(diffs)
    k = len(diffs)
    se = math.sqrt(sum((d - drop) ** 2 for d in diffs) / (k - 1) / k) if k > 1 else 0.0
    if drop >= MIN_DROP and drop >= END_SE * se:
        return {"base": _mean(base), "final": _mean(end), "drop": drop, "drop_se": se, "step": cps[-1].step}
    return None


# A full run at least this many pilot budgets long can collapse where none of its pilots fell back:
# the validation study's full runs did (research/validation-log.md, "What the failures teach", item 3), so the
# pilots cannot vouch for a run that long.
LONG_RUN = 10.0


def probe_problem(record: Any) -> str | None:
    """What is wrong with a stored length-probe record (race.fullrun.probe.probe_record), as the field, its
    value and what was expected; None when it reads. A record from another tool (the validation
    study's) may leave ``covers`` out: it is then the whole run."""
    from race.core.safeio import quote

    if not isinstance(record, Mapping):
        return f"is {quote(record, 60)}: expected a mapping (race.fullrun.probe's record)"
    if record.get("status") not in ("fell", "held"):
        return f"field 'status' is {quote(record.get('status'), 60)}: expected 'fell' or 'held'"
    checks = (("learning_rate", lambda v: v > 0, "a learning rate > 0"),
              ("steps", lambda v: v >= 0 and float(v).is_integer(), "a whole number of optimizer steps ≥ 0"),
              ("covers", lambda v: 0 <= v <= 1, "a share of the full run's steps in [0, 1]"))
    for name, ok, expected in checks:
        if name == "covers" and name not in record:
            continue
        v = record.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
            return (f"field {name!r} is missing: expected {expected}" if name not in record
                    else f"field {name!r} is {quote(v, 60)}: expected {expected}")
    full = record.get("full_steps")
    if full is not None and (isinstance(full, bool) or not isinstance(full, (int, float)) or not math.isfinite(full)
                             or full <= 0):
        return f"field 'full_steps' is {quote(full, 60)}: expected the full run's optimizer steps, > 0"
    if full is not None and "covers" in record and record["covers"] > record["steps"] / full + 1e-6:
        return (f"field 'covers' is {quote(record['covers'], 60)}: more than its {record['steps']:g} steps cover of the "
                f"full run's {full:g} ({record['steps'] / full:.3g})")
    curve = record.get("curve")
    if curve is not None and (not isinstance(curve, list) or not all(
            isinstance(c, Mapping) and isinstance(c.get("mean"), (int, float)) and not isinstance(c.get("mean"), bool)
            and math.isfinite(c["mean"]) for c in curve)):
        return (f"field 'curve' is {quote(curve, 60)}: expected a list of {{'fraction', 'step', 'mean'}} "
                "with finite means")
    return None


def probe_covers(record: Mapping[str, Any]) -> float:
    """The share of the full run's steps a (checked) probe record covers: its ``covers``; without one, its
    steps over the full run's where it gives ``full_steps``, else the whole run (another tool's record)."""
    if "covers" in record:
        return float(record["covers"])
    full = record.get("full_steps")
    return min(1.0, float(record["steps"]) / float(full)) if full else 1.0


# the advice every stability line ends with
_WATCH = "watch the full run's held-out reward (race.fullrun.watch) and keep its best checkpoint"


def stability_at(st: Stability | None, *, full_run_budget: float, pilot_budget: float,
                 ran: bool = True, probe: Mapping[str, Any] | None = None,
                 partial_probe: bool = True) -> dict[str, str]:
    """The stability line at the full-run budget: ``{"status", "line"}`` (and ``cause`` when at risk),
    status one of ``stable``, ``at risk`` or ``not tested``. The rule (frozen for the second validation round, docs/stability.md):

    1. some pilot fell back (``find_instability``): **at risk**, the pilots named (``cause`` "pilots");
    2. else a length probe at F (race.fullrun.probe; ``probe`` its record): **at risk** when it ended below
       its base policy (``probe_fall``; ``cause`` "probe"), **stable** when it held over the whole run,
       **not tested** past the share of the run it covered when it held over less (``partial_probe``
       False: the rule as frozen for round 2, stable whatever it covered; its tables keep that);
    3. else **stable** when the run is under LONG_RUN pilot budgets long, **not tested** otherwise
       (and when the pilots have no checkpoints; ``ran`` False: no pilot has run yet).

    The evidence quoted is the first validation round's (docs/validation.md, docs/stability.md)."""
    factor = full_run_budget / pilot_budget if pilot_budget > 0 else float("nan")
    head = f"stability at F ({factor:.3g} × B): "
    if not ran:
        return {"status": "not tested", "line": head + f"not tested: no pilot has run yet (race pilot tests the rate "
                                                       f"at B, race probe at F); {_WATCH}"}
    if st is not None and st.unstable:
        return _pilots_fell(st, head)
    if probe is not None:
        return _probe_line(probe, head, full_run_budget=full_run_budget, partial_probe=partial_probe)
    if st is None:
        return {"status": "not tested", "line": head + "not tested: the pilots have no held-out checkpoints "
                                                       f"(eval.checkpoints off); {_WATCH}"}
    if factor < LONG_RUN:
        return {"status": "stable", "line": head + f"stable: none of {st.pilots} pilots fell back, and the full run "
                                                   f"is under {LONG_RUN:g} × a pilot's length"}
    return {"status": "not tested",
            "line": head + f"not tested at this length: none of {st.pilots} pilots fell back, but the full run is "
                           f"{factor:.3g} × a pilot's length, which pilots cannot vouch for (RACE's validation "
                           "study: tiny-reasoner lost 3 of 15 full runs at 10 ×, tiny-arith 1 of 9 at 30 ×, none of "
                           f"their pilots fell back); race probe DIR --full-run F tests η at that length for at most "
                           f"a quarter of the grid's compute; {_WATCH}"}


def _pilots_fell(st: Stability, head: str) -> dict[str, str]:
    """Rule 1 of ``stability_at``: some pilot fell back, so the full run is at risk; the pilots named."""
    where = ", ".join(f"ρ {p.rho_target:.2f}: {p.unstable} of {p.pilots}" for p in st.points if p.unstable)
    return {"status": "at risk", "cause": "pilots",
            "line": head + f"AT RISK: {len(st.unstable)} of {st.pilots} pilots fell back on their held-out "
                           f"checkpoints ({where}); in RACE's validation study the settings whose pilots fell "
                           "back were those whose full runs collapsed (first round: η × 3 30 of 30, steps-prm 1 of 15; "
                           "sealed second round: all 3 such settings lost full runs, 10 of 65, 9 of 37 and 26 of 37), and no "
                           f"setting whose pilots all held lost a third of its full runs: lower η, and {_WATCH}"}


def _probe_line(probe: Mapping[str, Any], head: str, *, full_run_budget: float,
                partial_probe: bool) -> dict[str, str]:
    """Rule 2 of ``stability_at``: the length probe at F decides (at risk, not tested past what it
    covered, or stable); a malformed probe record is a RaceError."""
    bad = probe_problem(probe)
    if bad:
        from race.core.errors import RaceError

        raise RaceError(f"the length-probe record at F = {full_run_budget:.3g}: {bad} (the results file's "
                        "'probes' was edited or written by another tool: run race probe again)")
    covers = probe_covers(probe)
    run = (f"the length probe at η {float(probe['learning_rate']):.3g} ({int(probe['steps'])} steps, "
           f"{covers:.0%} of the full run's)")
    curve = probe.get("curve") or [{}]
    if probe["status"] == "fell":
        f = probe.get("fall") or {}
        return {"status": "at risk", "cause": "probe",
                "line": head + f"AT RISK: {run} ended at {f.get('final', float('nan')):.3f}, below its base "
                               f"policy's {f.get('base', float('nan')):.3f} (drop {f.get('drop', float('nan')):.3f}, "
                               f"paired SE {f.get('drop_se', float('nan')):.3f}); in the first validation round "
                               "the probe ended below its base in every setting that lost a full run: decay η "
                               f"over the run or lower it (race recipe gives the rate for F), and {_WATCH}"}
    # it held over what it ran, and says nothing of the rest; ``partial_probe=False``: the rule as
    # frozen for the second validation round (f6862b9), where a probe that held was stable whatever it covered
    if partial_probe and covers < 1 - 1e-9:
        short = ("it stopped before the share it planned, "
                 f"{float(probe['planned_covers']):.0%}" if float(probe.get("planned_covers", covers)) > covers + 1e-9
                 else "capped at a quarter of the pilot grid's compute")
        return {"status": "not tested",
                "line": head + f"not tested past {covers:.0%} of its length: {run} held over the steps it ran "
                               f"({short}); the remaining {1 - covers:.0%} of the full run's steps are not "
                               "tested by it (a larger pilot budget gives a probe that covers the run); "
                               f"{_WATCH}"}
    if not probe.get("curve") and "curve" in probe:      # a probe with no held-out evaluation shows nothing held
        return {"status": "not tested",
                "line": head + f"not tested: {run} stored no held-out curve to read (eval.checkpoints off?); "
                               f"{_WATCH}"}
    return {"status": "stable",
            "line": head + f"stable: {run} held (held-out {curve[0].get('mean', float('nan')):.3f} at its base, "
                           f"{curve[-1].get('mean', float('nan')):.3f} at its end); in the first validation round "
                           f"no setting whose probe held lost a full run; {_WATCH}"}


LEARN_FLOOR = 0.01       # the smallest gain in held-out score over the base policy that counts as learning


def learned(pilots: Sequence[PilotResult], target: str) -> tuple[bool, float, float] | None:
    """Whether a grid learned anything: some grid point's mean gain over the base policy (its
    final checkpoint against its step-0 one, on the same checkpoint prompts, paired by seed)
    above both 2 of its seed SEs and LEARN_FLOOR. Returns (learned, the best point's mean gain, its
    SE), or None when the pilots have no base checkpoint of ``target``."""
    by: dict[float, list[float]] = {}
    for p in pilots:
        if p.status != "complete" or not p.checkpoints:
            continue
        cps = sorted(p.checkpoints, key=lambda c: c.fraction)
        base, end = cps[0], cps[-1]
        if base.fraction != 0.0 or end is base or not base.evals.get(target) or not end.evals.get(target):
            continue
        by.setdefault(p.rho_target, []).append(_mean(end.evals[target]) - _mean(base.evals[target]))
    if not by:
        return None
    best = (False, -math.inf, math.nan)
    for _, g in sorted(by.items()):
        m = _mean(g)
        se = math.sqrt(sum((x - m) ** 2 for x in g) / (len(g) - 1) / len(g)) if len(g) > 1 else math.inf
        ok = m > max(2 * se, LEARN_FLOOR)
        if (ok, m) > best[:2]:
            best = (ok, m, se)
    return best


def eval_flops(pilot: PilotResult) -> float:
    """FLOPs of a pilot's held-out evaluations (final + checkpoints), outside its budget."""
    cost = pilot.extra.get("eval_flops") or {}
    return float(sum(cost.values()))


UNSTABLE_GRID_SHARE = 0.5      # a grid with at least this share of unstable pilots is an unstable grid


def unstable_grid(st: Any) -> bool:
    """At least ``UNSTABLE_GRID_SHARE`` of the grid's pilots fell back (this module's rule):
    the grid diverges, whatever its regime (validated on the study's development half:
    docs/validation.md). False without checkpoints."""
    if st is None:
        return False
    return st.pilots > 0 and st.fell >= UNSTABLE_GRID_SHARE * st.pilots


def stability_notes(st: Any) -> list[str]:
    """A note when the grid is unstable (``unstable_grid``), else when some pilots fell back."""
    if unstable_grid(st):
        return [f"unstable grid: {st.fell} of {st.pilots} pilots fell back on the held-out checkpoints: the verdict "
                "describes runs that diverge, and longer runs fall further; lower the learning rate and re-run "
                "before reading the regime (a decay over each run's own length did not prevent it in the "
                "validation study, docs/validation.md)"]
    if st is not None and st.fell:
        return [f"pilots fell back: {st.fell} of {st.pilots} on the held-out checkpoints: a full run spends many more "
                "steps at this learning rate and can collapse where its pilots did not (in the validation study, "
                "2 of 12 fallen pilots came before 15 of 15 collapsed full runs; docs/validation.md)"]
    return []


def stability(pilots: Sequence[PilotResult], target: str) -> Stability | None:
    """Unstable pilots per grid point among the complete pilots with checkpoints of ``target``;
    None when no pilot has any (results written before checkpoints, or with them off)."""
    checked = sorted((p for p in pilots if p.status == "complete" and any(target in c.evals for c in p.checkpoints)),
                     key=lambda p: (p.rho_target, p.seed))
    if not checked:
        return None
    flagged = []
    for p in checked:
        hit = find_instability(p.checkpoints, target)
        if hit:
            flagged.append(Instability(rho_target=p.rho_target, seed=p.seed, target=target, **hit))
    points = []
    for rho in sorted({p.rho_target for p in checked}):
        here = [p for p in checked if p.rho_target == rho]
        points.append(StabilityPoint(
            rho_target=rho, pilots=len(here), unstable=sum(1 for f in flagged if f.rho_target == rho),
            checkpoints=_mean([len(p.checkpoints) for p in here]),
            prompts=max(len(c.evals.get(target, ())) for p in here for c in p.checkpoints),
            eval_flops=_mean([eval_flops(p) for p in here])))
    rule = {"keep": COLLAPSE_KEEP, "min_drop": MIN_DROP, "drop_se": DROP_SE}
    return Stability(target=target, rule=rule, points=tuple(points), unstable=tuple(flagged))
