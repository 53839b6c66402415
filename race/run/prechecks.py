"""The checks a grid passes before anything is written or computed: one table, in the order they run.

``CHECKS`` lists them (name, what it refuses, the function); ``run_checks`` runs them all on a
config and its run options (race.run.options.RunOptions), each ending in one line (``ConfigError``,
``StoreError``, ``RewardError``, ``ValueError``) and none writing anything, so a run that cannot
start leaves no storage behind. The checks of ``--import-pilots`` live here too: a results file's
pilots are of this config and ran the schedules this config plans (``check_importable``; the
import itself, ``race.run.study.import_finished``, reuses them).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from race.config.configfile import GridConfig
from race.core.errors import ConfigError
from race.run.options import RunOptions
from race.run.adaptive import is_budget, policy_named


@dataclass(frozen=True)
class Check:
    name: str
    refuses: str
    run: Callable[[GridConfig, RunOptions], None]


def _one_policy(config: GridConfig, o: RunOptions) -> None:
    if config.models:                     # one study is one policy: race.run.api.run_models runs one per model
        raise ConfigError(f"config names models {list(config.models)}: run a grid over policies with "
                          "race.run.api.run_models (race pilot does), one study per policy")


def _device(config: GridConfig, o: RunOptions) -> None:
    from race.engine.loading import check_device

    check_device(o.device)


def _grid_points(config: GridConfig, o: RunOptions) -> None:
    from race.stats.regime import MIN_GRID_POINTS

    if len(config.grid) < MIN_GRID_POINTS:   # the verdict needs them: refuse before any pilot runs
        raise ConfigError(f"grid {list(config.grid)} has {len(config.grid)} point(s): a verdict needs at least "
                          f"{MIN_GRID_POINTS} ρ values (race plan shows any grid)")


def _custom_reward(config: GridConfig, o: RunOptions) -> None:
    if config.reward.kind == "custom":      # a reward no pilot can import fails here, not in every pilot
        from race.tasks.rewards.isolated import IsolatedReward

        # imported in its own process, under reward.timeout: an import that hangs cannot hang us
        IsolatedReward(config.reward.function, timeout=config.reward.timeout).start().close()


def _task_size(config: GridConfig, o: RunOptions) -> None:
    check_task_size(config)


def _eval_tasks(config: GridConfig, o: RunOptions) -> None:
    check_eval_tasks(config)


def _import_pilots(config: GridConfig, o: RunOptions) -> None:
    if o.import_pilots:                      # readable, and of this config, before anything is written
        check_importable(config, o.import_pilots)


def _vocabulary(config: GridConfig, o: RunOptions) -> None:
    from transformers import AutoTokenizer

    from race.flops.catalog import resolve_model_path
    from race.flops.specs import policy_arch
    from race.tasks.taskdata import check_vocabulary

    try:
        tok = AutoTokenizer.from_pretrained(resolve_model_path(config.model))
    except OSError as e:        # a model folder without its tokenizer
        from race.flops.catalog import load_error

        raise load_error(config.model, e) from None
    check_vocabulary(config, tok, policy_arch(config).vocab_size)


def _flops(config: GridConfig, o: RunOptions) -> None:
    from race.flops.grid import flop_warnings

    flop_warnings(config)        # an architecture RACE cannot count, or a LoRA target no module has, stops here


def _budget_floor(config: GridConfig, o: RunOptions) -> None:
    """A budget below the cheapest rollout there is (one sample of one token after a one-token prompt) cannot
    buy a step whatever calibration measures: refused here, not after calibration has loaded the model. The
    exact check, at the calibrated lengths, stays race.flops.grid.choose_batch's."""
    from race.flops import formulas as F
    from race.flops.grid import policy_arch

    floor = F.search_flops(policy_arch(config), prompt_len=1.0, completion_len=1.0, n=1)
    if config.budget < floor:
        raise ConfigError(f"budget {config.budget:.3g} FLOPs is less than one rollout of one token ({floor:.3g} FLOPs "
                          f"for {config.model}): expected a budget of many steps (race plan shows what a step costs)")


def _backend(config: GridConfig, o: RunOptions) -> None:
    from race.engine.backends import BACKENDS, resolve_backend

    backend = resolve_backend(config.backend)
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not available in this RACE: expected one of {', '.join(BACKENDS)}")
    if backend == "vllm" and config.vllm_sleep == "on" and not str(o.device).startswith("cuda"):
        raise ConfigError(f"vllm_sleep 'on' needs a CUDA GPU (vLLM's sleep mode is CUDA only), but pilots run on "
                          f"{o.device!r}: set vllm_sleep to auto or off")

    if backend == "vllm" and o.policy and is_budget(policy_named(o.policy)):
        raise ConfigError("budget halving pauses pilots and continues them, which the vllm backend cannot (its "
                          "engine's sampling state is not saved): use backend hf")


def _judge(config: GridConfig, o: RunOptions) -> None:
    if config.eval.judge_model:
        from race.flops.catalog import check_loadable

        check_loadable(config.eval.judge_model, "eval.judge_model")


def _host_memory(config: GridConfig, o: RunOptions) -> None:
    from race.engine.loading import check_host_memory

    check_host_memory(config, o.device)    # weights + adapters + optimizer state must fit before calibration runs


def _engine(config: GridConfig, o: RunOptions) -> None:
    from race.engine.lean_engine import group_size_for

    group_size_for(config, o.engine, o.device)      # an engine that cannot run this config: one line


def _out_dir(config: GridConfig, o: RunOptions) -> None:
    """The files the grid writes in its folder, checked before any compute: results.json (written through
    race.core.safeio.write_inside at every finished pilot, which refuses a link) and, with the default
    storage, race.db (sqlite would follow a link there). A planted link or a non-file refused here costs
    no calibration."""
    from race.core.safeio import UnsafeWrite

    if os.path.lexists(o.out_dir) and not os.path.isdir(o.out_dir):
        raise UnsafeWrite(f"output folder {o.out_dir!r} exists and is not a folder: choose another --out")
    _journal_file(o.storage)
    for name in ("results.json", *(("race.db",) if o.storage is None else ())):
        path = os.path.join(o.out_dir, name)
        if os.path.islink(path):
            raise UnsafeWrite(f"{path!r} is a symbolic link (to {os.readlink(path)!r}): RACE never writes through a "
                              "link nor replaces one; remove it, then run the same command again")
        if os.path.lexists(path) and not os.path.isfile(path):
            raise UnsafeWrite(f"{path!r} exists and is not a regular file: expected a file RACE may replace")


def _journal_file(storage: str | None) -> None:
    """``journal:PATH`` naming a file that holds something other than an optuna journal (a line of JSON
    with an ``op_code`` first): refused, since the grid would append its records to it."""
    if not storage or not storage.startswith("journal:"):
        return
    from race.core.safeio import MAX_JOURNAL_BYTES

    path = storage[len("journal:"):]
    if not os.path.isfile(path) or not 0 < os.path.getsize(path) <= MAX_JOURNAL_BYTES:
        return                      # a new journal; a device, a FIFO or one over the cap: refused where it opens
    import json

    with open(path, "rb") as fh:
        first = fh.readline(1 << 16)
    try:
        ok = isinstance(json.loads(first), dict) and "op_code" in json.loads(first)
    except ValueError:
        ok = False
    if not ok:
        from race.run.store.base import StoreError

        raise StoreError(f"storage journal:{path!r} is a file that is not an optuna journal: RACE would append its "
                         "records to it; name a new file or a journal a grid wrote")


CHECKS: tuple[Check, ...] = (
    Check("one policy", "a config naming several models (race.run.api.run_models runs one study per model)", _one_policy),
    Check("output folder", "a results.json or race.db in the output folder that is a link or not a file", _out_dir),
    Check("device", "a device this machine does not have", _device),
    Check("grid points", "a grid with fewer points than a verdict needs", _grid_points),
    Check("custom reward", "a custom reward that does not import within its timeout", _custom_reward),
    Check("held-out set", "eval.prompts larger than the task's held-out problems", _task_size),
    Check("eval tasks", "an eval.tasks file that does not load", _eval_tasks),
    Check("imported pilots", "--import-pilots of another config or another plan", _import_pilots),
    Check("FLOP accounting", "an architecture RACE cannot count, or a LoRA target no module has", _flops),
    Check("budget floor", "a budget below one rollout of one token", _budget_floor),
    Check("vocabulary", "a prompt holding a token the model has no embedding for", _vocabulary),
    Check("backend", "a backend this RACE lacks, vLLM sleep mode off CUDA, or vLLM with budget halving", _backend),
    Check("judge model", "an eval.judge_model that cannot be loaded", _judge),
    Check("host memory", "a policy whose weights, adapters and optimizer state do not fit in memory", _host_memory),
    Check("engine", "an engine that cannot run this config (--engine lockstep off the lean path)", _engine),
)


def run_checks(config: GridConfig, options: RunOptions) -> None:
    """Every check of ``CHECKS``, in order; the first that fails raises its one-line error."""
    for check in CHECKS:
        check.run(config, options)


def check_task_size(config: Any) -> None:
    """A local dataset with fewer held-out problems than ``eval.prompts`` fails here, once, with
    the number to set, instead of in every pilot (a Hugging Face dataset is checked by the pilots,
    which download it anyway)."""
    from race.tasks import TASKS, load_task

    task = config.task
    if task in TASKS:        # a built-in task's held-out set is generated: asking for more fails here, once
        load_task(task, split="eval", n=config.eval.prompts)
        return
    if not task.endswith((".jsonl", ".json", ".parquet")):
        if os.path.exists(task):    # a local path without a dataset suffix (a FIFO, a device): refused here, once
            from race.tasks.datasets import load_dataset_problems

            load_dataset_problems(task)
        return
    held = len(load_task(task, split="eval"))
    if config.eval.prompts > held:
        raise ConfigError(f"eval.prompts {config.eval.prompts} exceeds the {held} held-out problems of task "
                          f"{task!r}: set eval.prompts to at most {held}, or use a larger dataset")


def check_eval_tasks(config: Any) -> None:
    """Every local ``eval.tasks`` set loads (a bad file fails here, once, in one line, instead of in
    every pilot; a Hugging Face dataset is loaded by the pilots)."""
    from race.tasks import TASKS, TaskError, load_heldout_set

    for t in config.eval.tasks:
        try:
            if t.path in TASKS or os.path.exists(t.path) or t.path.endswith((".jsonl", ".json", ".parquet", ".pq")):
                load_heldout_set(t.path)
        except TaskError as e:
            raise ConfigError(f"eval.tasks {t.label!r}: {e}") from None



# ---------------------------------------------------------------- pilots from another results file

def config_difference(a: Mapping[str, Any], b: Mapping[str, Any], skip: Sequence[str]) -> tuple | None:
    from race.run.store.study import first_difference, normalized

    return first_difference({k: v for k, v in normalized(dict(a)).items() if k not in skip},
                             {k: v for k, v in normalized(dict(b)).items() if k not in skip})


SCHEDULE_REL_TOL = 1e-5   # FLOP counts kept at 6 significant digits (compact records) are the same schedule


def schedule_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple | None:
    """The first field where planned schedule ``a`` and a pilot's ``b`` differ: knobs (integers,
    strings) exactly, FLOP counts and ρ (floats) to ``SCHEDULE_REL_TOL``."""
    from race.run.store.study import first_difference

    return first_difference(a, b, rel_tol=SCHEDULE_REL_TOL)


def written_config(results: Any) -> dict:
    """A results file's config with the settings it lacks at their defaults: a setting added after
    the file was written ran at its default there (as a resumed study's, race.run.store)."""
    from race.config.configfile import default_settings
    from race.run.store.study import fill_missing, normalized

    return fill_missing(normalized(dict(results.config)), normalized(default_settings()))


def import_error(path: str, diff: tuple) -> Exception:
    from race.run.store import StoreError

    where, a, b = diff
    return StoreError(f"pilots in {path!r} ran with another config ({where} is {a!r} here, {b!r} there): "
                      "only pilots of the same run config can be imported")


# what a grid holds, not how one of its pilots runs: a pilot is fixed by the rest of the config, its ρ
# target and its seed (its schedule depends on nothing else: race.flops.grid.plan_schedule), so pilots of a
# grid with fewer seeds or other ρ points can be imported into a larger grid (more seeds, added points)
GRID_SHAPE = ("name", "seeds", "grid")


def check_importable(config: GridConfig, path: str) -> None:
    """A results file whose pilots ``import_finished`` could take: readable, and run with this
    config up to the grid's shape (``GRID_SHAPE``; ``grpo`` is compared after calibration, which may
    switch the healthy recipe on). Before calibration and before any study is written, each pilot's
    schedule is checked as far as the file allows: against itself and the config
    (``check_schedule_arithmetic``) always, and against the plan of the file's own calibrated
    lengths when it carries them; what only this run's calibration can check is checked after it,
    still before the study is created (race.run.study: ``check_import``)."""
    from race.config.configfile import config_from_dict
    from race.stats.results import load_results

    results = load_results(path)
    written = written_config(results)
    diff = config_difference(config.to_dict(), written, (*GRID_SHAPE, "grpo"))
    if diff:
        raise import_error(path, diff)
    try:
        own = config_from_dict(written)
    except ValueError:               # its own config no longer loads (another RACE): left to the later checks
        return
    # each pilot's schedule against the plan its own config and calibrated lengths give: a schedule
    # edited in the file is refused here, before calibration and before any study is written
    P, C = (results.plan or {}).get("prompt_len"), (results.plan or {}).get("completion_len")
    if P and C:
        from race.flops.grid import plan_grid

        try:
            planned = {s.rho_target: s.to_dict() for s in plan_grid(own, prompt_len=float(P),
                                                                      completion_len=float(C)).schedules}
        except ValueError:            # its own config no longer plans (another RACE): the checks below, then later ones
            planned = {}
        check_schedules(path, planned, results.pilots)
    # a file without its plan (docs/runs keep none): what holds whatever the lengths, still before calibration
    check_schedule_arithmetic(path, own, results.pilots)


def check_schedule_arithmetic(path: str, config: GridConfig, pilots: Any) -> None:
    """What a complete pilot's schedule must satisfy whatever the calibration (which only moves the
    knobs through the expected token lengths): its ρ target is the pilot's, its LoRA rank the
    config's, its learning rate the √B rule's for its batch, its FLOPs its steps × its FLOPs per
    step, its steps as many as the budget buys at that cost, and every seed of a grid point ran
    the same schedule. A schedule edited in a results file (a step added) fails here, before any
    calibration."""
    from race.flops.grid import learning_rate
    from race.run.store import StoreError
    from race.run.store.study import first_difference

    def refuse(p: Any, why: str) -> StoreError:
        return StoreError(f"pilot ρ={p.rho_target:g} seed {p.seed} in {path!r} ran a schedule that does not add up "
                          f"({why}): only pilots of an unedited RACE results file can be imported")

    tol = SCHEDULE_REL_TOL
    first: dict[float, Any] = {}
    for p in pilots:
        s = p.schedule
        if p.status != "complete" or s is None:
            continue
        if not math.isclose(float(s.rho_target), float(p.rho_target), rel_tol=tol):
            raise refuse(p, f"its schedule is for ρ={s.rho_target:g}")
        if s.lora_rank != config.lora.rank:
            raise refuse(p, f"lora_rank is {s.lora_rank!r} there, {config.lora.rank} in the config")
        lr = learning_rate(config, s.prompts_per_step * s.n_train)
        if not math.isclose(s.learning_rate, lr, rel_tol=tol):
            raise refuse(p, f"learning_rate is {s.learning_rate:.6g} there, {lr:.6g} by the config's rule for "
                            f"{s.prompts_per_step} × {s.n_train} sequences")
        d = first_difference(s.flops_per_step.scaled(s.steps).to_dict(), s.flops.to_dict(), rel_tol=tol)
        if d:
            per = s.flops_per_step.to_dict().get(d[0])
            raise refuse(p, f"{s.steps} steps × flops_per_step.{d[0]} {per:.6g} = {d[1]:.6g}, but its flops.{d[0]} is "
                            f"{d[2]:.6g}")
        per_step = s.flops_per_step.total
        if per_step > 0:
            bought = config.budget / per_step
            if not (bought * (1 - tol) - 1 < s.steps <= bought * (1 + tol)):
                raise refuse(p, f"steps is {s.steps} there; the budget {config.budget:.6g} buys {int(bought)} steps of "
                                f"{per_step:.6g} FLOPs")
        rho = float(p.rho_target)
        other = first.setdefault(rho, p)
        d = schedule_difference(other.schedule.to_dict(), s.to_dict())
        if d:
            raise refuse(p, f"{d[0]} is {d[2]!r}, seed {other.seed} of the same grid point ran {d[1]!r}")


def check_import(path: str, run_config: Mapping[str, Any], plan: Mapping[str, Any], keys: Any) -> list:
    """The complete pilots of results file ``path`` a study of ``run_config`` and ``plan`` (a
    ``Plan.to_dict()``: its schedules) would take: those of its grid points × seeds (``keys``),
    their run config the study's up to the grid's shape, each one's schedule the one the plan
    gives its ρ. Every pilot is checked before any is returned: a refusal imports nothing, and
    run before a study is created (race.run.study), it leaves no study behind."""
    from race.stats.results import load_results

    results = load_results(path)
    diff = config_difference(run_config, written_config(results), GRID_SHAPE)
    if diff:
        raise import_error(path, diff)
    planned = {float(s["rho_target"]): s for s in plan.get("schedules", [])}
    keys = set(keys)
    pilots = [p for p in results.pilots if p.status == "complete" and (float(p.rho_target), int(p.seed)) in keys]
    check_schedules(path, planned, pilots)
    return pilots


def check_schedules(path: str, planned: Mapping[float, Any], pilots: Any) -> None:
    """Every complete pilot with a planned ρ ran exactly that schedule (``schedule_difference``)."""
    from race.run.store import StoreError

    for p in pilots:
        rho = float(p.rho_target)
        if p.status != "complete" or rho not in planned:
            continue
        d = schedule_difference(planned[rho], p.schedule.to_dict() if p.schedule else {})
        if d:
            raise StoreError(f"pilot ρ={p.rho_target:g} seed {p.seed} in {path!r} ran another schedule "
                             f"({d[0]} is {d[2]!r} there, {d[1]!r} here): only pilots of the same plan can be "
                             "imported")


