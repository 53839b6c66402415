"""Watching the full run: RACE's instability rule on held-out checkpoints while the user's run trains.

A learning rate that held for every pilot can still collapse late in a full run (docs/validation.md),
and the pilots cannot see that. The watch applies the pilots' own rule (race.stats.instability:
``find_instability``) to the full run as it trains:

- ``Watch``: framework-free. Give it the run's optimizer-step count; ``due(step)`` says when a
  held-out evaluation is due (the base policy at step 0, then log-spaced fractions 1/64 … 1, as the
  pilots' checkpoints); ``record(step, scores)`` takes the per-prompt scores on the same held-out
  prompts each time and returns the fall once the rule finds one.
- ``check_scores``: the same rule over a run's logged per-prompt validation scores (verl:
  ``verl_history`` reads ``trainer.validation_data_dir``); ``check_means`` over logged means
  (OpenRLHF logs only those), with the unpaired SE, so it flags no more often.
- ``trl_callback``: a ``transformers.TrainerCallback`` for TRL's ``GRPOTrainer``. At each due step
  it samples completions for the held-out prompts, scores them with the task's checker (any
  callable with TRL's reward-function signature), and on a fall logs the evidence, stops the run
  (``stop=True``) and puts back the adapter weights of the best checkpoint (``keep_best=True``).
  It saves and restores torch's random state around each evaluation, so training draws the same
  samples as without it.

  The user's checker runs under ``timeout`` seconds, in a forked worker process that is killed,
  with all it started, when the time is up (race.tasks.rewards.isolated.call_forked, the machinery
  of custom rewards): a checker that never returns leaves nothing running. ``isolate=False`` runs it
  in a helper thread instead (a checker that needs this process's state or its GPU; a timed-out
  one is then abandoned, still running). If it raises, times out or returns something that is not
  one finite score per prompt, the callback logs one line and the training goes on
  (``on_error="log"``); ``on_error="stop"`` stops the run at that step, ``"raise"`` raises the
  ``WatchError`` into the trainer.

Invariants: ``import race.fullrun.watch`` imports no torch or transformers (they load inside
``trl_callback``); the rule is race.stats.instability', unchanged; scores are never model text run as code;
every public function checks its arguments on entry (race.core.arguments: a ``WatchError`` naming the
argument, its value and what was expected); the callback never raises into the trainer unless
``on_error="raise"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from race.core import arguments as A
from race.config.checkpoints import DEFAULT_CHECKPOINTS, checkpoint_fractions
from race.stats.instability import find_instability
from race.core.errors import RaceError
from race.core.records import Checkpoint, FlopBreakdown


class WatchError(RaceError):
    """Bad input to the watch (no prompts, a score that is not a finite number, steps out of order)."""


ON_ERROR = ("log", "stop", "raise")     # what the TRL callback does when an evaluation fails
MAX_SAMPLES = 1024                      # completions per held-out prompt at one evaluation, at most
MAX_NEW_TOKENS = 1 << 20                # tokens per completion (and prompts per batch), at most
MAX_STEPS = 10 ** 12                     # optimizer steps past this are refused (no run takes them; the fractions overflow)


def _checkpoints(value: Any) -> int | tuple[float, ...]:
    """``checkpoints``: a count ≥ 0, or fractions in (0, 1] (race.config.checkpoints.checkpoint_fractions)."""
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return A.whole("checkpoints", value, ge=0, le=64, error=WatchError,
                       expected="a count from 0 to 64, or a list of fractions in (0, 1]")
    fr = A.items("checkpoints", value, error=WatchError, what="fractions in (0, 1]")
    out = tuple(A.number(f"checkpoints[{i}]", f, gt=0, le=1, error=WatchError) for i, f in enumerate(fr))
    if len(set(out)) != len(out):
        raise WatchError(f"checkpoints {A.shown(list(out))} repeats a fraction: expected distinct fractions in (0, 1]")
    return out


def _pairs(name: str, history: Any) -> list[tuple[int, Any]]:
    """``[(step, value), …]`` with whole steps ≥ 0."""
    out = []
    for i, item in enumerate(A.items(name, history, error=WatchError, what="(step, scores) pairs")):
        pair = A.items(f"{name}[{i}]", item, error=WatchError, what="(step, scores)")
        if len(pair) != 2:
            raise WatchError(f"{name}[{i}] has {len(pair)} items: expected (step, scores)")
        out.append((A.whole(f"{name}[{i}] step", pair[0], ge=0, le=MAX_STEPS, error=WatchError), pair[1]))
    return out


def _scores(scores: Sequence[Any], where: str) -> tuple[float, ...]:
    out = []
    if isinstance(scores, (str, bytes, Mapping)) or not hasattr(scores, "__iter__"):
        raise WatchError(f"{where}: scores {str(scores)[:60]!r} must be a list of finite numbers, one per prompt")
    for i, s in enumerate(scores):
        try:
            x = float(s) if isinstance(s, (int, float)) and not isinstance(s, bool) else math.nan
        except OverflowError:       # an int past a float's range
            x = math.nan
        if not math.isfinite(x):
            raise WatchError(f"{where}: score {i} is {str(s)[:60]!r}: expected a finite number")
        out.append(x)
    if not out:
        raise WatchError(f"{where}: no scores: expected one per held-out prompt")
    return tuple(out)


@dataclass
class Watch:
    """The instability rule over one run's held-out evaluations (see the module docstring)."""

    total_steps: int
    checkpoints: int | Sequence[float] = DEFAULT_CHECKPOINTS
    target: str = "reward"
    history: list[Checkpoint] = field(default_factory=list)
    fall: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.total_steps = A.whole("total_steps", self.total_steps, ge=1, le=MAX_STEPS, error=WatchError,
                                   expected=f"a whole number from 1 to {MAX_STEPS:.0e} (the run's optimizer steps)")
        self.checkpoints = _checkpoints(self.checkpoints)
        A.text("target", self.target, error=WatchError)
        fr = checkpoint_fractions(self.checkpoints)
        # the fractions before the end (1/64 … 0.55 with 8 checkpoints), then the end itself
        self._due = sorted({max(1, math.ceil(f * self.total_steps - 1e-9)) for f in fr} | {self.total_steps})

    @property
    def steps(self) -> list[int]:
        """The steps at which an evaluation is due after the base one (step 0)."""
        return list(self._due)

    def due(self, step: int) -> bool:
        """Whether an evaluation is due at ``step``: the base at 0, then once a due step is reached."""
        step = A.whole("step", step, ge=0, le=MAX_STEPS, error=WatchError)
        if step > self.total_steps:
            raise WatchError(f"step {step} is past the run's total_steps {self.total_steps}: expected a step of this run")
        if not self.history:
            return step == 0
        last = self.history[-1].step
        pending = [d for d in self._due if d > last]
        return bool(pending) and step >= pending[0]

    def record(self, step: int, scores: Sequence[Any]) -> dict[str, Any] | None:
        """Add the per-prompt scores at ``step`` (the same prompts, in the same order, every time);
        return the fall (race.stats.instability.find_instability's record, with ``step``) once there is one."""
        step = A.whole("step", step, ge=0, le=MAX_STEPS, error=WatchError)
        if step > self.total_steps:
            raise WatchError(f"step {step} is past the run's total_steps {self.total_steps}: expected a step of this run")
        vals = _scores(scores, f"step {step}")
        if self.history:
            if step <= self.history[-1].step:
                raise WatchError(f"step {step} is not after the last evaluation's ({self.history[-1].step})")
            if len(vals) != len(self.history[0].evals[self.target]):
                raise WatchError(f"step {step}: {len(vals)} scores, the base had "
                                 f"{len(self.history[0].evals[self.target])}: evaluate the same held-out prompts")
        elif step != 0:
            raise WatchError(f"the first evaluation is at step {step}: expected the base policy's, at step 0")
        self.history.append(Checkpoint(fraction=step / self.total_steps, step=step, flops=FlopBreakdown(),
                                       evals={self.target: vals}))
        if self.fall is None:
            self.fall = find_instability(self.history, self.target)
        return self.fall

    @property
    def best_step(self) -> int | None:
        """The step whose evaluation scored highest so far (the earliest of ties)."""
        if not self.history:
            return None
        means = [sum(c.evals[self.target]) / len(c.evals[self.target]) for c in self.history]
        return self.history[max(range(len(means)), key=lambda i: (means[i], -i))].step

    def line(self) -> str:
        """One line: the fall with its evidence, or that none was seen."""
        n = len(self.history)
        if self.fall is None:
            return f"race.fullrun.watch: no fall in {n} held-out evaluations"
        f = self.fall
        return (f"race.fullrun.watch: held-out {self.target} fell to {f['value']:.3f} at step {f['step']} from {f['best']:.3f} "
                f"(base {f['base']:.3f}; drop {f['best'] - f['value']:.3f}, paired SE {f['drop_se']:.3f}): the run "
                "collapsed by the pilots' rule (race.stats.instability)")


def check_scores(history: Sequence[tuple[int, Sequence[Any]]], *, target: str = "reward") -> dict[str, Any] | None:
    """The rule over a run's logged validation scores: ``[(step, per-prompt scores), …]``, the base
    policy's (step 0) first, the same prompts each time. Returns the first fall, or None."""
    history = _pairs("history", history)
    A.text("target", target, error=WatchError)
    if not history:
        raise WatchError("no validation scores: expected [(step, per-prompt scores), …], the base policy's first")
    steps = [int(s) for s, _ in history]
    w = Watch(total_steps=max(1, max(steps)), target=target)
    for s, scores in history:
        w.record(int(s), scores)
    return w.fall


def check_means(history: Sequence[tuple[int, Any]], *, prompts: int) -> dict[str, Any] | None:
    """The rule over logged validation **means** in [0, 1] (a pass rate; OpenRLHF logs only
    those): ``[(step, mean), …]``, the base policy's (step 0) first, each the mean over the same
    ``prompts`` held-out prompts. Without per-prompt scores the drop's SE is the unpaired one,
    √((p_b(1 − p_b) + p_j(1 − p_j)) / prompts), an upper bound on the paired SE when the per-prompt
    means lie in [0, 1]: the rule flags no more often than with per-prompt scores. Returns the first
    fall (``find_instability``'s fields), or None."""
    from race.stats.instability import first_fall

    prompts = A.whole("prompts", prompts, ge=2, le=MAX_STEPS, floats=False, error=WatchError,
                      expected=f"a whole number from 2 to {MAX_STEPS:.0e} (the validation set's size)")
    history = _pairs("history", history)
    if not history:
        raise WatchError("no validation means: expected [(step, mean), …], the base policy's first")
    steps, means = [], []
    for i, (step, m) in enumerate(history):
        (m,) = _scores([m], f"step {step}")
        if not 0.0 <= m <= 1.0:
            raise WatchError(f"step {step}: mean {m!r} is outside [0, 1]: check_means takes pass rates; "
                             "give per-prompt scores to check_scores instead")
        if (i == 0 and int(step) != 0) or (i and int(step) <= steps[-1]):
            raise WatchError(f"step {step}: expected the base policy's at step 0 first, then increasing steps")
        steps.append(int(step))
        means.append(m)
    def unpaired_se(b: int, j: int) -> float:
        return math.sqrt((means[b] * (1 - means[b]) + means[j] * (1 - means[j])) / prompts)

    hit = first_fall(means, unpaired_se)
    if hit is None:
        return None
    j, b, se = hit
    return {"fraction": steps[j] / steps[-1], "step": steps[j], "value": means[j], "best": means[b],
            "best_fraction": steps[b] / steps[-1], "base": means[0], "drop_se": se, "final": means[-1]}


def verl_history(dump_dir: str, *, max_bytes: int = 256 * 2**20) -> list[tuple[int, tuple[float, ...]]]:
    """Per-prompt validation scores from verl's ``trainer.validation_data_dir`` (one ``STEP.jsonl``
    per validation, a line per sample with its ``input`` and ``score``), as ``check_scores`` takes
    them: samples of one input averaged, prompts in the base file's order. Files are read as
    untrusted (size-capped, JSON only)."""
    import os

    from race.core.safeio import UnsafeInput, loads_json, read_capped

    dump_dir = A.text("dump_dir", dump_dir, error=WatchError)
    max_bytes = A.whole("max_bytes", max_bytes, ge=1, floats=False, error=WatchError)
    if not os.path.isdir(dump_dir):
        raise WatchError(f"dump_dir {dump_dir!r} is not a folder: expected verl's trainer.validation_data_dir")
    files = sorted((int(f[:-6]), f) for f in os.listdir(dump_dir) if f.endswith(".jsonl") and f[:-6].isdigit())
    if not files:
        raise WatchError(f"{dump_dir!r} holds no STEP.jsonl files: run verl with trainer.validation_data_dir set")
    history, order = [], None
    for step, name in files:
        by: dict[str, list[float]] = {}
        try:
            text = read_capped(os.path.join(dump_dir, name), limit=max_bytes, what="verl validation dump")
        except UnsafeInput as e:
            raise WatchError(str(e)) from None
        except (UnicodeDecodeError, OSError, EOFError) as e:
            raise WatchError(f"{name} in {dump_dir!r} is not a UTF-8 JSON-lines file: {type(e).__name__}") from None
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = loads_json(line, what=f"{name} line {n}")
                key, score = str(row["input"]), row["score"]
            except UnsafeInput as e:
                raise WatchError(str(e)) from None
            except (ValueError, KeyError, TypeError):
                raise WatchError(f"{name} line {n}: expected a JSON object with 'input' and 'score'") from None
            by.setdefault(key, []).append(_scores([score], f"{name} line {n}")[0])
        order = order or list(by)
        missing = [k for k in order if k not in by]
        if missing:
            raise WatchError(f"{name}: {len(missing)} of the base's validation prompts are missing: "
                             "validate on the same set each time")
        history.append((step, tuple(sum(by[k]) / len(by[k]) for k in order)))
    return history


def _failure(step: int, e: BaseException) -> str:
    from race.core.safeio import one_line

    what = str(e) if isinstance(e, WatchError) else f"{type(e).__name__}: {e}"
    return f"race.fullrun.watch: the held-out evaluation at step {step} failed ({one_line(what)[:300]})"


def run_with_timeout(fn: Callable[[], Any], timeout: float, name: str, *, isolate: bool = True) -> Any:
    """``fn()`` under ``timeout`` seconds: its value, or a WatchError when it raised (named with its
    type), did not return in time or its process died. ``isolate``: in a forked worker process, killed
    with all it started on a timeout (race.tasks.rewards.isolated.call_forked; where there is no fork,
    as without it); else in a daemon thread, left behind (never joined) on a timeout."""
    timeout = A.number("timeout", timeout, gt=0, error=WatchError)
    if not callable(fn):
        raise WatchError(f"fn {str(fn)[:60]!r}: expected a callable ({name} to run under the timeout)")
    if isolate:
        from race.tasks.rewards.isolated import call_forked, can_fork

        if can_fork():
            kind, got = call_forked(fn, timeout)
            if kind == "value":
                return got
            if kind == "timeout":
                raise WatchError(f"{name} did not return within {timeout:g} s (timeout; its process was killed): "
                                 "expected a checker that scores a batch in time")
            if kind == "raised":
                raise WatchError(f"{name} raised {got[0]}: {got[1]}")
            raise WatchError(f"{name} ended its process (exit code {got}) without an answer")
    return _in_thread(fn, timeout, name)


def _in_thread(fn: Callable[[], Any], timeout: float, name: str) -> Any:
    """``fn()`` in a daemon thread, waited on for ``timeout`` seconds (``run_with_timeout``, isolate=False)."""
    import threading

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:                 # noqa: BLE001 - reported to the caller below
            box["error"] = e

    t = threading.Thread(target=run, name=f"race-watch-{name}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise WatchError(f"{name} did not return within {timeout:g} s (timeout): expected a checker that "
                         "scores a batch in time")
    if "error" in box:
        e = box["error"]
        raise WatchError(f"{name} raised {type(e).__name__}: {e}")
    return box["value"]


@dataclass(frozen=True)
class _Evaluator:
    """The TRL callback's held-out evaluation: ``samples`` completions per prompt from the model,
    scored by the user's ``reward_func`` under ``timeout`` and averaged per prompt (its arguments
    checked by ``_evaluator``)."""

    prompts: list
    reward_func: Callable[..., Sequence[float]]
    cols: dict
    samples: int
    max_new_tokens: int
    temperature: float
    batch_size: int
    timeout: float
    isolate: bool = True

    def checked(self, texts: list[str]) -> tuple[float, ...]:
        """``reward_func`` on ``texts`` under ``timeout``, its answer checked: one finite score per prompt."""
        prompts = self.prompts
        got = run_with_timeout(lambda: self.reward_func(prompts=prompts, completions=texts, **self.cols), self.timeout,
                               "reward_func", isolate=self.isolate)
        scores = _scores(got, "reward_func")
        if len(scores) != len(prompts):
            raise WatchError(f"reward_func gave {len(scores)} scores for {len(prompts)} prompts: expected one per prompt")
        return scores

    def __call__(self, model, tok) -> list[float]:
        """The per-prompt scores of ``model`` now; torch's random state, the model's mode and the
        tokenizer's padding side are put back after."""
        import torch

        prompts, samples, batch_size = self.prompts, self.samples, self.batch_size
        state = torch.random.get_rng_state()
        was_training = model.training
        model.eval()
        side = tok.padding_side
        tok.padding_side = "left"
        try:
            per = [0.0] * len(prompts)
            for s in range(samples):
                torch.manual_seed(1_000_003 + s)         # the same draws at every evaluation
                texts = []
                for i in range(0, len(prompts), batch_size):
                    chunk = prompts[i:i + batch_size]
                    enc = tok(chunk, return_tensors="pt", padding=True).to(model.device)
                    with torch.no_grad():
                        out = model.generate(**enc, do_sample=True, temperature=self.temperature, top_p=1.0,
                                             max_new_tokens=self.max_new_tokens, pad_token_id=tok.pad_token_id)
                    texts += tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                scores = self.checked(texts)
                per = [a + b / samples for a, b in zip(per, scores)]
            return per
        finally:
            tok.padding_side = side
            model.train(was_training)
            torch.random.set_rng_state(state)


def _evaluator(prompts: Any, reward_func: Any, columns: Any, samples: Any, max_new_tokens: Any, batch_size: Any,
               temperature: Any, timeout: Any) -> _Evaluator:
    """``trl_callback``'s evaluation arguments checked, in this order (a ``WatchError`` naming the first bad one)."""
    prompts = A.items("prompts", prompts, error=WatchError, what="held-out prompt strings")
    if not prompts:
        raise WatchError("no held-out prompts to watch with")
    for i, p in enumerate(prompts):
        A.text(f"prompts[{i}]", p, error=WatchError)
    A.function("reward_func", reward_func, error=WatchError)
    cols = {k: A.items(f"columns[{k!r}]", v, error=WatchError, what="values, one per prompt")
            for k, v in A.mapping("columns", columns or {}, error=WatchError).items()}
    for k, v in cols.items():
        if len(v) != len(prompts):
            raise WatchError(f"column {k!r} has {len(v)} rows, prompts {len(prompts)}: expected one per prompt")
    # each evaluation generates prompts × samples completions of up to max_new_tokens: past these caps
    # one evaluation would outlast any run (the same cap as the steps: refused, not left to hang)
    samples = A.whole("samples", samples, ge=1, le=MAX_SAMPLES, floats=False, error=WatchError)
    max_new_tokens = A.whole("max_new_tokens", max_new_tokens, ge=1, le=MAX_NEW_TOKENS, floats=False, error=WatchError)
    batch_size = A.whole("batch_size", batch_size, ge=1, le=MAX_NEW_TOKENS, floats=False, error=WatchError)
    temperature = A.number("temperature", temperature, gt=0, error=WatchError)
    timeout = A.number("timeout", timeout, gt=0, error=WatchError)
    return _Evaluator(prompts, reward_func, cols, samples, max_new_tokens, temperature, batch_size, timeout)


def _snapshot(model) -> dict[str, Any]:
    """The trainable weights (the adapter's), copied."""
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def _restore(model, best: Mapping[str, Any]) -> None:
    """Put the weights ``_snapshot`` copied back into ``model``."""
    import torch

    with torch.no_grad():
        for k, v in model.named_parameters():
            if k in best:
                v.copy_(best[k])


def _watch_callback(base: type, evaluate: _Evaluator, checkpoints: int | tuple[float, ...], stop: bool,
                    keep_best: bool, log: Callable[[str], None], on_error: str):
    """The callback: a ``base`` (transformers' TrainerCallback) that evaluates at the Watch's due steps."""

    class RaceWatch(base):
        def __init__(self):
            self.watch: Watch | None = None
            self.best: dict[str, Any] | None = None

        def _check(self, step: int, model, tok, control) -> None:
            try:
                scores = evaluate(model, tok)
                fall = self.watch.record(step, scores)
            except Exception as e:                 # noqa: BLE001 - the user's checker must not end the run
                if on_error == "raise":
                    raise e if isinstance(e, WatchError) else WatchError(_failure(step, e)) from e
                log(_failure(step, e) + ("; the run is stopped (on_error='stop')" if on_error == "stop" else
                                         "; training goes on" + (" without the watch (no base evaluation)"
                                                                 if not self.watch.history else "")))
                if on_error == "stop":
                    control.should_training_stop = True
                return
            if keep_best and self.watch.best_step == step:
                self.best = _snapshot(model)
            if fall is not None and stop and not control.should_training_stop:
                log(self.watch.line())
                control.should_training_stop = True

        def on_train_begin(self, args, state, control, model=None, processing_class=None, **kw):
            self.watch = Watch(total_steps=max(1, int(state.max_steps)), checkpoints=checkpoints)
            self._check(0, model, processing_class, control)

        def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
            if self.watch is not None and self.watch.history and self.watch.fall is None \
                    and self.watch.due(state.global_step):
                self._check(state.global_step, model, processing_class, control)

        def on_train_end(self, args, state, control, model=None, processing_class=None, **kw):
            if self.watch is None:
                return
            if not self.watch.history:             # the base evaluation failed: nothing to compare with
                return
            if self.watch.fall is None and self.watch.history[-1].step < state.global_step:
                self._check(state.global_step, model, processing_class, control)
            if self.watch.fall is not None and keep_best and self.best is not None:
                _restore(model, self.best)
                log(f"race.fullrun.watch: restored the adapter of step {self.watch.best_step}, the best held-out checkpoint")

    return RaceWatch()


def trl_callback(prompts: Sequence[str], reward_func: Callable[..., Sequence[float]], *,
                 columns: Mapping[str, Sequence[Any]] | None = None, samples: int = 1, max_new_tokens: int = 64,
                 temperature: float = 1.0, checkpoints: int | Sequence[float] = DEFAULT_CHECKPOINTS,
                 stop: bool = True, keep_best: bool = True, batch_size: int = 64, log: Callable[[str], None] = print,
                 timeout: float = 60.0, on_error: str = "log", isolate: bool = True):
    """A ``transformers.TrainerCallback`` watching a TRL run (see the module docstring).

    ``prompts``: held-out prompts (never trained on); ``reward_func``: TRL's reward-function
    signature, ``f(prompts=…, completions=…, **columns) -> scores``; ``columns``: its extra
    per-prompt columns (e.g. ``{"answer": [...]}``); ``samples`` per prompt, averaged per prompt.
    ``timeout``: seconds one call of ``reward_func`` may take (as ``reward.timeout`` in pilots);
    ``on_error``: what a failed evaluation does (the checker raised, timed out or returned nonsense;
    generation failed): ``"log"`` one line and train on, ``"stop"`` the run, or ``"raise"`` it.
    ``isolate``: the checker runs in a forked process killed on its timeout (default), or, False, in
    a thread of this process (a checker that needs its GPU or its state; a timed-out one keeps running).
    The callback's ``watch`` attribute holds the Watch (its history, fall and line)."""
    evaluate = _evaluator(prompts, reward_func, columns, samples, max_new_tokens, batch_size, temperature, timeout)
    checkpoints = _checkpoints(checkpoints)
    stop, keep_best = A.flag("stop", stop, error=WatchError), A.flag("keep_best", keep_best, error=WatchError)
    A.function("log", log, error=WatchError)
    A.one_of("on_error", on_error, ON_ERROR, error=WatchError)
    evaluate = replace(evaluate, isolate=A.flag("isolate", isolate, error=WatchError))
    from transformers import TrainerCallback

    return _watch_callback(TrainerCallback, evaluate, checkpoints, stop, keep_best, log, on_error)
