"""What ``race.stats.regime.classify`` takes: its arguments checked before any fit, and the error it raises.

Invariants: every refusal is one ``ClassifyError`` line naming the value; ``CLASSIFY_KEYS`` are classify's keyword
arguments, the settings a results file's ``classify`` may hold (race.stats.results refuses others). Pure.
"""
from __future__ import annotations

from typing import Any

from race.core import arguments as A
from race.core.errors import RaceError
from race.core.records import FlopBreakdown, PilotResult

MAX_BOOT = 100_000             # bootstrap resamples classify takes (the default 1000; more only costs time)

# classify's keyword arguments: what a results file's "classify" settings may hold (race.stats.results)
CLASSIFY_KEYS = ("targets", "primary_target", "reward_share_threshold", "n_boot", "confidence_level", "seed", "meta",
                 "rerun_confidence")


class ClassifyError(RaceError):
    """A bad argument to ``classify`` or pilots it cannot classify; the message is one line."""


def checked(results: Any, targets: Any, primary_target: Any, threshold: Any, n_boot: Any, level: Any, seed: Any,
             meta: Any, rerun_confidence: Any) -> tuple[list[PilotResult], list[str] | None]:
    """classify's arguments, each checked before any fit (ClassifyError, one line naming the value)."""
    E = ClassifyError
    results = A.items("results", results, error=E, what="race.PilotResult records")
    seen: dict[tuple[float, int], int] = {}
    for i, r in enumerate(results):
        A.instance(f"results[{i}]", r, PilotResult, error=E, expected="a race.PilotResult (PilotResult.from_dict "
                   "reads a stored one)")
        _check_pilot(f"results[{i}]", r)
        if r.status == "complete":
            key = (float(r.rho_target), int(r.seed))
            if key in seen:
                raise E(f"results[{i}] repeats the complete pilot ρ={key[0]:g} seed {key[1]} of results[{seen[key]}]: "
                        "expected one record per grid point and seed")
            seen[key] = i
    if targets is not None:
        targets = [A.text(f"targets[{i}]", t, error=E)
                   for i, t in enumerate(A.items("targets", targets, error=E, what="target names"))]
    A.text("primary_target", primary_target, error=E)
    A.number("reward_share_threshold", threshold, gt=0.0, le=1.0, error=E)
    A.whole("n_boot", n_boot, ge=1, le=MAX_BOOT, error=E, floats=False)
    A.number("confidence_level", level, gt=0.0, lt=1.0, error=E)
    A.whole("seed", seed, ge=0, error=E, floats=False)
    if meta is not None:
        A.mapping("meta", meta, error=E)
    if rerun_confidence is not None:
        A.flag("rerun_confidence", rerun_confidence, error=E)
    return results, targets


MAX_SEED = 2**31 - 1           # a pilot's generators are seeded from its seed (race.engine.loop)
MAX_SCORE = 1e12               # |a per-prompt score|: the fits square and sum them, which past ~1e150 overflows


def _plain_scores(scores: list) -> bool:
    """Every score a plain int or float within ±MAX_SCORE (NaN fails the comparison): what ``A.number`` would pass,
    in one pass over a list that can hold thousands."""
    return all((type(x) is float or type(x) is int) and -MAX_SCORE <= x <= MAX_SCORE for x in scores)


def _check_pilot(name: str, r: PilotResult) -> None:
    """One pilot record's fields, as classify reads them: ρ target in (0, 1), a seed, a status, FLOPs whose ρ is
    defined (a complete pilot spent on learning), per-prompt scores as finite numbers, and the mappings and lists
    the notes read. ClassifyError, one line naming the field."""
    E = ClassifyError
    A.number(f"{name}.rho_target", r.rho_target, gt=0.0, lt=1.0, error=E)
    A.whole(f"{name}.seed", r.seed, ge=0, le=MAX_SEED, error=E, floats=False)
    A.text(f"{name}.status", r.status, error=E)
    A.instance(f"{name}.flops", r.flops, FlopBreakdown, error=E)
    for part in ("search", "learning", "reward"):
        A.number(f"{name}.flops.{part}", getattr(r.flops, part), ge=0.0, error=E)
    if r.status == "complete" and not r.flops.learning > 0:
        raise E(f"{name}.flops has no learning FLOPs (ρ 0): expected a complete pilot that trained")
    A.mapping(f"{name}.evals", r.evals, error=E)
    for target, scores in r.evals.items():
        scores = A.items(f"{name}.evals[{target!r}]", scores, error=E, what="per-prompt scores")
        if not _plain_scores(scores):      # the one-by-one check only to name the first bad score
            for j, x in enumerate(scores):
                A.number(f"{name}.evals[{target!r}][{j}]", x, ge=-MAX_SCORE, le=MAX_SCORE, error=E)
    A.mapping(f"{name}.extra", r.extra, error=E)
    A.mapping(f"{name}.wall_seconds", r.wall_seconds, error=E)
    for j, point in enumerate(A.items(f"{name}.curve", r.curve, error=E, what="(FLOPs, reward) pairs")):
        pair = A.items(f"{name}.curve[{j}]", point, error=E, what="two numbers (FLOPs, reward)")
        if len(pair) != 2:
            raise E(f"{name}.curve[{j}] {A.shown(point)} must be a pair (FLOPs, reward)")
        for x in pair:
            A.number(f"{name}.curve[{j}]", x, finite=False, error=E)
    A.items(f"{name}.checkpoints", r.checkpoints, error=E, what="race.core.records.Checkpoint records")
