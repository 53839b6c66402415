"""How a grid runs, as one typed object: ``RunOptions``. Pure.

The settings of a run that are not the experiment (the config is): where results and storage go,
how many workers, on which device, the engine, an adaptive share, budget halving's ladder, retries,
the heartbeat, pilots to import, extension rounds. ``race pilot``, ``race.diagnose`` and the benchmarks build one, ``check()``
validates it once, and it is passed down whole: race.run.extend.run_extended → race.run.study.run_study →
the coordinator. No other module checks a run option again (tests/test_options.py).

Invariants: ``check()`` refuses a bad value in one ``RaceError`` line naming it and what was
expected, before anything runs; the object is frozen (a round of ``--extend`` is a ``replace``).
``most_pilots`` is the one place that looks at the disk (whether the study already exists), and never
under-counts: a check before compute that uses it refuses only what the grid cannot do.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

from race.core.arguments import shown
from race.core.errors import RaceError
from race.run.adaptive import (DEFAULT_SHARE, AdaptivePolicy, BudgetHalving, Ladder, adaptive_most, is_budget, policy_named,
                               resolve_adaptive)

# the one table of engines (race.engine.lean_engine.group_size_for: how many seeds share a process)
ENGINES = {"auto": "lockstep groups where they were measured faster (CPU, lean path), else solo",
           "lockstep": "a grid point's seeds trained as one batch in one process",
           "solo": "one pilot per process (the lean path's engine with one seed)"}
MAX_WORKERS = 256
MAX_ROUNDS = 5          # --extend: rounds past the best edge at most
LADDER_FLAGS = "--halving-eta, --halving-rungs, --halving-keep"
MAX_DEPTH = 1000        # budget halving's lowest mark B / η^rungs stays at or above B / MAX_DEPTH


def ladder(given: Any) -> Ladder:
    """Budget halving's ladder from a mapping of ``eta``, ``rungs`` and ``keep`` (each optional; numbers
    may come as the CLI's strings), checked: η a whole number ≥ 2, rungs a whole number ≥ 1 with
    η^rungs ≤ MAX_DEPTH, keep ``ci``, ``top-half`` or a whole number ≥ 1; a bad value is one RaceError line."""
    if not isinstance(given, Mapping) or set(given) - {"eta", "rungs", "keep"}:
        raise RaceError(f"halving ladder {str(given)[:60]}: expected a mapping of eta, rungs and keep")

    def whole(name: str, v: Any, lo: int, what: str) -> int:
        text = str(v).strip() if isinstance(v, (str, int)) and not isinstance(v, bool) else None
        if text is None or not text.isdigit() or len(text) > 9 or int(text) < lo:
            raise RaceError(f"halving {name} {str(v)[:40]!r}: expected {what}")
        return int(text)

    dflt = Ladder()
    eta = dflt.eta if given.get("eta") is None else whole("eta", given["eta"], 2, "a whole number ≥ 2 (each rung η × the last)")
    rungs = dflt.rungs if given.get("rungs") is None else whole("rungs", given["rungs"], 1,
                                                                 "a whole number ≥ 1 of rungs below the budget")
    depth = 1
    for k in range(1, rungs + 1):           # η ≥ 2: past MAX_DEPTH within 10 rungs, whatever rungs says
        depth *= eta
        if depth > MAX_DEPTH:
            lowest = f"B/{depth}" if k == rungs else f"B/{eta}^{rungs}"
            raise RaceError(f"halving ladder η = {eta}, {rungs} rungs: its lowest mark {lowest} is below "
                            f"B/{MAX_DEPTH}; expected η^rungs ≤ {MAX_DEPTH}")
    keep = given.get("keep")
    if keep is None or keep in ("ci", "top-half"):
        return Ladder(eta, rungs, keep or dflt.keep)
    return Ladder(eta, rungs, whole("keep", keep, 1, "ci, top-half or a whole number k ≥ 1 of ρ kept per rung"))


@dataclass(frozen=True)
class RunOptions:
    out_dir: str                           # where results.json (and the default sqlite storage) go
    storage: str | None = None             # an optuna storage URL (None: sqlite:///OUT_DIR/race.db)
    study: str | None = None               # the study's name (None: the config's name)
    workers: int | None = None             # pilots at once here (None: 2 on CPU, 1 per GPU; 0: coordinate only)
    device: str = "cpu"                    # cpu, cuda or cuda:N
    quiet: bool = False                    # no progress lines on stderr
    adaptive: bool | str = False           # False: the full grid; True or a policy name: an adaptive subset
    adaptive_share: float | None = None    # the share of the full grid's pilots an adaptive grid runs
    retries: int = 1                       # times a pilot that failed here is enqueued again
    heartbeat: int | None = None           # seconds between a pilot's heartbeats (None: the storage default)
    import_pilots: str | None = None       # a results file whose finished pilots are recorded first
    engine: str = "auto"                   # auto | lockstep | solo (race.engine.lean_engine)
    extend: int = 0                        # rounds past the best edge (race.run.extend)
    design: Any = None                     # a sized design's record (race.run.sizing): its (ρ, seed index) pilots
                                           # are the ones that run (``halving``: on its budget-halving ladder,
                                           # ``design_ladder``); None: every pilot of the grid
    profile: bool = False                  # after the grid: where its wall time went (race.run.processes.wall_split)
    halving_ladder: Any = None             # budget halving's ladder: a mapping of eta, rungs, keep (``ladder``);
                                           # None: the default (η 11, B/11, keep top-half), or a study's own on a resume

    @classmethod
    def from_kwargs(cls, **kw: Any) -> "RunOptions":
        """From keyword arguments (the functions' old signatures); an unknown name is a TypeError,
        as it was."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise TypeError(f"unexpected run option(s): {', '.join(unknown)}")
        return cls(**kw)

    def check(self) -> "RunOptions":
        def whole(name: str, v: Any, lo: int, hi: int, what: str) -> None:
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise RaceError(f"{name} {str(v)[:40]}: expected {what}")

        if not isinstance(self.out_dir, str) or not self.out_dir:
            raise RaceError(f"out_dir {self.out_dir!r}: expected a folder path")
        for name, value, what in (("storage", self.storage, "a storage URL (sqlite:///FILE, postgresql://…, journal:FILE)"),
                                  ("study", self.study, "a study name"),
                                  ("import_pilots", self.import_pilots, "a results file")):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise RaceError(f"{name} {str(value)[:40]!r}: expected {what}, or leave it out")
        if self.workers is not None:
            whole("workers", self.workers, 0, MAX_WORKERS, f"a whole number from 0 (coordinate only) to {MAX_WORKERS}")
        whole("retries", self.retries, 0, 100, "a whole number from 0 to 100")
        whole("extend", self.extend, 0, MAX_ROUNDS, f"a whole number of rounds from 0 to {MAX_ROUNDS}")
        if self.heartbeat is not None:
            whole("heartbeat", self.heartbeat, 1, 3600, "seconds from 1 to 3600")
        if self.engine not in ENGINES:
            raise RaceError(f"engine {self.engine!r} is unknown: expected one of {', '.join(ENGINES)}")
        self.policy                                         # an unknown adaptive policy: one line
        if self.adaptive_share is not None and (isinstance(self.adaptive_share, bool)
                                                or not isinstance(self.adaptive_share, (int, float))
                                                or not 0.0 < self.adaptive_share <= 1.0):
            raise RaceError(f"adaptive share {shown(self.adaptive_share)} is outside (0, 1]: expected the fraction of the "
                            "full grid's pilots an adaptive grid runs, e.g. 0.5 or 0.67")
        if self.extend and (self.adaptive or self.adaptive_share is not None):
            raise RaceError("extend runs the full grid of each round: it does not combine with an adaptive grid")
        if self.design is not None and (self.asked_policy or self.extend or self.halving_ladder is not None):
            raise RaceError("a pilot design (--design fit, flat, prior or halving) chooses the pilots itself (halving: "
                            "its own budget-halving ladder): it does not combine with an adaptive grid, a halving ladder "
                            "or extend")
        if self.policy and is_budget(policy_named(self.policy)) and (self.adaptive_share is not None or self.import_pilots):
            raise RaceError("budget halving spends its compute by rung, on pilots it pauses and continues itself: it does "
                            "not combine with an adaptive share or imported pilots")
        if self.halving_ladder is not None:
            if not (self.policy and is_budget(policy_named(self.policy))):
                raise RaceError(f"a halving ladder ({LADDER_FLAGS}) shapes budget halving: expected "
                                "--adaptive-policy budget-halving with it")
            ladder(self.halving_ladder)
        if self.extend and self.workers == 0:
            raise RaceError("extend coordinates its own rounds: it needs pilots run here (workers ≥ 1, not 0)")
        if self.profile and self.workers == 0:
            raise RaceError("profile splits the wall time of the pilots run here: with workers 0 they run in race "
                            "worker, so there is nothing to split (give workers ≥ 1)")
        return self

    @property
    def asked_policy(self) -> str | None:
        """The adaptive policy asked for (``adaptive``, ``adaptive_share``), or None; an adaptive share alone asks
        for the default policy."""
        return resolve_adaptive(self.adaptive if self.adaptive_share is None else (self.adaptive or True))

    @property
    def design_ladder(self) -> dict[str, Any] | None:
        """The budget-halving ladder a sized design runs (``design["halving"]``: the design ``halving``), or None."""
        h = (self.design or {}).get("halving") if isinstance(self.design, Mapping) else None
        return {k: h[k] for k in ("eta", "rungs", "keep")} if h else None

    @property
    def policy(self) -> str | None:
        """The adaptive policy's name (race.run.adaptive.POLICIES), or None for the full grid: the one asked for,
        else budget halving where the sized design is ``halving`` (``design_ladder``)."""
        asked = self.asked_policy
        return "budget-halving" if asked is None and self.design_ladder is not None else asked

    @property
    def rule(self) -> AdaptivePolicy | None:
        """The adaptive policy object (None for the full grid): budget halving with ``halving_ladder`` when
        one is given (or the sized design's, ``design_ladder``), else the table's (race.run.adaptive.POLICIES)."""
        if self.policy is None:
            return None
        given = self.halving_ladder if self.halving_ladder is not None else self.design_ladder
        if given is not None and is_budget(policy_named(self.policy)):
            return BudgetHalving(ladder(given))
        return policy_named(self.policy)

    def most_pilots(self, config: Any) -> int:
        """The most pilots a grid of ``config`` run with these (checked) options can hold when it ends, before
        anything runs: a sized design, its pilots; an adaptive grid on a fresh study, what its policy runs at its share
        (race.run.adaptive.adaptive_most: under the full grid, and for halving at a large share under
        ``adaptive_cap`` too); otherwise the grid's points × seeds, plus a point's seeds per ``extend`` round.
        A study that may exist already (another storage, an ``out_dir`` with its race.db) or imported pilots
        can hold pilots a fresh adaptive grid would not run (an earlier share or full grid): the full grid."""
        if self.design is not None:                 # a sized design runs exactly its pilots
            return len(self.design["pilots"])
        points, seeds = len(config.grid), int(config.seeds)
        fresh = (self.storage is None and self.import_pilots is None
                 and not os.path.exists(os.path.join(self.out_dir, "race.db")))
        if self.policy is None or not fresh:
            return (points + self.extend) * seeds
        share = float(self.adaptive_share) if self.adaptive_share is not None else DEFAULT_SHARE
        return adaptive_most(self.policy, config.grid, seeds, share, rule=self.rule)

    def run_grid_kw(self) -> dict[str, Any]:
        """The options as run_grid's keywords (everything but ``extend``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extend"}

    def with_(self, **kw: Any) -> "RunOptions":
        return replace(self, **kw)
