"""The typed schema of a pilot-grid config: every field checked by pydantic before anything runs.

The schema is derived from the config dataclasses of ``race.config.configfile`` (one source of truth for
field names and defaults): each annotation maps to a pydantic type, and ``CONSTRAINTS`` adds
ranges. Invariants:

- booleans are strict: only YAML ``true`` / ``false``; a string such as ``'false'``, ``'no'``
  or ``'0'`` is refused (``trust_remote_code: 'false'`` must never enable remote code);
- numbers accept numeric strings (YAML 1.1 reads ``1e-3`` as a string) and refuse booleans,
  NaN and infinities;
- strings are strict (``name: 123`` is refused), lists are lists (``grid: 0.5`` is refused
  here, as ``targets: q_proj`` is accepted as one target by ``race.config.configfile``);
- an error is one line naming the field, the value and what was expected.

Cross-field rules (n_train ≤ max_n_gen, …) stay in ``race.config.rules.validate_config``. pydantic is
imported only when a config is validated (``import race`` stays light).
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any, Iterator, Mapping

# field → pydantic Field keywords (ranges); numbers are finite everywhere
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "seeds": {"ge": 1}, "first_seed": {"ge": 0}, "prompt_len": {"gt": 0}, "completion_len": {"gt": 0},
    "pilot_share": {"gt": 0, "lt": 1},
    "lora.rank": {"ge": 1}, "lora.alpha": {"gt": 0},
    "reward.num_labels": {"ge": 1}, "reward.batch_size": {"ge": 1}, "reward.timeout": {"gt": 0},
    "reward.check_timeout": {"gt": 0},
    "grpo.temperature": {"gt": 0}, "grpo.top_p": {"gt": 0, "le": 1}, "grpo.max_completion_len": {"ge": 1},
    "grpo.clip_eps": {"gt": 0}, "grpo.clip_eps_high": {"gt": 0}, "grpo.beta": {"ge": 0}, "grpo.entropy_coef": {"ge": 0},
    "grpo.micro_batch": {"ge": 1},
    "schedule.prompts_per_step": {"ge": 1}, "schedule.n_train": {"ge": 1}, "schedule.max_n_gen": {"ge": 1},
    "schedule.max_mu": {"ge": 1}, "schedule.n_gen": {"ge": 1}, "schedule.mu": {"ge": 1},
    "schedule.min_n_train": {"ge": 1},
    "learning_rate.ref": {"gt": 0}, "learning_rate.ref_batch": {"ge": 1},
    "eval.prompts": {"ge": 1}, "eval.samples": {"ge": 1}, "eval.temperature": {"gt": 0},
    # names that are paths: no system opens a path longer than PATH_MAX (4096 bytes on Linux), so a
    # longer one is refused here, in one line, before anything looks it up
    "model": {"max_length": 4096}, "task": {"max_length": 4096}, "reward.model": {"max_length": 4096},
    "reward.function": {"max_length": 4096}, "eval.judge_model": {"max_length": 4096},
}
MAX_LENGTH_REASON = "no system opens a path that long (PATH_MAX is 4096)"

# fields whose shape race.config.configfile checks itself (a count or a list: eval.checkpoints)
RULES_ELSEWHERE = ("eval.checkpoints", "eval.tasks")

_EXPECTED = {
    "bool_type": "true or false (a YAML boolean, not a string)",
    "string_type": "a string", "int_type": "an integer", "int_parsing": "an integer",
    "int_from_float": "a whole number", "float_type": "a number", "float_parsing": "a number",
    "finite_number": "a finite number", "tuple_type": "a list", "list_type": "a list",
    "dict_type": "a mapping", "model_type": "a mapping", "dataclass_type": "a mapping",
    "extra_forbidden": "no such setting", "missing": "a value",
}


def _pydantic_type(annotation: str, path: str):
    """The pydantic type for a dataclass annotation string of race.config.configfile."""
    from pydantic import Field, StrictBool, StrictStr

    text = annotation.replace(" ", "")
    optional = text.endswith("|None")
    base = text[:-len("|None")] if optional else text
    extra = dict(CONSTRAINTS.get(path, {}))
    if base == "bool":
        t: Any = StrictBool
    elif base == "str":
        t = typing.Annotated[StrictStr, Field(**extra)] if extra else StrictStr
    elif base == "int":
        t = typing.Annotated[int, Field(strict=False, **extra)]
    elif base == "float":
        t = typing.Annotated[float, Field(allow_inf_nan=False, **extra)]
    elif base == "tuple[str,...]":
        t = tuple[StrictStr, ...]
    elif base == "dict[str,float]":       # reward.mix: names and ranges checked by race.config.configfile
        t = dict[StrictStr, typing.Annotated[float, Field(allow_inf_nan=False, strict=False)]]
    elif base == "tuple[float,...]":
        t = tuple[typing.Annotated[float, Field(allow_inf_nan=False, gt=0, lt=1)], ...]
    elif path in RULES_ELSEWHERE:
        t = Any
    else:
        raise TypeError(f"race.config.schema has no type for {path}: {annotation}")
    return typing.Optional[t] if optional else t


@functools.lru_cache(maxsize=None)
def _sections(cls: type) -> dict[str, type]:
    """Field name → dataclass, for the fields of ``cls`` that are config sections (nested dataclasses)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


@functools.lru_cache(maxsize=None)
def _model(cls: type, prefix: str = ""):
    """A pydantic model with ``cls``'s fields (nested config sections become sub-models)."""
    from pydantic import ConfigDict, create_model

    sections = _sections(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        sub = sections.get(f.name)
        typ = _model(sub, f.name + ".") if sub is not None else _pydantic_type(str(f.type), path)
        default = f.default if f.default is not dataclasses.MISSING else None
        fields[f.name] = (typ, default if sub is None else None)
    return create_model(f"{cls.__name__}Schema", __config__=ConfigDict(extra="forbid"), **fields)


def _leaf_fields(raw: Any, cls: type, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(dotted path, dataclass field, value) of every non-section field of dataclass ``cls`` that
    ``raw`` gives, sections (nested config dataclasses) walked in field order."""
    if not isinstance(raw, Mapping):
        return
    sections = _sections(cls)
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        value, path = raw[f.name], prefix + f.name
        sub = sections.get(f.name)
        if sub is not None:
            yield from _leaf_fields(value, sub, path + ".")
        else:
            yield path, f, value


def _bools_as_numbers(raw: Any, cls: type) -> str | None:
    """The first numeric field given a boolean (pydantic would read True as 1)."""
    return next((path for path, f, value in _leaf_fields(raw, cls)
                 if isinstance(value, bool) and path not in RULES_ELSEWHERE
                 and str(f.type).replace(" ", "").split("|")[0] in ("int", "float")), None)


def first_non_number(raw: Any, cls: type) -> tuple[str, Any] | None:
    """(dotted path, value) of the first numeric field of dataclass ``cls`` (an int or a float, or
    an item of a ``tuple[float, ...]`` / ``dict[str, float]``) that ``raw`` gives as something other
    than a number (a string, a boolean); None when there is none. A results file is JSON written by
    RACE: its numbers are JSON numbers (a YAML config may spell ``1e-3`` as a string; a results file
    may not)."""
    for path, f, value in _leaf_fields(raw, cls):
        text = str(f.type).replace(" ", "")
        optional = text.endswith("|None")
        base = text[:-len("|None")] if optional else text
        if path in RULES_ELSEWHERE or (optional and value is None):
            continue
        if base in ("int", "float"):
            items: list[tuple[str, Any]] = [(path, value)]
        elif base == "tuple[float,...]" and isinstance(value, (list, tuple)):
            items = [(f"{path}.{i}", v) for i, v in enumerate(value)]
        elif base == "dict[str,float]" and isinstance(value, Mapping):
            items = [(f"{path}.{k}", v) for k, v in value.items()]
        else:
            continue
        for where, v in items:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return where, v
    return None


def _describe(err: Mapping[str, Any]) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ()) if not isinstance(p, int)) or "config"
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": "≥", "less_than": "<", "less_than_equal": "≤"}[kind]
        bound = next(iter(ctx.values()), "?")
        expected = f"a number {op} {bound}"
    else:
        expected = _EXPECTED.get(kind, str(err.get("msg", "a valid value")).rstrip("."))
    if kind == "extra_forbidden":
        return f"{loc} is not a known setting"
    value = err.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    if len(shown) > 60:
        shown = shown[:57] + "…"
    if kind == "string_too_long":
        return (f"{loc} {shown} ({len(value):,} characters) is not valid: expected at most "
                f"{ctx.get('max_length')} characters: {MAX_LENGTH_REASON}")
    return f"{loc} {shown} is not valid: expected {expected}"


def check_built(config: Any) -> None:
    """A config dataclass built in Python (``GridConfig(...)``, ``dataclasses.replace``) checked as a config
    file is: every field's type, finiteness and range, booleans strict. Numbers must be numbers here: a
    numeric string is how YAML spells ``1e-3``, and ``race.config.configfile.config_from_dict`` reads it
    before this runs; in Python it is a mistake. Raises ``ConfigError`` (one line)."""
    from race.core.errors import ConfigError
    from race.core.safeio import quote

    raw = dataclasses.asdict(config)
    bad = first_non_number(raw, type(config))
    if bad is not None:
        raise ConfigError(f"{bad[0]} {quote(bad[1], 60)} is not valid: expected a number")
    validate(raw, type(config))


def validate(raw: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """``raw`` (a config mapping already normalised by race.config.configfile) checked against the schema of
    dataclass ``cls``; returns plain values (sections as dicts). Raises ``ConfigError`` (one line)."""
    from pydantic import ValidationError

    from race.core.errors import ConfigError

    bad = _bools_as_numbers(raw, cls)
    if bad:
        value = raw
        for part in bad.split("."):
            value = value[part]
        raise ConfigError(f"{bad} {value!r} is not valid: expected a number, not a boolean")
    try:
        model = _model(cls).model_validate(dict(raw))
    except ValidationError as e:
        raise ConfigError(_describe(e.errors(include_url=False)[0])) from None
    return model.model_dump()
