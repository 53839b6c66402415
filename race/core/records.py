"""Immutable records that flow between RACE's pure modules.

Everything here is a frozen dataclass deriving from :class:`Record`, whose ``to_dict`` and ``from_dict`` come from the
dataclass fields, not from code per class: ``to_dict`` writes the fields (and a class's computed properties,
``_derived``, in the key order ``_keys`` names when it differs), and ``from_dict`` is the typed validation of pydantic
(the config's schema library) on the dataclass itself, so a results file (``results.json``) round-trips exactly, its
numbers are checked for type on the way in, and a bad one fails in one line (:class:`RecordError`). Fields added after
a file was written (``PilotResult.checkpoints``, ``Diagnosis.stability``, ``Diagnosis.forecast``,
``TargetVerdict.open_side``) read back as their defaults; computed keys in the file (``rho``, ``total``, ``shares`` …)
are ignored on reading. No torch, no optuna; pydantic is imported on the first ``from_dict``.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import MISSING as dataclasses_MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar, Mapping, Sequence

from race.core.errors import RaceError
from race.core.validation import coerced_number, number_kind, validation_line

# renderers by record kind ("diagnosis" → fn(diagnosis, fmt) -> str): race.stats.report registers its
# own when it is imported, so records never import the renderer (the layer above them)
RENDERERS: dict[str, Callable[..., str]] = {}

# the keys of a study's meta (results.json's diagnosis meta) that hold the warnings of its calibration, in the
# order race pilot prints them (race.run.study writes them, race.stats.report repeats them)
CALIBRATION_WARNINGS = ("data_warning", "reward_warning", "signal_warning", "share_warning")


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


class RecordError(RaceError):
    """A record that does not validate; the message is one line naming the field and the problem."""


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data: records as their dicts, enums as their values, tuples as lists."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        if all(type(v) is float or type(v) is int or type(v) is str for v in value):   # a results file's scores
            return list(value)
        return [_plain(v) for v in value]
    return value


@functools.lru_cache(maxsize=None)
def _adapter(cls: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


@functools.lru_cache(maxsize=None)
def _defaulted(cls: type) -> frozenset[str]:
    """The fields of ``cls`` with a non-null default."""
    return frozenset(f.name for f in fields(cls) if f.default_factory is not dataclasses_MISSING
                     or f.default not in (dataclasses_MISSING, None))


def _none_as_default(cls: type, d: Any) -> Any:
    """Files written before a field existed may hold ``null`` where the field now has a non-null
    default (an empty tuple or dict): read that as the default, as the per-class readers did."""
    if not isinstance(d, Mapping):
        return d
    has_default = _defaulted(cls)
    return {k: v for k, v in d.items() if not (v is None and k in has_default)}


class Record:
    """The serialization every record shares (see the module docstring)."""

    _derived: ClassVar[tuple[str, ...]] = ()    # computed properties written after the fields
    _keys: ClassVar[tuple[str, ...]] = ()       # the written key order, when not fields + _derived

    def to_dict(self) -> dict[str, Any]:
        keys = self._keys or tuple(f.name for f in fields(self)) + self._derived  # type: ignore[arg-type]
        return {k: _plain(getattr(self, k)) for k in keys}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Any:
        """The record from its dict, validated by type; :class:`RecordError` (one line) if it is not one."""
        from pydantic import ValidationError

        try:
            record = _adapter(cls).validate_python(d)
        except ValidationError as e:
            raise RecordError(validation_line(e, cls.__name__)) from None
        bad = coerced_number(d, record.to_dict())
        if bad:
            raise RecordError(f"{cls.__name__}.{bad[0]} {bad[1]!r:.60} is {number_kind(bad[1])}: expected a number")
        return record

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """pydantic's schema of the dataclass, after ``_none_as_default``: nested records (a results
        file's pilots, a diagnosis's verdicts) read old files as ``from_dict`` does."""
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(functools.partial(_none_as_default, cls), handler(source))


@dataclass(frozen=True)
class FlopBreakdown(Record):
    """FLOPs spent by one pilot (or one step), split by where they went."""

    __pydantic_config__ = {"allow_inf_nan": False}     # a FLOP count is a finite number

    _derived = ("total", "rho")

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


@dataclass(frozen=True)
class Schedule(Record):
    """One grid point of the IsoFLOP plan: how a target ρ becomes a GRPO schedule.

    ``flops_per_step`` is the planned cost of one optimizer step (all μ
    iterations); ``flops`` the planned cost of the whole pilot.
    """

    _derived = ("rho",)

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


@dataclass(frozen=True)
class Checkpoint(Record):
    """A held-out evaluation during a pilot (race.stats.instability).

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


@dataclass(frozen=True)
class PilotResult(Record):
    """The outcome of one pilot run (one grid point, one seed).

    ``evals`` maps a target name (e.g. ``"reward"``, ``"pass@1"``) to the
    per-evaluation-prompt score, a tuple ordered by evaluation-prompt index, so
    that the bootstrap can resample prompts jointly across pilots.
    ``curve`` is the reward-vs-FLOPs curve: ``(flops_spent, mean_reward)`` pairs.
    ``checkpoints``: held-out evaluations during the run, in FLOP order (empty when off).
    """

    _keys = ("rho_target", "seed", "rho", "flops", "evals", "schedule", "curve", "wall_seconds", "status", "extra",
             "checkpoints")

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


@dataclass(frozen=True)
class PointSummary(Record):
    """All seeds of one grid point, summarised for one target."""

    _keys = ("rho_target", "rho_measured", "n_seeds", "flops", "shares", "reward_mean", "reward_ci", "schedule",
             "seconds")

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
    def shares(self) -> dict[str, float]:
        """The mean breakdown's shares of C_total (written to the results file beside ``flops``)."""
        return self.flops.shares()

    @property
    def budget_seconds(self) -> float:
        """Mean wall seconds of the phases the FLOP budget pays for (rollout, reward, update,
        sync); setup and evaluation are left out. 0 when no timing was recorded."""
        return float(sum(self.seconds.get(k, 0.0) for k in BUDGET_PHASES))

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
class TargetVerdict(Record):
    """The regime verdict for one evaluation target."""

    _keys = ("target", "regime", "rho_range", "open_side", "recommended_rho", "confidence", "best_rho", "best_reward",
             "slope", "slope_ci", "argmax_ci", "points", "fits", "warnings")

    target: str
    regime: Regime
    rho_range: tuple[float, float]      # recommended ρ range
    confidence: float                   # predicted share of reruns stating the regime, in [0, 1]
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
    # mirror; None: the closed range rho_range. Set by race.stats.regime's rule; rho_range itself stays
    # the fitted range inside the grid either way.
    open_side: str | None = None

    def __post_init__(self) -> None:
        if self.open_side not in OPEN_SIDES:
            raise RecordError(f"open_side {self.open_side!r}: expected one of {OPEN_SIDES}")

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


@dataclass(frozen=True)
class Instability(Record):
    """A pilot whose held-out score fell from its best earlier checkpoint towards the base
    policy's (the rule: race.stats.instability). ``fraction`` / ``step`` / ``flops``: where it fell;
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


@dataclass(frozen=True)
class StabilityPoint(Record):
    """One grid point's pilots with checkpoints: how many, how many unstable, mean checkpoints
    and checkpoint prompts per pilot, and the mean FLOPs of a pilot's held-out evaluations
    (final + checkpoints), which are outside C_total."""

    _derived = ("share",)

    rho_target: float
    pilots: int
    unstable: int
    checkpoints: float
    prompts: int
    eval_flops: float

    @property
    def share(self) -> float:
        return self.unstable / self.pilots if self.pilots else 0.0


@dataclass(frozen=True)
class Stability(Record):
    """Held-out checkpoints of a grid: the instability rule's constants, unstable pilots per
    grid point, and each unstable pilot (race.stats.instability)."""

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


@dataclass(frozen=True)
class ForecastPoint(Record):
    """One grid point of a forecast (race.stats.forecast): its pilots' held-out curve and the fitted
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


@dataclass(frozen=True)
class Backtest(Record):
    """A model fitted on the checkpoints up to ``cut_fraction`` of the pilot budget, predicting the
    end of every grid point's pilots, ``factor`` (geometric mean over points of end FLOPs / last
    fitted FLOPs) further. ``errors``: predicted − observed per point (ρ order); ``mae``: their mean
    absolute value; ``contrast_mae``: the same after removing their mean over ρ (the part that can
    reorder ρ); ``spread``: max − min of the observed end scores; ``held``: contrast_mae below the
    rule's share of the spread (race.stats.forecast)."""

    model: str
    cut_fraction: float
    factor: float
    errors: tuple[float, ...]
    mae: float
    contrast_mae: float
    spread: float
    held: bool

FORECAST_STATUSES = ("predicted", "forced", "refused")


@dataclass(frozen=True)
class Forecast(Record):
    """What the pilots' held-out curves predict at the full-run budget (race.stats.forecast).

    ``status``: ``predicted`` (within the factor the backtests support), ``forced`` (past it, on
    request) or ``refused`` (then ``message`` is the one-line reason and the budget that would
    support a prediction, and the predictions, regime and best ρ are None). ``factor``: full-run
    budget / pilot budget; ``supported_factor``: the largest backtest factor up to which every
    backtest held (None: none held); ``needed_budget``: the pilot budget that would support this
    full run. ``model``: the model the half-budget backtest chose; ``regime`` / ``best_rho`` /
    ``rho_range`` / ``open_side`` / ``confidence``: the regime rule on the predicted scores; ``pilot_regime`` /
    ``pilot_best_rho``: the verdict at the pilot budget; ``differs``: the two disagree on the
    regime or the best ρ. ``r0``: the base policy's mean checkpoint score (None without checkpoints)."""

    _keys = ("target", "full_run_budget", "pilot_budget", "factor", "status", "message", "model", "shared_slope", "r0",
             "points", "backtests", "supported_factor", "needed_budget", "regime", "best_rho", "rho_range", "open_side",
             "confidence", "pilot_regime", "pilot_best_rho", "differs", "budgets", "settings", "warnings", "range_at_budget",
             "stability_at_budget")

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
    # the recommended range at F from the budget-drift model (race.stats.drift.RangeAtBudget.to_dict), or
    # {"refused": the one-line reason}; a second statement beside the verdict at B, with its own evidence
    range_at_budget: Mapping[str, Any] | None = None
    # the stability line at F (race.stats.instability.stability_at): {"status", "line"}
    stability_at_budget: Mapping[str, str] | None = None

    @property
    def predicts(self) -> bool:
        """Whether predictions were made (predicted or forced)."""
        return self.status != "refused"


@dataclass(frozen=True)
class Diagnosis(Record):
    """What RACE concludes from a pilot grid.

    ``regime``, ``rho_range`` and ``confidence`` are those of the primary target
    (the native training reward by default); ``verdicts`` holds every target's.
    ``stability``: unstable pilots per grid point, from their held-out checkpoints (None when
    the pilots have none). ``forecast``: the prediction at the full-run budget (race.stats.forecast;
    None when no full-run budget was given).
    """

    _keys = ("primary_target", "regime", "rho_range", "open_side", "recommended_rho", "confidence", "verdicts", "warnings",
             "meta", "stability", "forecast")

    primary_target: str
    verdicts: Mapping[str, TargetVerdict]
    warnings: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    stability: Stability | None = None
    forecast: Forecast | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.verdicts, Mapping):
            raise RecordError(f"verdicts {str(self.verdicts)[:60]!r} must be a mapping of target names to TargetVerdicts")
        if not isinstance(self.primary_target, str) or self.primary_target not in self.verdicts:
            raise RecordError(f"primary_target {str(self.primary_target)[:60]!r} has no verdict: expected one of "
                             f"{sorted(self.verdicts)[:8]}")

    @property
    def primary(self) -> TargetVerdict:
        return self.verdicts[self.primary_target]

    def __str__(self) -> str:
        """The text report (``print(race.diagnose(...))``), as ``race report`` prints it, once
        race.stats.report is loaded (it registers itself: records sit below the renderer); before that, a
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
