"""Immutable records that flow between RACE's pure modules.

Everything here is a frozen dataclass with ``to_dict`` / ``from_dict`` so that a
results file (``results.json``) round-trips exactly; fields added after a file was written
(``PilotResult.checkpoints``, ``Diagnosis.stability``, ``Diagnosis.forecast``,
``TargetVerdict.open_side``) read back as empty. No torch, no optuna.
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

# renderers by record kind ("diagnosis" → fn(diagnosis, fmt) -> str): race.report registers its
# own when it is imported, so records never import the renderer (the layer above them)
RENDERERS: dict[str, Callable[..., str]] = {}


class Regime(str, enum.Enum):
    """The verdict classes of a diagnosis.

    - ``SEARCH_HEAVY``: reward falls as ρ rises; put more compute into rollouts.
    - ``UPDATE_HEAVY``: reward rises with ρ; put more compute into policy updates.
    - ``REWARD_HEAVY``: feedback (reward-model inference) takes a dominant share
      of the budget at the best point; feedback cost is the first lever.
    - ``BALANCED``: a concave response with its optimum inside the grid.
    - ``INCONCLUSIVE``: noise dominates; keep the pilot-best point, add seeds.
    """

    SEARCH_HEAVY = "search-heavy"
    UPDATE_HEAVY = "update-heavy"
    REWARD_HEAVY = "reward-heavy"
    BALANCED = "balanced"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        """``print(diagnosis.regime)`` shows ``search-heavy``, as the report does."""
        return self.value


# Pilot phases the FLOP budget pays for (PilotResult.wall_seconds also has setup and eval).
BUDGET_PHASES = ("rollout", "reward", "update", "sync")


@dataclass(frozen=True)
class FlopBreakdown:
    """FLOPs spent by one pilot (or one step), split by where they went."""

    search: float = 0.0
    learning: float = 0.0
    reward: float = 0.0

    @property
    def total(self) -> float:
        return self.search + self.learning + self.reward

    @property
    def rho(self) -> float:
        """Update fraction ρ = C_learning / C_total (0 when nothing was spent)."""
        return self.learning / self.total if self.total > 0 else 0.0

    def shares(self) -> dict[str, float]:
        t = self.total
        if t <= 0:
            return {"search": 0.0, "learning": 0.0, "reward": 0.0}
        return {"search": self.search / t, "learning": self.learning / t, "reward": self.reward / t}

    def __add__(self, other: "FlopBreakdown") -> "FlopBreakdown":
        return FlopBreakdown(self.search + other.search, self.learning + other.learning,
                             self.reward + other.reward)

    def scaled(self, factor: float) -> "FlopBreakdown":
        return FlopBreakdown(self.search * factor, self.learning * factor, self.reward * factor)

    def to_dict(self) -> dict[str, float]:
        return {"search": self.search, "learning": self.learning, "reward": self.reward,
                "total": self.total, "rho": self.rho}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FlopBreakdown":
        return cls(float(d.get("search", 0.0)), float(d.get("learning", 0.0)), float(d.get("reward", 0.0)))


@dataclass(frozen=True)
class Schedule:
    """One grid point of the IsoFLOP plan: how a target ρ becomes a GRPO schedule.

    ``flops_per_step`` is the planned cost of one optimizer step (all μ
    iterations); ``flops`` the planned cost of the whole pilot.
    """

    rho_target: float
    prompts_per_step: int       # B_p
    n_gen: int                  # rollouts generated per prompt
    n_train: int                # rollouts trained per prompt (max-reward-variance subset)
    mu: int                     # update iterations per rollout batch
    steps: int                  # optimizer "outer" steps (one rollout batch each)
    learning_rate: float
    lora_rank: int
    flops_per_step: FlopBreakdown
    flops: FlopBreakdown

    @property
    def rho(self) -> float:
        return self.flops.rho

    @property
    def batch_size(self) -> int:
        """B = B_p · n_train: sequences per gradient step (the √B learning-rate rule's B)."""
        return self.prompts_per_step * self.n_train

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["flops_per_step"] = self.flops_per_step.to_dict()
        d["flops"] = self.flops.to_dict()
        d["rho"] = self.rho
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Schedule":
        return cls(
            rho_target=float(d["rho_target"]), prompts_per_step=int(d["prompts_per_step"]),
            n_gen=int(d["n_gen"]), n_train=int(d["n_train"]), mu=int(d["mu"]), steps=int(d["steps"]),
            learning_rate=float(d["learning_rate"]), lora_rank=int(d["lora_rank"]),
            flops_per_step=FlopBreakdown.from_dict(d["flops_per_step"]),
            flops=FlopBreakdown.from_dict(d["flops"]),
        )


def _evals_from(d: Mapping[str, Any]) -> dict[str, tuple[float, ...]]:
    return {k: tuple(float(x) for x in v) for k, v in d.items()}


@dataclass(frozen=True)
class Checkpoint:
    """A held-out evaluation during a pilot (race.checkpoints).

    ``fraction``: the budget fraction that fired it (0: the base policy before any step; 1: the
    end, a view of the final evaluation); ``step``: GRPO steps done; ``flops``: the metered
    FLOPs spent by then (training only); ``evals``: per-prompt scores per target on the
    checkpoint prompts (the same prompts, in the same order, at every checkpoint);
    ``eval_flops`` / ``seconds``: what the evaluation itself cost, never part of the budget
    (0 at the end: that cost is the final evaluation's).
    """

    fraction: float
    step: int
    flops: FlopBreakdown
    evals: Mapping[str, tuple[float, ...]]
    eval_flops: FlopBreakdown = FlopBreakdown()
    seconds: float = 0.0

    def score(self, target: str) -> float:
        vals = self.evals[target]
        return sum(vals) / len(vals) if vals else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "step": self.step, "flops": self.flops.to_dict(),
                "evals": {k: list(v) for k, v in self.evals.items()},
                "eval_flops": self.eval_flops.to_dict(), "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Checkpoint":
        return cls(float(d["fraction"]), int(d["step"]), FlopBreakdown.from_dict(d["flops"]), _evals_from(d["evals"]),
                   FlopBreakdown.from_dict(d.get("eval_flops") or {}), float(d.get("seconds", 0.0)))


@dataclass(frozen=True)
class PilotResult:
    """The outcome of one pilot run (one grid point, one seed).

    ``evals`` maps a target name (e.g. ``"reward"``, ``"pass@1"``) to the
    per-evaluation-prompt score, a tuple ordered by evaluation-prompt index, so
    that the bootstrap can resample prompts jointly across pilots.
    ``curve`` is the reward-vs-FLOPs curve: ``(flops_spent, mean_reward)`` pairs.
    ``checkpoints``: held-out evaluations during the run, in FLOP order (empty when off).
    """

    rho_target: float
    seed: int
    flops: FlopBreakdown
    evals: Mapping[str, tuple[float, ...]]
    schedule: Schedule | None = None
    curve: tuple[tuple[float, float], ...] = ()
    wall_seconds: Mapping[str, float] = field(default_factory=dict)
    status: str = "complete"
    extra: Mapping[str, Any] = field(default_factory=dict)
    checkpoints: tuple[Checkpoint, ...] = ()

    @property
    def rho(self) -> float:
        """Measured ρ (from the FLOPs actually spent)."""
        return self.flops.rho

    def score(self, target: str) -> float:
        vals = self.evals[target]
        return sum(vals) / len(vals) if vals else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "rho_target": self.rho_target, "seed": self.seed, "rho": self.rho,
            "flops": self.flops.to_dict(),
            "evals": {k: list(v) for k, v in self.evals.items()},
            "schedule": self.schedule.to_dict() if self.schedule else None,
            "curve": [list(p) for p in self.curve],
            "wall_seconds": dict(self.wall_seconds), "status": self.status, "extra": dict(self.extra),
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PilotResult":
        return cls(
            rho_target=float(d["rho_target"]), seed=int(d["seed"]),
            flops=FlopBreakdown.from_dict(d["flops"]),
            evals=_evals_from(d["evals"]),
            schedule=Schedule.from_dict(d["schedule"]) if d.get("schedule") else None,
            curve=tuple((float(a), float(b)) for a, b in d.get("curve", ())),
            wall_seconds={k: float(v) for k, v in d.get("wall_seconds", {}).items()},
            status=str(d.get("status", "complete")), extra=dict(d.get("extra", {})),
            checkpoints=tuple(Checkpoint.from_dict(c) for c in d.get("checkpoints") or ()),
        )


@dataclass(frozen=True)
class PointSummary:
    """All seeds of one grid point, summarised for one target."""

    rho_target: float
    rho_measured: float          # mean measured ρ over seeds
    n_seeds: int
    flops: FlopBreakdown         # mean breakdown over seeds
    reward_mean: float           # mean over seeds and evaluation prompts
    reward_ci: tuple[float, float]  # bootstrap CI of the mean
    schedule: Schedule | None = None
    # mean wall seconds per phase over seeds, as run. Left out of equality: timing is not
    # reproducible, and a resumed grid's diagnosis must equal the uninterrupted one.
    seconds: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def budget_seconds(self) -> float:
        """Mean wall seconds of the phases the FLOP budget pays for (rollout, reward, update,
        sync); setup and evaluation are left out. 0 when no timing was recorded."""
        return float(sum(self.seconds.get(k, 0.0) for k in BUDGET_PHASES))

    def to_dict(self) -> dict[str, Any]:
        return {"rho_target": self.rho_target, "rho_measured": self.rho_measured,
                "n_seeds": self.n_seeds, "flops": self.flops.to_dict(), "shares": self.flops.shares(),
                "reward_mean": self.reward_mean, "reward_ci": list(self.reward_ci),
                "schedule": self.schedule.to_dict() if self.schedule else None,
                "seconds": dict(self.seconds)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PointSummary":
        return cls(float(d["rho_target"]), float(d["rho_measured"]), int(d["n_seeds"]),
                   FlopBreakdown.from_dict(d["flops"]), float(d["reward_mean"]),
                   (float(d["reward_ci"][0]), float(d["reward_ci"][1])),
                   Schedule.from_dict(d["schedule"]) if d.get("schedule") else None,
                   {k: float(v) for k, v in (d.get("seconds") or {}).items()})


OPEN_SIDES = (None, "below", "above")


def rho_bounds(rho_range: Sequence[float], open_side: str | None) -> tuple[float, float]:
    """A recommended range as an interval of ρ ∈ [0, 1]: open towards 0 ("below") or 1 ("above")."""
    lo, hi = float(rho_range[0]), float(rho_range[1])
    return (0.0 if open_side == "below" else lo, 1.0 if open_side == "above" else hi)


def format_rho_range(rho_range: Sequence[float], open_side: str | None = None) -> str:
    """"[0.52, 0.59]", or "ρ ≤ 0.59" / "ρ ≥ 0.52" for a range open at a grid edge."""
    lo, hi = rho_range
    if open_side == "below":
        return f"ρ ≤ {hi:.2f}"
    if open_side == "above":
        return f"ρ ≥ {lo:.2f}"
    return f"[{lo:.2f}, {hi:.2f}]"


def format_rho_set(rho_range: Sequence[float], open_side: str | None = None) -> str:
    """The range as a statement about ρ: "ρ ∈ [0.52, 0.59]", "ρ ≤ 0.59" or "ρ ≥ 0.52"."""
    text = format_rho_range(rho_range, open_side)
    return text if open_side else f"ρ ∈ {text}"


@dataclass(frozen=True)
class TargetVerdict:
    """The regime verdict for one evaluation target."""

    target: str
    regime: Regime
    rho_range: tuple[float, float]      # recommended ρ range
    confidence: float                   # bootstrap agreement with the verdict, in [0, 1]
    best_rho: float                     # pilot-best grid point (target ρ)
    best_reward: float
    slope: float                        # d reward / d log ρ of the log-linear fit
    slope_ci: tuple[float, float]
    argmax_ci: tuple[float, float] | None   # CI of the quadratic fit's argmax ρ (None: not concave)
    points: tuple[PointSummary, ...]
    fits: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    # "below": the recommendation is ρ ≤ rho_range[1] (the best lies at the grid's lowest point of a
    # search-heavy grid, so the optimum may lie lower); "above": ρ ≥ rho_range[0], the update-heavy
    # mirror; None: the closed range rho_range. Set by race.regime's rule; rho_range itself stays
    # the fitted range inside the grid either way.
    open_side: str | None = None

    def __post_init__(self) -> None:
        if self.open_side not in OPEN_SIDES:
            raise ValueError(f"open_side {self.open_side!r}: expected one of {OPEN_SIDES}")

    @property
    def bounds(self) -> tuple[float, float]:
        """The recommended set as an interval: rho_range, opened to 0 or 1 on the open side."""
        return rho_bounds(self.rho_range, self.open_side)

    @property
    def recommended_rho(self) -> float:
        """The one ρ to run, in measured ρ as the range is: the range's centre, or the measured ρ of
        the grid-edge point (the pilot-best) of an open range."""
        if self.open_side:
            return next((p.rho_measured for p in self.points if p.rho_target == self.best_rho), self.best_rho)
        return (self.rho_range[0] + self.rho_range[1]) / 2

    def contains(self, rho: float) -> bool:
        lo, hi = self.bounds
        return lo <= rho <= hi

    def range_text(self) -> str:
        return format_rho_range(self.rho_range, self.open_side)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "regime": self.regime.value, "rho_range": list(self.rho_range),
                "open_side": self.open_side, "recommended_rho": self.recommended_rho,
                "confidence": self.confidence, "best_rho": self.best_rho, "best_reward": self.best_reward,
                "slope": self.slope, "slope_ci": list(self.slope_ci),
                "argmax_ci": list(self.argmax_ci) if self.argmax_ci else None,
                "points": [p.to_dict() for p in self.points], "fits": dict(self.fits),
                "warnings": list(self.warnings)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TargetVerdict":
        return cls(
            target=d["target"], regime=Regime(d["regime"]), rho_range=tuple(d["rho_range"]),
            confidence=float(d["confidence"]), best_rho=float(d["best_rho"]),
            best_reward=float(d["best_reward"]), slope=float(d["slope"]), slope_ci=tuple(d["slope_ci"]),
            argmax_ci=tuple(d["argmax_ci"]) if d.get("argmax_ci") else None,
            points=tuple(PointSummary.from_dict(p) for p in d["points"]), fits=dict(d.get("fits", {})),
            warnings=tuple(d.get("warnings", ())), open_side=d.get("open_side"),
        )


@dataclass(frozen=True)
class Instability:
    """A pilot whose held-out score fell from its best earlier checkpoint towards the base
    policy's (the rule: race.checkpoints). ``fraction`` / ``step`` / ``flops``: where it fell;
    ``value``, ``best`` (at ``best_fraction``), ``base`` and ``final``: means of ``target`` over
    the checkpoint prompts; ``drop_se``: the paired standard error of ``best − value``."""

    rho_target: float
    seed: int
    target: str
    fraction: float
    step: int
    flops: float
    value: float
    best: float
    best_fraction: float
    base: float
    drop_se: float
    final: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Instability":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class StabilityPoint:
    """One grid point's pilots with checkpoints: how many, how many unstable, mean checkpoints
    and checkpoint prompts per pilot, and the mean FLOPs of a pilot's held-out evaluations
    (final + checkpoints), which are outside C_total."""

    rho_target: float
    pilots: int
    unstable: int
    checkpoints: float
    prompts: int
    eval_flops: float

    @property
    def share(self) -> float:
        return self.unstable / self.pilots if self.pilots else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StabilityPoint":
        return cls(float(d["rho_target"]), int(d["pilots"]), int(d["unstable"]), float(d["checkpoints"]),
                   int(d["prompts"]), float(d["eval_flops"]))


@dataclass(frozen=True)
class Stability:
    """Held-out checkpoints of a grid: the instability rule's constants, unstable pilots per
    grid point, and each unstable pilot (race.checkpoints)."""

    target: str
    rule: Mapping[str, float]
    points: tuple[StabilityPoint, ...]
    unstable: tuple[Instability, ...] = ()

    @property
    def pilots(self) -> int:
        """Pilots with checkpoints, over the grid."""
        return sum(p.pilots for p in self.points)

    @property
    def fell(self) -> int:
        """Unstable pilots, over the grid."""
        return sum(p.unstable for p in self.points)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "rule": dict(self.rule), "points": [p.to_dict() for p in self.points],
                "unstable": [u.to_dict() for u in self.unstable]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Stability":
        return cls(d["target"], dict(d["rule"]), tuple(StabilityPoint.from_dict(p) for p in d["points"]),
                   tuple(Instability.from_dict(u) for u in d.get("unstable", ())))


@dataclass(frozen=True)
class ForecastPoint:
    """One grid point of a forecast (race.forecast): its pilots' held-out curve and the fitted
    model's prediction at the full-run budget.

    ``pilot_flops`` / ``pilot_score``: mean FLOPs and mean held-out score (checkpoint prompts) at
    the end of this point's pilots at the largest pooled budget; ``fitted_end``: the model there;
    ``predicted`` / ``predicted_ci``: at the full-run budget (None when the forecast was refused);
    ``params``: the fitted model (sigmoid: ``A``, ``c_mid``, ``B``; loglinear: ``a`` and ``b`` per
    unit of ln C); ``curve``: (FLOPs, mean score over seeds) of every checkpoint after the base,
    pooled runs one after another, for the figure."""

    rho_target: float
    rho_measured: float
    pilots: int
    pilot_flops: float
    pilot_score: float
    fitted_end: float
    predicted: float | None
    predicted_ci: tuple[float, float] | None
    params: Mapping[str, float]
    curve: tuple[tuple[float, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "predicted_ci": list(self.predicted_ci) if self.predicted_ci else None,
                "params": dict(self.params), "curve": [list(c) for c in self.curve]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ForecastPoint":
        ci = d.get("predicted_ci")
        return cls(float(d["rho_target"]), float(d["rho_measured"]), int(d["pilots"]), float(d["pilot_flops"]),
                   float(d["pilot_score"]), float(d["fitted_end"]),
                   None if d.get("predicted") is None else float(d["predicted"]),
                   (float(ci[0]), float(ci[1])) if ci else None, {k: float(v) for k, v in d["params"].items()},
                   tuple((float(a), float(b)) for a, b in d.get("curve") or ()))


@dataclass(frozen=True)
class Backtest:
    """A model fitted on the checkpoints up to ``cut_fraction`` of the pilot budget, predicting the
    end of every grid point's pilots, ``factor`` (geometric mean over points of end FLOPs / last
    fitted FLOPs) further. ``errors``: predicted − observed per point (ρ order); ``mae``: their mean
    absolute value; ``contrast_mae``: the same after removing their mean over ρ (the part that can
    reorder ρ); ``spread``: max − min of the observed end scores; ``held``: contrast_mae below the
    rule's share of the spread (race.forecast)."""

    model: str
    cut_fraction: float
    factor: float
    errors: tuple[float, ...]
    mae: float
    contrast_mae: float
    spread: float
    held: bool

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "errors": list(self.errors)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Backtest":
        return cls(str(d["model"]), float(d["cut_fraction"]), float(d["factor"]),
                   tuple(float(e) for e in d["errors"]), float(d["mae"]), float(d["contrast_mae"]),
                   float(d["spread"]), bool(d["held"]))


FORECAST_STATUSES = ("predicted", "forced", "refused")


@dataclass(frozen=True)
class Forecast:
    """What the pilots' held-out curves predict at the full-run budget (race.forecast).

    ``status``: ``predicted`` (within the factor the backtests support), ``forced`` (past it, on
    request) or ``refused`` (then ``message`` is the one-line reason and the budget that would
    support a prediction, and the predictions, regime and best ρ are None). ``factor``: full-run
    budget / pilot budget; ``supported_factor``: the largest backtest factor up to which every
    backtest held (None: none held); ``needed_budget``: the pilot budget that would support this
    full run. ``model``: the model the half-budget backtest chose; ``regime`` / ``best_rho`` /
    ``rho_range`` / ``open_side`` / ``confidence``: the regime rule on the predicted scores; ``pilot_regime`` /
    ``pilot_best_rho``: the verdict at the pilot budget; ``differs``: the two disagree on the
    regime or the best ρ. ``r0``: the base policy's mean checkpoint score (None without checkpoints)."""

    target: str
    full_run_budget: float
    pilot_budget: float
    factor: float
    status: str
    message: str
    model: str | None
    shared_slope: bool | None
    r0: float | None
    points: tuple[ForecastPoint, ...]
    backtests: tuple[Backtest, ...]
    supported_factor: float | None
    needed_budget: float | None
    regime: Regime | None
    best_rho: float | None
    rho_range: tuple[float, float] | None
    confidence: float | None
    pilot_regime: Regime
    pilot_best_rho: float
    differs: bool
    budgets: tuple[float, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    open_side: str | None = None        # as TargetVerdict.open_side
    # the recommended range at F from the budget-drift model (race.drift.RangeAtBudget.to_dict), or
    # {"refused": the one-line reason}; a second statement beside the verdict at B, with its own evidence
    range_at_budget: Mapping[str, Any] | None = None
    # the stability line at F (race.checkpoints.stability_at): {"status", "line"}
    stability_at_budget: Mapping[str, str] | None = None

    @property
    def predicts(self) -> bool:
        """Whether predictions were made (predicted or forced)."""
        return self.status != "refused"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "full_run_budget": self.full_run_budget, "pilot_budget": self.pilot_budget,
                "factor": self.factor, "status": self.status, "message": self.message, "model": self.model,
                "shared_slope": self.shared_slope, "r0": self.r0, "points": [p.to_dict() for p in self.points],
                "backtests": [b.to_dict() for b in self.backtests], "supported_factor": self.supported_factor,
                "needed_budget": self.needed_budget, "regime": self.regime.value if self.regime else None,
                "best_rho": self.best_rho, "rho_range": list(self.rho_range) if self.rho_range else None,
                "open_side": self.open_side,
                "confidence": self.confidence, "pilot_regime": self.pilot_regime.value,
                "pilot_best_rho": self.pilot_best_rho, "differs": self.differs, "budgets": list(self.budgets),
                "settings": dict(self.settings), "warnings": list(self.warnings),
                "range_at_budget": dict(self.range_at_budget) if self.range_at_budget is not None else None,
                "stability_at_budget": dict(self.stability_at_budget) if self.stability_at_budget else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Forecast":
        opt = lambda k: None if d.get(k) is None else float(d[k])  # noqa: E731
        return cls(
            target=str(d["target"]), full_run_budget=float(d["full_run_budget"]), pilot_budget=float(d["pilot_budget"]),
            factor=float(d["factor"]), status=str(d["status"]), message=str(d["message"]), model=d.get("model"),
            shared_slope=d.get("shared_slope"), r0=opt("r0"),
            points=tuple(ForecastPoint.from_dict(p) for p in d["points"]),
            backtests=tuple(Backtest.from_dict(b) for b in d["backtests"]), supported_factor=opt("supported_factor"),
            needed_budget=opt("needed_budget"), regime=Regime(d["regime"]) if d.get("regime") else None,
            best_rho=opt("best_rho"), rho_range=tuple(d["rho_range"]) if d.get("rho_range") else None,
            confidence=opt("confidence"), pilot_regime=Regime(d["pilot_regime"]),
            pilot_best_rho=float(d["pilot_best_rho"]), differs=bool(d["differs"]),
            budgets=tuple(float(b) for b in d.get("budgets") or ()), settings=dict(d.get("settings") or {}),
            warnings=tuple(d.get("warnings") or ()), open_side=d.get("open_side"),
            range_at_budget=dict(d["range_at_budget"]) if isinstance(d.get("range_at_budget"), Mapping) else None,
            stability_at_budget=dict(d["stability_at_budget"]) if isinstance(d.get("stability_at_budget"), Mapping)
            else None)


@dataclass(frozen=True)
class Diagnosis:
    """What RACE concludes from a pilot grid.

    ``regime``, ``rho_range`` and ``confidence`` are those of the primary target
    (the native training reward by default); ``verdicts`` holds every target's.
    ``stability``: unstable pilots per grid point, from their held-out checkpoints (None when
    the pilots have none). ``forecast``: the prediction at the full-run budget (race.forecast;
    None when no full-run budget was given).
    """

    primary_target: str
    verdicts: Mapping[str, TargetVerdict]
    warnings: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    stability: Stability | None = None
    forecast: Forecast | None = None

    @property
    def primary(self) -> TargetVerdict:
        return self.verdicts[self.primary_target]

    def __str__(self) -> str:
        """The text report (``print(race.diagnose(...))``), as ``race report`` prints it, once
        race.report is loaded (it registers itself: records sit below the renderer); before that, a
        one-line summary."""
        render = RENDERERS.get("diagnosis")
        return render(self, "text") if render else self.summary()

    def _repr_markdown_(self) -> str:
        """The Markdown report, for notebooks."""
        render = RENDERERS.get("diagnosis")
        return render(self, "md") if render else self.summary()

    def summary(self) -> str:
        v = self.primary
        return (f"RACE diagnosis: {v.regime.value}, recommended {format_rho_set(v.rho_range, v.open_side)} "
                f"(confidence {v.confidence:.2f}, target {v.target})")

    @property
    def regime(self) -> Regime:
        return self.primary.regime

    @property
    def rho_range(self) -> tuple[float, float]:
        return self.primary.rho_range

    @property
    def open_side(self) -> str | None:
        return self.primary.open_side

    @property
    def recommended_rho(self) -> float:
        return self.primary.recommended_rho

    @property
    def confidence(self) -> float:
        return self.primary.confidence

    @property
    def points(self) -> tuple[PointSummary, ...]:
        return self.primary.points

    def to_dict(self) -> dict[str, Any]:
        return {"primary_target": self.primary_target, "regime": self.regime.value,
                "rho_range": list(self.rho_range), "open_side": self.open_side,
                "recommended_rho": self.recommended_rho, "confidence": self.confidence,
                "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
                "warnings": list(self.warnings), "meta": dict(self.meta),
                "stability": self.stability.to_dict() if self.stability else None,
                "forecast": self.forecast.to_dict() if self.forecast else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Diagnosis":
        return cls(primary_target=d["primary_target"],
                   verdicts={k: TargetVerdict.from_dict(v) for k, v in d["verdicts"].items()},
                   warnings=tuple(d.get("warnings", ())), meta=dict(d.get("meta", {})),
                   stability=Stability.from_dict(d["stability"]) if d.get("stability") else None,
                   forecast=Forecast.from_dict(d["forecast"]) if d.get("forecast") else None)
