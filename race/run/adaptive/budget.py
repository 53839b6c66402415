"""Successive halving over ρ with the *budget* as the resource: ``--adaptive-policy budget-halving``. Pure.

Every pilot is planned at the config's budget B (the ladder's top) and paused on the way at the rung
marks m_r = B / η^(R − r), r = 0 … R − 1 (defaults η = 11, R = 1: B/11). A *stage* is
``(ρ, seed, rung)``: rung 0 runs a pilot from scratch to m_0; rung r > 0 continues it from its state at
m_(r−1) to m_r; rung R continues it to B, where it ends with its ``PilotResult``
(race.engine.continuation). At each mark below the top the pilot's held-out reading (the final
evaluation's prompts, paired across ρ by seed) ranks the ρ still alive.

The rule at rung r (``rung_survivors``): rank the alive ρ by their mean reading over their seeds
(ties: the lower ρ first); the best is the first. A ρ survives when its confidence interval against the
best still overlaps it: over the seeds both have read, the paired differences d_s = best_s − ρ_s have
mean d̄ ≤ ``Z`` · sd(d) / √n. With fewer than two shared seeds the interval is unknown and every alive
ρ overlaps. At most the top ⌈n_alive / η⌉ survivors continue (classic successive halving's
cut), so each rung costs at most what the one before did. A seed that failed for good at a rung stops
there; a ρ with no reading at a rung is dropped. That is the ``ci`` keep rule. The ladder
(``Ladder``: η, the rungs below B, the keep rule) is a parameter (``--halving-eta``, ``--halving-rungs``,
``--halving-keep``, checked once in race.run.options): keep ``top-half`` keeps the best ⌈n_alive / 2⌉ by
mean reading, and a whole number k the best k, with no interval and no η cap. The default ladder is
``Ladder(eta=11, rungs=1, keep="top-half")``, every ρ to B/11 and the best half to B: the replay's one
cheaper design that kept the flat grid's coverage, and live on 8 grids of rounds 1–2 it covered the
full-run best ρ in 7, where η 3 with rungs B/9, B/3 and keep ``ci`` (the default until issue 49's live
check; ``LEGACY_LADDER``, what a stored study without these keys ran) covered 2 (docs/pilot.md, "Live
check of the replay").

Why not optuna's ``SuccessiveHalvingPruner``: it decides for one trial at a time, as each reports an
intermediate value, against the values other trials reported at that rung so far (a quantile, with
no notion of seeds or of a paired interval) and never pauses a trial to resume it in another
process; here a rung's decision waits for every reading of that rung and compares whole ρ across
seeds, and the pilots' state lives in files, not in a running trial. The rule is small enough to
test by hand (tests/test_budget_halving.py).

Invariants: deterministic (no randomness, no clock), reads only the readings it is given; never asks
for a stage outside the grid × seeds × rungs, nor for rung r + 1 of a ρ before rung r is read (or
given up) at every seed; rung r ≥ 1 holds at most ⌈n_(r−1) / η⌉ ρ under ``ci`` (⌈n_(r−1) / 2⌉ under
``top-half``, k under k), and at least one while any rung r − 1 reading exists.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Mapping, Sequence

from race.run.adaptive.base import DEFAULT_SHARE
from race.stats.pilotdesign import HALVING_ETA, HALVING_KEEP, HALVING_RUNGS

Stage = tuple[float, int, int]      # (ρ, seed, rung); rung RUNGS is the top (the pilot's budget)
ETA = HALVING_ETA                   # each rung runs η × the budget of the last (11; `ci` keeps at most ⌈n / η⌉ ρ)
RUNGS = HALVING_RUNGS               # rungs below the top (1: the mark B/11)
Z = 2.0                             # the interval: d̄ ≤ Z · SE of the paired differences (the replay's "CI overlap")
KEEP = HALVING_KEEP                 # the keep rule: "top-half", "ci" (the interval, capped at ⌈n / η⌉), or k ≥ 1
LEGACY_LADDER = (3, 2, "ci")        # η, rungs, keep of a stored study that does not name them (the old default)
Keep = str | int


@dataclass(frozen=True)
class Ladder:
    """Budget halving's ladder: η, the rungs below the top, the keep rule (values checked by
    race.run.options.ladder; this class trusts them)."""

    eta: int = ETA
    rungs: int = RUNGS
    keep: Keep = KEEP

    def marks(self, budget: float) -> list[float]:
        return rung_marks(budget, self.eta, self.rungs)

    def stored(self) -> dict[str, object]:
        return {"eta": self.eta, "rungs": self.rungs, "keep": self.keep}

    @classmethod
    def from_stored(cls, stored: Mapping[str, object] | None) -> "Ladder":
        """The ladder a study's ``race:adaptive`` holds; a key it lacks is the old default's
        (``LEGACY_LADDER``: a study from before the keep rule kept by ``ci``)."""
        st = stored or {}
        eta, rungs, keep = LEGACY_LADDER
        return cls(int(st.get("eta", eta)), int(st.get("rungs", rungs)), st.get("keep", keep))  # type: ignore[arg-type]

    def line(self) -> str:
        keep = {"ci": f"the ρ whose interval overlaps the best, at most ⌈n/{self.eta}⌉",
                "top-half": "the best half"}.get(self.keep, f"the best {self.keep}")      # type: ignore[call-overload]
        marks = ", ".join(f"B/{self.eta ** (self.rungs - r)}" for r in range(self.rungs))
        return f"η = {self.eta}, rungs at {marks} then B, keeping {keep}"


def rung_marks(budget: float, eta: int = ETA, rungs: int = RUNGS) -> list[float]:
    """The FLOP marks of rungs 0 … ``rungs`` (the last is ``budget``): budget / η^(rungs − r)."""
    return [float(budget) / eta ** (rungs - r) for r in range(rungs + 1)]


def rung_survivors(readings: Mapping[float, Mapping[int, float]], eta: int = ETA, z: float = Z,
                   keep: Keep = KEEP) -> list[float]:
    """The ρ of one rung that continue (module docstring), best first; ``readings``: ρ → seed → reading
    of every ρ alive at this rung (a ρ with no reading is dropped, and still counts in n); ``keep``: the
    rule (``ci``, ``top-half`` or a whole number k)."""
    read = {r: dict(v) for r, v in readings.items() if v}
    if not read:
        return []
    order = sorted(read, key=lambda r: (-statistics.fmean(read[r].values()), r))
    if keep != "ci":
        return order[:math.ceil(len(readings) / 2) if keep == "top-half" else int(keep)]
    best = read[order[0]]

    def overlaps(r: float) -> bool:
        shared = sorted(set(best) & set(read[r]))
        if len(shared) < 2:
            return True                 # no interval from one seed: the cap decides
        d = [best[s] - read[r][s] for s in shared]
        return statistics.fmean(d) <= z * statistics.stdev(d) / math.sqrt(len(d))

    kept = [r for r in order if r == order[0] or overlaps(r)]
    return kept[:math.ceil(len(readings) / eta)]


def budget_halving(grid: Sequence[float], seeds: int, readings: Mapping[Stage, float],
                   given_up: set[Stage] = frozenset(), eta: int = ETA, rungs: int = RUNGS,
                   keep: Keep = KEEP) -> tuple[list[Stage], bool]:
    """The stages the grid needs so far, and whether that list is final (module docstring). Seeds are
    numbered 0 … ``seeds`` − 1; ``readings``: (ρ, seed, rung) → the held-out reading at the rung's mark
    (at the top rung, the pilot's final score)."""
    grid = sorted(float(r) for r in grid)
    alive = {r: list(range(seeds)) for r in grid}        # ρ → the seeds that go on
    stages: list[Stage] = []
    for rung in range(rungs + 1):
        now = [(r, s, rung) for r in sorted(alive) for s in alive[r]]
        stages += now
        if rung == rungs:
            break
        if any(st not in readings and st not in given_up for st in now):
            return stages, False
        read = {r: {s: readings[(r, s, rung)] for s in alive[r] if (r, s, rung) in readings} for r in alive}
        kept = rung_survivors(read, eta, keep=keep)
        alive = {r: sorted(read[r]) for r in kept}
    return stages, True


def halving_cost(stages: Sequence[Stage], budget: float = 1.0, eta: int = ETA, rungs: int = RUNGS) -> float:
    """The training FLOPs ``stages`` spend (in units of ``budget`` by default): each stage runs from the
    last rung's mark to its own."""
    marks = [0.0] + rung_marks(budget, eta, rungs)
    return sum(marks[rung + 1] - marks[rung] for _, _, rung in stages)


@dataclass(frozen=True)
class BudgetHalving:
    """``budget_halving`` as an adaptive policy: its keys are stages (ρ, seed, rung), not pilots;
    ``resource`` says so to the coordinator (race.run.study). ``share`` does not apply (the rungs
    decide the compute). ``ladder``: η, rungs and keep rule (the default: η 11, B/11, ``top-half``)."""

    ladder: Ladder = Ladder()
    name: str = "budget-halving"
    resource: str = "budget"

    @property
    def eta(self) -> int:
        return self.ladder.eta

    @property
    def rungs(self) -> int:
        return self.ladder.rungs

    @property
    def stored(self) -> Mapping[str, object]:
        return {"policy": "budget-halving", **self.ladder.stored()}

    @property
    def description(self) -> str:
        return f"successive halving over ρ with the budget as the resource ({self.ladder.line()})"

    def needed(self, grid: Sequence[float], seeds: int, scores: Mapping[Stage, float],
               given_up: set[Stage] = frozenset(), share: float = DEFAULT_SHARE) -> tuple[list[Stage], bool]:
        return budget_halving(grid, seeds, scores, given_up, eta=self.eta, rungs=self.rungs, keep=self.ladder.keep)

    def marks(self, budget: float) -> list[float]:
        return self.ladder.marks(budget)
