"""What a reward is and how one is found and called: ``RewardFn``, ``RewardBatch``, ``RewardError``,
``get_reward`` (a built-in name, ``module:function`` or ``file.py:function``) and ``score_each``
(sample by sample; an ``Exception`` or a non-finite value scores 0 and is counted). Pure Python,
no torch; the layer under race.tasks.rewards (scoring) and race.tasks.rewards.isolated (a child process)."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence, Union

from race.tasks.rewards.answers import answer_format, math_answer
from race.tasks.rewards.rules import dense, sparse, structured
from race.core.errors import RaceError

RewardFn = Callable[[str, str, str], float]
"""``fn(prompt, completion, reference) -> float``; higher is better."""

# the rule rewards (race.config.rules.RULE_REWARDS names them too): exact answers of the built-in tasks, and
# final answers of worked solutions (race.tasks.rewards.answers: ``math`` checks them, ``format`` their form)
REWARDS: dict[str, RewardFn] = {"sparse": sparse, "structured": structured, "dense": dense,
                                "math": math_answer, "format": answer_format}


class RewardError(RaceError):
    """A reward that cannot be resolved; the message is one line and names the value."""


@dataclass(frozen=True)
class RewardBatch:
    """Scores of one batch of completions, index-aligned with the inputs.

    ``errors`` counts samples whose reward raised or returned a non-finite value (each
    scored 0.0); ``first_error`` describes the first of them. ``cpu_seconds`` is this
    process's CPU time spent scoring; ``flops`` the reward-model FLOPs (0 for rules).
    """

    scores: list[float]
    errors: int = 0
    cpu_seconds: float = 0.0
    flops: float = 0.0
    first_error: str | None = field(default=None, compare=False)

    @property
    def mean(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0


def get_reward(name_or_callable: Union[str, RewardFn]) -> RewardFn:
    """A reward function from a name in ``REWARDS``, a ``"module:function"`` string, or a callable."""
    if callable(name_or_callable):
        return name_or_callable
    if not isinstance(name_or_callable, str):
        raise RewardError(f"reward {name_or_callable!r} must be a name ({', '.join(REWARDS)}), "
                          f"a 'module:function' string, or a callable")
    if name_or_callable in REWARDS:
        return REWARDS[name_or_callable]
    module_name, sep, attr = name_or_callable.rpartition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {name_or_callable!r} is unknown: expected one of {', '.join(REWARDS)}, "
                          f"'module:function' or 'file.py:function'")
    module = _import_reward_module(name_or_callable, module_name)
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise RewardError(f"reward {name_or_callable!r}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise RewardError(f"reward {name_or_callable!r} is not callable: "
                          f"expected fn(prompt, completion, reference)")
    return fn


def reward_source(spec: str) -> str | None:
    """The file a custom reward ``spec`` ("path.py:fn" or "module:fn") would be imported from, found
    without importing anything (no parent package's code runs); None when it cannot be found here."""
    from importlib.machinery import PathFinder

    module_name = spec.rsplit(":", 1)[0]
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        return path if os.path.isfile(path) else None
    search = [*sys.path, os.getcwd()]
    found = None
    for part in module_name.split("."):
        found = PathFinder.find_spec(part, search)
        if found is None:
            return None
        search = list(found.submodule_search_locations or [])
    origin = getattr(found, "origin", None)
    return origin if origin and os.path.isfile(origin) else None


def source_digest(path: str) -> str:
    """The sha256 of a reward's source file."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _import_reward_module(spec: str, module_name: str) -> object:
    """The module of a custom reward: a ``.py`` file path, or a module name importable as is or
    from the current directory. A ``race`` console script does not put the current directory
    on ``sys.path`` (``python script.py`` would), yet a user's ``myreward.py`` next to their
    config is what ``myreward:score`` means; pilot processes share the directory, so they
    resolve it the same way."""
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise RewardError(f"reward {spec!r}: file {module_name!r} does not exist")
        # keyed by the whole path: two reward.py files in different folders are two modules
        digest = hashlib.sha1(path.encode()).hexdigest()[:12]
        name = f"race_user_reward_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
        if name not in sys.modules:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(loader_spec)
            try:
                loader_spec.loader.exec_module(module)
            except Exception as e:
                raise RewardError(f"reward {spec!r}: importing {module_name!r} failed ({type(e).__name__}: {e})") from None
            sys.modules[name] = module
        return sys.modules[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.split(".")[0]
        here = os.getcwd()
        local = os.path.isfile(os.path.join(here, top + ".py")) or os.path.isdir(os.path.join(here, top))
        if e.name != top or not local or here in sys.path:
            raise RewardError(f"reward {spec!r}: cannot import module {module_name!r} ({e})") from None
    except Exception as e:
        raise RewardError(f"reward {spec!r}: importing {module_name!r} failed ({type(e).__name__}: {e})") from None
    sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    except Exception as e:
        raise RewardError(f"reward {spec!r}: importing {module_name!r} from {here} failed "
                          f"({type(e).__name__}: {e})") from None


MAX_ABS_REWARD = 1e6       # a reward beyond ± this is an error (±1e308 overflows GRPO's advantages)


def score_each(reward: RewardFn, prompts: Sequence[str], completions: Sequence[str],
               references: Sequence[str]) -> RewardBatch:
    """Call ``reward`` sample by sample: an ``Exception``, a non-number, a non-finite value or one
    beyond ±MAX_ABS_REWARD scores 0 and is counted; anything else (``SystemExit``…) propagates."""
    scores: list[float] = []
    errors, first_error = 0, None
    start = time.process_time()
    for prompt, completion, reference in zip(prompts, completions, references):
        try:
            raw = reward(prompt, completion, reference)
            if raw is None or isinstance(raw, (bool, str, bytes)):
                raise TypeError(f"the reward returned {type(raw).__name__} {str(raw)[:60]!r}, not a number")
            value = float(raw)                       # numpy / torch scalars convert; a list raises TypeError
            if not math.isfinite(value):
                raise ValueError(f"non-finite reward {value}")
            if abs(value) > MAX_ABS_REWARD:
                raise ValueError(f"reward {value:g} is beyond ±{MAX_ABS_REWARD:g}")
        except Exception as e:  # a user reward must never kill a pilot
            errors += 1
            first_error = first_error or f"{type(e).__name__}: {e}"
            value = 0.0
        scores.append(value)
    return RewardBatch(scores=scores, errors=errors, cpu_seconds=time.process_time() - start,
                       flops=0.0, first_error=first_error)
