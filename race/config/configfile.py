"""Pilot-grid configuration: frozen dataclasses, YAML loading, validation.

A config names the policy, the reward system, the FLOP budget *per pilot*, the
ρ grid and the fixed GRPO knobs. Every validation error is a ``ConfigError``
(a ``ValueError``) with a one-line message naming the bad value and what was
expected; the CLI turns it into exit code 2. The rules a ``GridConfig`` keeps, and
the choices and bounds they check against, are race.config.rules'; a config is
checked by them as it is built.

YAML schema: see ``docs/interfaces.md``.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping

from race.core.errors import ConfigError  # noqa: F401  (defined there; race.config.configfile.ConfigError is the name users know)
from race.core.safeio import quote          # a bad value in a message: at most ~200 characters of it
from race.config.rules import NAME_PATTERN, parse_models, validate_config

DEFAULT_GRID = (0.3, 0.45, 0.6, 0.72, 0.85)


def parse_flops(value: Any, what: str = "budget", *, noun: str = "FLOP count", example: str = "2e17") -> float:
    """Parse a FLOP count (or, with ``noun``, another positive number) given as a number or a
    string such as ``"2e17"``.

    PyYAML reads ``2e17`` (no dot) as a *string*, so strings are accepted.
    """
    shown = quote(value)
    if isinstance(value, bool):
        raise ConfigError(f"{what} {shown} is not a {noun}: expected a positive number like {example}")
    try:
        x = float(str(value).strip().replace("_", "")) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{what} {shown} is not a {noun}: expected a positive number like {example}") from None
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{what} {shown} must be a positive finite {noun}, e.g. {example}")
    return x


def parse_grid(value: Any) -> tuple[float, ...]:
    """Parse ρ targets from a list or a comma-separated string; each in (0, 1)."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ConfigError(f"grid {quote(value)} is not valid: expected a list of ρ values in (0, 1), "
                          "e.g. [0.3, 0.5, 0.7]")
    out = []
    for item in items:
        try:
            if isinstance(item, bool):
                raise TypeError
            rho = float(item)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"grid value {quote(item)} is not a number: expected ρ values in (0, 1)") from None
        if not 0.0 < rho < 1.0:
            raise ConfigError(f"grid value ρ={rho:g} is outside (0, 1): ρ = C_learning / C_total")
        out.append(rho)
    if not out:
        raise ConfigError("grid is empty: expected at least one ρ in (0, 1)")
    if len(set(out)) != len(out):
        dup = next(r for i, r in enumerate(out) if r in out[:i])
        raise ConfigError(f"grid {quote(out)} repeats ρ={dup:g}: expected distinct ρ targets")
    return tuple(sorted(out))


@dataclass(frozen=True)
class LoRASettings:
    rank: int = 8                 # LoRA rank r
    alpha: float = 16.0           # LoRA scaling numerator (scale = alpha / r)
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RewardSettings:
    kind: str = "sparse"          # sparse | structured | dense | math | format | mix | prm | proxy-prm | custom
    model: str | None = None      # reward model / PRM (HF id or folder) for prm kinds
    num_labels: int = 2           # head size of the reward model (2: PRM positive/negative)
    function: str | None = None   # "module:callable" for kind=custom
    aggregation: str = "min"      # prm kinds: step scores → reward: min | product | last | mean
    step_separator: str | None = None   # prm kinds: text between steps (None: ";" for arithmetic-steps, else "\n\n")
    trust_remote_code: bool = False     # prm kinds: allow the model's own code (Qwen2.5-Math-PRM needs it)
    batch_size: int = 64          # prm kinds: sequences per PRM forward
    timeout: float = 60.0         # custom: seconds a batch may take (its own process; a hang fails the pilot)
    mix: dict[str, float] | None = field(default=None, hash=False)   # kind=mix: rule reward → weight,
                                  # e.g. {math: 0.9, format: 0.1}; the reward is the weighted sum
    check_timeout: float = 2.0    # math / format (alone or in a mix): seconds one answer check may take; over: 0


@dataclass(frozen=True)
class GRPOSettings:
    temperature: float = 1.0      # sampling temperature of rollouts
    top_p: float = 1.0            # nucleus sampling of rollouts
    max_completion_len: int = 1024  # new tokens per rollout (also the dr_grpo normaliser)
    clip_eps: float = 0.2         # PPO clip ε
    clip_eps_high: float | None = None  # upper clip ε (DAPO's clip-higher, e.g. 0.28); None: clip_eps
    beta: float = 0.0             # KL-to-reference coefficient (0: no reference forward)
    entropy_coef: float = 0.0     # entropy bonus coefficient
    loss_agg: str = "dapo"        # dapo | grpo | dr_grpo token aggregation
    advantage: str = "grpo"       # grpo (std-scaled) | dr_grpo (unscaled)
    grad_checkpointing: bool = False  # recompute activations in the update (memory for FLOPs; counted)
    healthy_recipe: bool = False  # KL+entropy on easy data, neither on hard (from the base pass rate)
    fast_path: bool = True        # lean forward + own LoRA for Llama-family models (race.engine.backends.lean)
    micro_batch: int | None = None  # sequences per update forward/backward (whole prompt groups; None: all)


@dataclass(frozen=True)
class ScheduleKnobs:
    prompts_per_step: int = 8     # B_p the planner starts from (it moves it within [1, 2×] to hit the budget)
    n_train: int = 8              # rollouts trained per prompt
    max_n_gen: int = 64           # upper bound on rollouts generated per prompt (lower ρ)
    max_mu: int = 8               # upper bound on update iterations per batch (higher ρ)
    n_gen: int | None = None      # fix n_gen across the grid (None: planner chooses)
    mu: int | None = None         # fix μ across the grid (None: planner chooses)
    prefix_shared: bool = True    # rollouts of a prompt share its prefill (KV cache)
    lower_rho_by: str = "generate"  # how ρ goes below on-policy: "generate" more rollouts per
                                    # prompt (n_gen > n_train, n_train fixed) or "keep" fewer of a
                                    # fixed group (n_train < n_gen = schedule.n_gen or n_train),
                                    # then more rollouts for the smallest subset
    min_n_train: int = 2          # "keep": the smallest subset trained per prompt


@dataclass(frozen=True)
class LearningRate:
    ref: float = 1e-3             # η_ref at batch B_ref (LoRA on the tiny policy: ~1e-3 at 64)
    ref_batch: int = 64           # B_ref, sequences per gradient step
    fixed: bool = False           # hold η = η_ref across the grid instead of the √B rule
    schedule: str = "constant"    # η over a run's own optimizer steps: constant | linear | cosine (decay to 0)
                                  # | wsd (warm-up, stable, then a linear decay to 0 over the last `decay` share)
    warmup: float = 0.0           # share of the run's optimizer steps spent warming up linearly from 0
    decay: float = 0.2            # wsd only: share of the run's optimizer steps in the final decay


@dataclass(frozen=True)
class EvalTask:
    """A downstream held-out set (``eval.tasks``): every row is held out (never trained on), each
    set is its own pair of targets ``NAME/pass@1`` and ``NAME/pass@k`` (k = ``samples``)."""
    path: str                     # a built-in task (its held-out split), a .jsonl / .parquet file or an HF dataset
    name: str | None = None       # the targets' prefix (None: the file's stem or the task's name)
    prompts: int | None = None    # the first rows evaluated (None: eval.prompts, or all the set has if fewer)
    samples: int | None = None    # samples per prompt (None: eval.samples)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        base = os.path.basename(self.path.rstrip("/"))
        for ext in (".jsonl", ".json", ".parquet", ".pq"):
            if base.lower().endswith(ext):
                return base[:-len(ext)]
        return base.replace("/", "-")


@dataclass(frozen=True)
class EvalSettings:
    prompts: int = 200            # held-out evaluation prompts
    samples: int = 4              # samples per prompt (pass@1, best@k, worst@k)
    temperature: float = 1.0      # sampling temperature of the held-out evaluation
    judge_model: str | None = None      # a step / outcome judge model (HF id or folder): adds the `judge` target
    judge_aggregation: str = "mean"     # its step scores → one score per sample: min | product | last | mean
    judge_trust_remote_code: bool = False   # allow the judge model's own code (explicit opt-in)
    checkpoints: int | tuple[float, ...] = 8    # held-out evaluations during a pilot: a count of log-spaced
                                                # budget fractions 1/64 … 1, or the fractions; 0: off (race.stats.instability)
    checkpoint_prompts: int | None = None       # held-out prompts evaluated at each checkpoint (the first ones;
                                                # None: all, at most 100)
    tasks: tuple[EvalTask, ...] = ()            # downstream held-out sets, each its own targets (EvalTask)
    checker: str = "auto"         # pass@k's answer check: exact (the text before EOS equals the answer) | math
                                  # (the final answer by math-verify) | auto (math when the reward or task is)

    def __post_init__(self) -> None:
        # entries as paths or mappings (YAML, a stored config) become EvalTasks, checked
        object.__setattr__(self, "tasks", _eval_tasks(self.tasks, "eval.tasks"))


@dataclass(frozen=True)
class GridConfig:
    """Everything a pilot grid needs; see docs/interfaces.md for the YAML form."""

    model: str                                    # the policy: an HF id, a local folder, or a shipped race/… policy
    budget: float                                 # FLOPs per pilot (every point × seed)
    grid: tuple[float, ...] = DEFAULT_GRID        # ρ targets
    seeds: int = 2                                # seeds per grid point
    first_seed: int = 0                           # the grid's seeds are first_seed … first_seed + seeds − 1 (a rerun
                                                  # of a grid with other seeds; 0: the seeds every grid ran before)
    name: str = "race"                            # the grid's name (its default output folder runs/NAME)
    task: str = "arithmetic-easy"                 # built-in task or dataset path
    full_run_budget: float | None = None          # the user's planned full-run FLOPs
    prompt_len: float = 64.0                      # expected tokens (calibration replaces these)
    completion_len: float = 256.0                 # expected completion tokens (calibration replaces it too)
    reward: RewardSettings = field(default_factory=RewardSettings)
    lora: LoRASettings = field(default_factory=LoRASettings)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    schedule: ScheduleKnobs = field(default_factory=ScheduleKnobs)
    learning_rate: LearningRate = field(default_factory=LearningRate)
    eval: EvalSettings = field(default_factory=EvalSettings)
    backend: str = "auto"                         # rollout backend: auto | hf | vllm (auto: vllm where installed on a GPU)
    gpu_memory: float | None = None               # bytes of one GPU; `race plan` refuses schedules that exceed it
    vllm_sleep: str = "auto"                      # vLLM sleep mode during the update: auto | on | off (race.flops.memory)
    allow_approximate_flops: bool = False         # count a model type outside race.flops.architectures' table anyway
    chat_template: str = "auto"                   # prompts as a user turn of the tokenizer's chat template: auto (when
                                                  # it has one and the prompt holds none of its special tokens) | on | off
    system_prompt: str | None = None              # the system turn the chat template opens with (None: none)
    models: tuple[str, ...] = ()                  # a grid over policies: one ρ grid per model at the same budget
                                                  # (race.run.multimodel); model is then models[0]
    pilot_design: str = "grid"                    # how the pilots are sized: grid (as written) | fit | flat | prior,
                                                  # within pilot_share of full_run_budget (race.run.sizing)
    pilot_share: float = 0.10                     # the share of the full run a sized design spends on pilots

    def __post_init__(self) -> None:
        self._typed()
        validate_config(self)

    def _typed(self) -> None:
        """The fields a constructor call can get wrong by type (a config file is typed by its schema first):
        FLOPs as finite positive numbers (strings like "2e17" read), the grid as ρ values in (0, 1), the task
        a name, each section its settings class. ConfigError, one line."""
        object.__setattr__(self, "budget", parse_flops(self.budget))
        if self.full_run_budget is not None:
            object.__setattr__(self, "full_run_budget", parse_flops(self.full_run_budget, "full_run_budget"))
        grid = parse_grid(self.grid)            # the checks; a list keeps its order, a "0.3,0.5" string is read
        object.__setattr__(self, "grid", grid if isinstance(self.grid, str) else tuple(float(r) for r in self.grid))
        if not isinstance(self.task, str) or not self.task:
            raise ConfigError(f"task {quote(self.task, 80)} must be a built-in task name or a dataset path (a string)")
        for name, cls in (("reward", RewardSettings), ("lora", LoRASettings), ("grpo", GRPOSettings),
                          ("schedule", ScheduleKnobs), ("learning_rate", LearningRate), ("eval", EvalSettings)):
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} {quote(getattr(self, name), 80)} must be a race.config.configfile.{cls.__name__} "
                                  "(a mapping in a config file or config_from_dict)")
        from race.config import schema

        schema.check_built(self)            # every section's fields as a config file's are checked (types, ranges)

    @property
    def pilots(self) -> int:
        return len(self.grid) * self.seeds

    @property
    def seed_ids(self) -> range:
        """The seeds every grid point runs: ``first_seed`` … ``first_seed + seeds − 1``."""
        return range(self.first_seed, self.first_seed + self.seeds)

    def with_overrides(self, **kw: Any) -> "GridConfig":
        """Copy with top-level fields replaced (``None`` values are ignored)."""
        kw = {k: v for k, v in kw.items() if v is not None}
        unknown = sorted(set(kw) - {f.name for f in fields(self)})
        if unknown:
            raise ConfigError(f"{unknown[0][:60]!r} is not a config field: expected one of "
                              f"{', '.join(f.name for f in fields(self))}")
        if "budget" in kw:
            kw["budget"] = parse_flops(kw["budget"])
        if "grid" in kw:
            kw["grid"] = parse_grid(kw["grid"])
        if "gpu_memory" in kw:
            from race.core.units import parse_bytes

            kw["gpu_memory"] = float(parse_bytes(kw["gpu_memory"]))
        if "models" in kw:
            kw["models"] = parse_models(kw["models"])
            kw.setdefault("model", kw["models"][0])
        elif "model" in kw and self.models:      # one model given: the grid is no longer over policies
            kw["models"] = ()
        return replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain values; ``models`` only when the grid is over policies, so a
        one-policy config (every stored study and results file) reads as before it existed."""
        d = asdict(self)
        if not self.models:
            d.pop("models")
        if not self.first_seed:                  # seeds from 0: reads as before first_seed existed
            d.pop("first_seed")
        if self.pilot_design == "grid" and self.pilot_share == 0.10:   # as written: reads as before sizing existed
            d.pop("pilot_design")
            d.pop("pilot_share")
        return d


_SECTIONS = {"reward": RewardSettings, "lora": LoRASettings, "grpo": GRPOSettings,
             "schedule": ScheduleKnobs, "learning_rate": LearningRate, "eval": EvalSettings}


def default_settings() -> dict[str, Any]:
    """Every setting's default, as ``GridConfig.to_dict`` writes it (model and budget left out):
    what a study stored before a setting existed ran with."""
    d = GridConfig(model="-", budget=1.0).to_dict()
    return {k: v for k, v in d.items() if k not in ("model", "budget")}


def _eval_tasks(raw: Any, name: str) -> tuple[EvalTask, ...]:
    """``eval.tasks`` as ``EvalTask``s: a list whose entries are a path, or a mapping with ``path``
    and optional ``name``, ``prompts``, ``samples``."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(f"{name} {raw!r} is not valid: expected a list of datasets (paths, or mappings with a path)")
    known = {f.name for f in fields(EvalTask)}
    out = []
    for i, item in enumerate(raw):
        where = f"{name}[{i}]"
        if isinstance(item, EvalTask):
            out.append(item)
            continue
        if isinstance(item, str):
            item = {"path": item}
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where} {item!r} is not valid: expected a dataset path or a mapping with a path")
        unknown = sorted(set(item) - known)
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]} is not a known setting: expected some of {', '.join(sorted(known))}")
        path = item.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{where}.path {path!r} is not valid: expected a dataset path, HF name or built-in task")
        label = item.get("name")
        if label is not None and (not isinstance(label, str) or not NAME_PATTERN.fullmatch(label)):
            raise ConfigError(f"{where}.name {label!r} is not valid: expected letters, digits, '.', '_', '+', '-'")
        for key in ("prompts", "samples"):
            v = item.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{where}.{key} {v!r} is not valid: expected a positive integer")
        out.append(EvalTask(path=path, name=label, prompts=item.get("prompts"), samples=item.get("samples")))
    return tuple(out)


def _fractions(value: Any, name: str) -> Any:
    """A YAML list of fractions as a tuple of floats (PyYAML reads ``1e-2`` as a string); other values as given."""
    if not isinstance(value, (list, tuple)):
        return value
    out = []
    for v in value:
        try:
            out.append(v if isinstance(v, bool) else float(v))
        except (TypeError, ValueError):
            raise ConfigError(f"{name} value {v!r} is not a number: expected budget fractions in (0, 1]") from None
    return tuple(out)


def _section(cls: type, name: str, raw: Any) -> dict[str, Any]:
    """A config section as a normalised mapping (unknown keys refused), for race.config.schema to check."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name} must be a mapping, got {type(raw).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]} is not a known setting: expected one of {', '.join(sorted(known))}")
    kw = dict(raw)
    for k in ("ref",):
        if cls is LearningRate and k in kw:
            kw[k] = float(parse_flops(kw[k], f"{name}.{k}", noun="learning rate", example="1e-3"))
    for k in ("warmup", "decay"):
        if cls is LearningRate and isinstance(kw.get(k), str):      # YAML reads 5e-2 as a string
            try:
                kw[k] = float(kw[k])
            except ValueError:
                raise ConfigError(f"{name}.{k} {kw[k]!r} must be a share of the run's optimizer steps "
                                  "in [0, 1)") from None
    if cls is EvalSettings and "tasks" in kw:
        kw["tasks"] = _eval_tasks(kw["tasks"], f"{name}.tasks")
    if cls is RewardSettings and isinstance(kw.get("mix"), Mapping):     # the schema would read true as 1.0
        for k, w in kw["mix"].items():
            if isinstance(w, bool):
                raise ConfigError(f"{name}.mix weight {w!r} of {k!r} is not valid: expected a finite number > 0")
    if cls is EvalSettings and "checkpoints" in kw:
        kw["checkpoints"] = _fractions(kw["checkpoints"], f"{name}.checkpoints")
    if cls is LoRASettings and "targets" in kw:
        t = kw["targets"]
        kw["targets"] = LoRASettings().targets if t == "all" else (t,) if isinstance(t, str) \
            else tuple(t) if isinstance(t, (list, tuple)) else t
    return kw


def config_from_dict(raw: Mapping[str, Any], *, base_dir: str | None = None) -> GridConfig:
    """Build a validated ``GridConfig`` from a plain mapping (parsed YAML)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config must be a mapping of settings, got {type(raw).__name__}")
    known = {f.name for f in fields(GridConfig)} | {"lengths"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not a known setting: expected one of {', '.join(sorted(known))}")
    if "model" in raw and "models" in raw:
        raise ConfigError("config has both 'model' and 'models': give model for one policy, or models "
                          "(a list of at least 2) for a grid over policies")
    if "model" not in raw and "models" not in raw:
        raise ConfigError("config has no 'model': expected a Hugging Face id or a folder with a config.json")
    if "budget" not in raw:
        raise ConfigError("config has no 'budget': expected FLOPs per pilot, e.g. budget: 2e17")
    kw: dict[str, Any] = {k: v for k, v in raw.items() if k not in _SECTIONS and k != "lengths"}
    kw["budget"] = parse_flops(raw["budget"])
    if raw.get("full_run_budget") is not None:
        kw["full_run_budget"] = parse_flops(raw["full_run_budget"], "full_run_budget")
    if "grid" in raw:
        kw["grid"] = parse_grid(raw["grid"])
    if "models" in raw:
        kw["models"] = tuple(_near_config(m, base_dir) for m in parse_models(raw["models"]))
        kw["model"] = kw["models"][0]
    if raw.get("gpu_memory") is not None:
        from race.core.units import parse_bytes

        kw["gpu_memory"] = float(parse_bytes(raw["gpu_memory"]))
    if isinstance(raw.get("vllm_sleep"), bool):      # YAML reads a bare on / off as true / false
        kw["vllm_sleep"] = "on" if raw["vllm_sleep"] else "off"
    lengths = raw.get("lengths") or {}
    if not isinstance(lengths, Mapping):
        raise ConfigError(f"lengths {lengths!r} is not valid: expected a mapping like {{prompt: 64, completion: 256}}")
    unknown = sorted(set(lengths) - {"prompt", "completion"})
    if unknown:
        raise ConfigError(f"lengths.{unknown[0]} is not a known setting: expected prompt and completion")
    if "prompt" in lengths:
        kw["prompt_len"] = lengths["prompt"]
    if "completion" in lengths:
        kw["completion_len"] = lengths["completion"]
    for key in ("model", "task"):       # ./ and ../ paths are the config's neighbours; others as given
        if key in kw:
            kw[key] = _near_config(kw[key], base_dir)
    for name, cls in _SECTIONS.items():
        kw[name] = _section(cls, name, raw.get(name))
    from race.config import schema

    if kw["eval"].get("tasks"):
        kw["eval"]["tasks"] = tuple(replace(t, path=_near_config(t.path, base_dir)) for t in kw["eval"]["tasks"])
    checked = schema.validate(kw, GridConfig)        # types, finiteness, ranges: one line naming the field
    sections = {name: cls(**checked.pop(name)) for name, cls in _SECTIONS.items()}
    if base_dir and sections["reward"].function:
        sections["reward"] = replace(sections["reward"],
                                     function=_reward_near_config(sections["reward"].function, base_dir))
    return GridConfig(**checked, **sections)


def _near_config(value: Any, base_dir: str | None) -> Any:
    """A ``./`` or ``../`` path as the config's neighbour; other values as given."""
    if base_dir and isinstance(value, str) and value.startswith(("./", "../")):
        return os.path.normpath(os.path.join(base_dir, value))
    return value


def _reward_near_config(function: str, base_dir: str) -> str:
    """A custom reward named relative to its config: ``file.py:fn`` becomes an absolute path,
    and ``module:fn`` whose ``module.py`` sits beside the config becomes that file's path, so the
    config works from any directory and reads the same whatever ``sys.path`` holds (``race pilot``
    and ``race.diagnose`` from the config's folder resume one study). A module importable from
    elsewhere (another file of that name) keeps its name."""
    import importlib.util

    module, sep, attr = function.rpartition(":")
    if not sep:
        return function
    if module.endswith(".py"):
        return function if os.path.isabs(module) else f"{os.path.normpath(os.path.join(base_dir, module))}:{attr}"
    beside = os.path.join(base_dir, module.replace(".", os.sep) + ".py")
    if "." not in module and os.path.isfile(beside):
        spec = importlib.util.find_spec(module)
        origin = getattr(spec, "origin", None)
        if spec is None or (origin and os.path.realpath(origin) == os.path.realpath(beside)):
            return f"{beside}:{attr}"
    return function


def load_config(path: str) -> GridConfig:
    """Read a YAML pilot-grid config; errors are one-line ``ConfigError``s."""
    import yaml

    from race.core.safeio import MAX_CONFIG_BYTES, UnsafeInput, load_yaml, read_capped

    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"config path {quote(path, 80)} must be a file path (config_from_dict reads a mapping)")
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise ConfigError(f"config file {str(path)!r} {what}: expected a YAML pilot-grid config")
    try:
        raw = load_yaml(read_capped(path, limit=MAX_CONFIG_BYTES, what="config file"), what=f"config file {path!r}")
    except UnsafeInput as e:
        raise ConfigError(str(e)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path!r} is not UTF-8 text: expected a YAML pilot-grid config") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())       # one line, whatever the parser said
        raise ConfigError(f"config file {path!r} is not valid YAML{where}: {problem}") from None
    except TypeError:       # a key YAML can write and Python cannot hash (a list or a mapping as a key)
        raise ConfigError(f"config file {path!r} has a key that is a list or a mapping: expected names as keys") \
            from None
    if raw is None:
        raise ConfigError(f"config file {path!r} is empty: expected a YAML mapping with model and budget")
    return config_from_dict(raw, base_dir=os.path.dirname(os.path.abspath(path)))
