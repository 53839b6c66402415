"""What a recipe needs besides its settings: the data and the reward, written where the trainer reads them.

``race recipe … --emit DIR`` (``emit``) writes, for the recipe's trainer:

- ``DIR/data/``: the RACE config's task as the trainer reads it, its training split and its
  held-out split (the same split RACE's pilots used: race.tasks.load_task). TRL and OpenRLHF read
  JSON lines ``{"prompt", "answer"}``; verl reads Parquet rows with the prompt as a user message,
  ``data_source: race`` and ``reward_model.ground_truth``;
- ``DIR/race_reward.py``: RACE's reward of that config (a rule, a mix, math-verify, or the user's
  custom function, which then runs in its own process with the config's time limit:
  race.tasks.rewards.build_reward), under each trainer's signature: ``reward`` for TRL's ``reward_funcs``,
  ``compute_score`` for verl's ``custom_reward_function``, ``reward_func`` for OpenRLHF's
  ``--reward.remote_url FILE.py``; for TRL it carries the policy's end-of-turn ids and their text
  (``end_tokens``, from its tokenizer), so that ``reward`` puts back the marker TRL decodes away when a
  completion's ids end with one, and scores the text RACE's pilots score (a tokenizer not on this machine:
  ``reward`` reads them from the policy's tokenizer, as the trainer loads it, at its first call);
- ``DIR/race_config.json``: the config the reward is built from; ``DIR/recipe.json``: the recipe;
- verl: ``DIR/race_verl_reward.py``, the reward manager the recipe names (``reward.reward_manager``):
  verl 0.9.1's naive manager, except that it decodes a response with its special tokens, as RACE's
  pilots decode completions, so a reward that checks termination sees the end-of-turn marker;
- TRL: ``DIR/train_trl.py``, a runnable training script (``python train_trl.py [--max-steps N]``).

It returns the settings that point the recipe at them (``data_settings``), and the epochs so that
the dataset never ends the run before its step count: the step count assumes ``steps × B_p``
prompts, ``rows`` are in the training split.

Invariants: the files hold the task's problems and RACE's reward only (no model text); a reward
model (``prm`` kinds) is refused here, in one line: the trainer's own reward-model support is the
way to run one; writing happens only after every check. Every file goes through
race.core.safeio.write_inside (a temporary file and a rename inside DIR, never through a symbolic link,
never outside DIR). A DIR that holds anything is refused unless ``force``; with it, only RACE's own
files (``own_files``) are replaced, and ``check_target`` names them; nothing else in DIR is touched.
"""
from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any, Callable

from race.config.configfile import GridConfig
from race.core.errors import RaceError
from race.core.safeio import write_inside
from race.fullrun.reward_file import (CUSTOM_FILE, VERL_MANAGER, VERL_MANAGER_FILE, VERL_MANAGER_TEXT, end_tokens,
                                     reward_module)

TRL_SCRIPT = '''"""The full run of this recipe with TRL (written by race recipe --for trl --emit): GRPOConfig from
recipe.json, the task's training split from data/, RACE's reward from race_reward.py, LoRA as the
recipe names it.

    python train_trl.py                    # the whole run: the recipe's max_steps
    python train_trl.py --max-steps 2      # a smoke test
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def build(max_steps=None, output_dir=None, **overrides):
    """The GRPOTrainer of the recipe (``overrides``: more GRPOConfig keywords)."""
    import warnings

    # peft 0.21 (PeftModel.__init__) and TRL 1.16 (unwrap_model_for_generation) read transformers'
    # deprecated `is_gradient_checkpointing` whatever the settings: their FutureWarning, not this recipe's
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    import importlib.util

    # this folder's race_reward.py by its path: never another module of that name imported before
    spec = importlib.util.spec_from_file_location("race_reward", os.path.join(HERE, "race_reward.py"))
    race_reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(race_reward)
    with open(os.path.join(HERE, "recipe.json"), encoding="utf-8") as fh:
        rec = json.load(fh)
    settings, model = dict(rec["settings"]), rec["model"]
    if max_steps:
        settings["max_steps"] = int(max_steps)
    cpu = not torch.cuda.is_available()
    args = GRPOConfig(output_dir=output_dir or os.path.join(HERE, "out"), report_to="none", save_strategy="no",
                      bf16=not cpu, use_cpu=cpu, **{**settings, **overrides})
    data = load_dataset("json", data_files=os.path.join(HERE, "data", "train.jsonl"), split="train")
    peft = LoraConfig(r=model["lora_r"], lora_alpha=model["lora_alpha"],
                      target_modules=model["lora_target_modules"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model["model_name_or_path"], reward_funcs=race_reward.reward,
                          args=args, train_dataset=data, peft_config=peft)
    if not race_reward.END_TOKENS:      # the tokenizer was not found at emit time: the trainer's own end ids
        race_reward.use_tokenizer(trainer.processing_class, trainer.eos_token_ids)
    return trainer


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="The full run of this RACE recipe with TRL.")
    ap.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    ap.add_argument("--output-dir", default=None)
    a = ap.parse_args()
    build(a.max_steps, a.output_dir).train()
'''


def _rows(config: GridConfig) -> tuple[list, list]:
    from race.tasks import load_task

    return load_task(config.task, split="train"), load_task(config.task, split="eval")


def shipped_files(model: str) -> tuple[str, ...]:
    """The files of a shipped policy (``race/<name>``) that ``emit`` copies to ``DIR/model/``; () for
    any other model id (passed through unchanged)."""
    from race.flops.catalog import resolve_model_path

    folder = resolve_model_path(model)
    if folder == model or not os.path.isdir(folder):
        return ()
    return tuple(sorted(f for f in os.listdir(folder) if os.path.isfile(os.path.join(folder, f))))


def own_files(trainer: str, model: str | None = None, custom: bool = False) -> tuple[str, ...]:
    """The files ``emit`` writes for ``trainer``, relative to DIR (recipe.json included; ``model/…``
    for a shipped policy, ``race_custom_reward.py`` for a custom reward)."""
    data = ("data/train.parquet", "data/test.parquet") if trainer == "verl" else ("data/train.jsonl", "data/test.jsonl")
    return (*data, "race_config.json", "race_reward.py", *((CUSTOM_FILE,) if custom else ()),
            *(("train_trl.py",) if trainer == "trl" else ()), *((VERL_MANAGER_FILE,) if trainer == "verl" else ()),
            "recipe.json",
            *(f"model/{f}" for f in (shipped_files(model) if model else ())))


def model_location(model: str, out_dir: str | None) -> str:
    """Where the trainer finds the policy: a shipped ``race/<name>`` is its folder's absolute path, or
    with ``out_dir`` the copy ``emit`` made at ``DIR/model``; any other id unchanged."""
    from race.flops.catalog import resolve_model_path

    if not shipped_files(model):
        return model
    return os.path.join(os.path.abspath(out_dir), "model") if out_dir else os.path.abspath(resolve_model_path(model))


def check_target(out_dir: str, trainer: str, *, force: bool = False, model: str | None = None,
                 custom: bool = False) -> list[str]:
    """Refuse an ``--emit`` folder that holds anything, unless ``force``; return RACE's own files
    already there (relative to DIR), the ones ``force`` replaces. Called before anything is written."""
    if not os.path.exists(out_dir):
        return []
    if not os.path.isdir(out_dir):
        raise RaceError(f"--emit {out_dir!r} exists and is not a folder: choose a folder for the recipe's files")
    try:
        entries = sorted(os.listdir(out_dir))
    except OSError as e:
        raise RaceError(f"cannot read --emit {out_dir!r}: {e.strerror or e}: choose a readable folder") from None
    present = [f for f in own_files(trainer, model, custom) if os.path.lexists(os.path.join(out_dir, f))]
    if entries and not force:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise RaceError(f"--emit {out_dir!r} is not empty ({shown}): pass --force to replace RACE's own files "
                        "there (" + ", ".join(own_files(trainer, model, custom)) + "; nothing else is touched), or choose an empty "
                        "or new folder")
    return present


def write_recipe(rec: Any, out_dir: str) -> str:
    """``DIR/recipe.json``: the recipe as ``race recipe --format json`` prints it (the script reads it)."""
    return write_inside(out_dir, "recipe.json", json.dumps(rec.to_dict(), indent=2), what="--emit file")


def _custom_reward(config: GridConfig) -> tuple[str | None, str | None]:
    """(the file of a ``custom`` reward, its function's name) to copy beside race_reward.py, or
    (None, None) for any other kind; refused in one line when the file cannot be found."""
    custom_fn, custom_src = None, None
    if config.reward.kind == "custom":
        from race.tasks.rewards.base import reward_source

        spec = str(config.reward.function or "")
        custom_src, custom_fn = reward_source(spec), spec.rpartition(":")[2]
        if not custom_src or not custom_fn:
            raise RaceError(f"reward.function {spec!r}: its file cannot be found from here: give it as "
                            "'path/to/file.py:function' so --emit can copy it beside race_reward.py")
    return custom_src, custom_fn


def _copier(src: str) -> Callable[[Any], None]:
    """A writer for race.core.safeio.write_inside that copies the file ``src`` byte for byte."""
    def write(fh: Any) -> None:
        with open(src, "rb") as f:
            shutil.copyfileobj(f, fh)
    return write


def _has_template(folder: str) -> bool:
    """Does the tokenizer in ``folder`` carry a chat template (``tokenizer_config.json``'s
    ``chat_template``, or a ``chat_template.jinja`` / ``.json`` file beside it)? Read as text."""
    if any(os.path.isfile(os.path.join(folder, f)) for f in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as fh:
            return bool(json.load(fh).get("chat_template"))
    except (OSError, ValueError):
        return False


def chat_format(config: GridConfig) -> tuple[bool, list[str]]:
    """(does the trainer render each prompt as a user turn of the policy's chat template, notes): as
    RACE's pilots do (race.tasks.taskdata.policy_prompts): ``chat_template`` on, or auto with a
    tokenizer that has a template; off: the prompt text as it is. A model that is not a local folder
    (a Hub id) is taken to have one under auto, and a note says so. Pure: the tokenizer files are
    read as text, transformers is not imported."""
    from race.flops.catalog import resolve_model_path

    mode = config.chat_template
    if mode in ("on", "off"):
        return mode == "on", []
    folder = resolve_model_path(config.model)
    if os.path.isdir(folder):
        return _has_template(folder), []
    return True, [f"prompts: RACE's pilots render them with {config.model!r}'s chat template when its tokenizer has "
                  "one (chat_template: auto), and the recipe assumes it has; set chat_template: off in the config "
                  "if it has none"]


def _messages(p: Any, system: str | None) -> list[dict[str, str]]:
    """A problem's prompt as the chat template's turns: the system prompt, if any, then the user turn."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": p.prompt}]


def _write_splits(put: Callable[[str, Any], None], trainer: str, train: list, held: list, *, chat: bool,
                  system: str | None) -> None:
    """The training and held-out splits through ``put``, as the trainer reads them: verl Parquet rows
    (the prompt as chat turns, which verl always renders with the template; ``reward_model.ground_truth``),
    else JSON lines ``{"prompt", "answer"}``. With ``chat``, TRL's prompt is its conversational form
    (turns, which TRL renders with the template) and OpenRLHF's the text (``--data.apply_chat_template``
    makes it a user turn), or turns when there is a system prompt; without, the text as it is."""
    if trainer == "verl":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for name, rows in (("train", train), ("test", held)):
            table = pa.table({
                "data_source": ["race"] * len(rows),
                "prompt": [_messages(p, system if chat else None) for p in rows],
                "reward_model": [{"style": "rule", "ground_truth": p.answer} for p in rows],
                "extra_info": [{"index": p.id, "prompt": p.prompt} for p in rows]})
            put(f"data/{name}.parquet", lambda fh, t=table: pq.write_table(t, fh))
        return
    turns = chat and (trainer == "trl" or bool(system))
    for name, rows in (("train", train), ("test", held)):
        put(f"data/{name}.jsonl", "".join(
            json.dumps({"prompt": _messages(p, system) if turns else p.prompt, "answer": p.answer},
                       ensure_ascii=False) + "\n" for p in rows))


def emit(config: GridConfig, trainer: str, out_dir: str, *, force: bool = False) -> dict[str, Any]:
    """Write the data and reward files for ``trainer`` into ``out_dir``; return ``{"rows", "held_out",
    "files", "replaced"}`` (training rows, held-out rows, the paths written, RACE's own files that
    were there before, relative to ``out_dir``). A non-empty ``out_dir`` is refused unless ``force``."""
    if config.reward.kind in ("prm", "proxy-prm"):
        raise RaceError(f"reward.kind {config.reward.kind!r} is a reward model: --emit writes rule and custom "
                        "rewards only; run the model through the trainer's own reward-model settings")
    custom_src, custom_fn = _custom_reward(config)
    replaced = check_target(out_dir, trainer, force=force, model=config.model, custom=bool(custom_fn))
    train, held = _rows(config)                 # before anything is written: a task that cannot load stops here
    reward_text = reward_module(config, custom_fn, end_tokens(config.model) if trainer == "trl" else None,
                                model=model_location(config.model, out_dir))
    files = []

    def put(name: str, content: Any) -> None:
        try:
            files.append(write_inside(out_dir, name, content, what="--emit file"))
        except OSError as e:
            raise RaceError(f"cannot write {os.path.join(out_dir, name)!r}: {e.strerror or e}: choose a writable "
                            "--emit folder") from None

    _write_splits(put, trainer, train, held, chat=chat_format(config)[0], system=config.system_prompt)
    put("race_config.json", json.dumps(config.to_dict(), indent=2, default=list))
    put("race_reward.py", reward_text)
    if custom_src:
        put(CUSTOM_FILE, _copier(custom_src))
    if trainer == "trl":
        put("train_trl.py", TRL_SCRIPT)
    if trainer == "verl":
        put(VERL_MANAGER_FILE, VERL_MANAGER_TEXT)
    shipped = shipped_files(config.model)
    if shipped:
        from race.flops.catalog import resolve_model_path

        folder = resolve_model_path(config.model)
        for f in shipped:
            put(f"model/{f}", _copier(os.path.join(folder, f)))
    return {"rows": len(train), "held_out": len(held), "files": files, "replaced": replaced}


def epochs(steps: int, prompts_per_step: int, rows: int) -> int:
    """verl's passes over ``rows`` training prompts that ``steps`` steps of ``prompts_per_step`` need:
    its loader drops the last partial batch (``drop_last``), so a pass holds ⌊rows / B_p⌋ steps."""
    return max(1, math.ceil(steps / max(1, rows // max(1, prompts_per_step))))


def openrlhf_passes(steps: int, prompts_per_step: int, rows: int) -> tuple[int, int]:
    """``(num_episodes, max_samples)`` for OpenRLHF 0.11.2 so that the prompts it draws, episodes ×
    min(max_samples, rows), are whole rollout batches and as many as ``steps`` of ``prompts_per_step``
    without exceeding them. Its trainer walks the whole (capped) dataset each episode and trains a
    partial last batch too, and its LR schedule spans ⌊samples · n / train_batch⌋ · episodes · μ
    steps, so a dataset of k whole batches gives exactly k steps an episode: the largest
    episodes × k ≤ steps, k ≤ ⌊rows / B_p⌋ (ties: fewer episodes)."""
    bp = max(1, prompts_per_step)
    k_max = rows // bp
    if k_max < 1:                   # fewer rows than one batch: one partial batch an episode
        return max(1, steps * bp // max(1, rows)), rows
    if steps <= k_max:
        return 1, steps * bp
    best = (0, 0)
    for k in range(k_max, 0, -1):
        e = steps // k
        if e * k > best[0] * best[1]:
            best = (e, k)
        if e * k == steps or (k_max - k) > 4096:    # exact, or enough candidates looked at
            break
    return best[0], best[1] * bp


def data_settings(trainer: str, out_dir: str | None, *, steps: int, prompts_per_step: int,
                  rows: int | None, chat: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The settings that point a recipe at the emitted files (``out_dir``), or, without one,
    placeholders the trainer rejects loudly (a path that does not exist), with the note that says so.
    ``chat``: the prompts are rendered with the policy's chat template (``chat_format``): OpenRLHF's
    ``--data.apply_chat_template``; TRL's is the data's conversational form; verl always renders it."""
    d = os.path.abspath(out_dir) if out_dir else "RACE_EMIT_DIR"
    notes = [] if out_dir else [
        "data and reward: the paths under RACE_EMIT_DIR are placeholders the trainer refuses: "
        "race recipe … --emit DIR writes the task's splits and RACE's reward module there"]
    if trainer == "verl" and not chat:
        notes.append("prompts: verl renders every prompt with the tokenizer's chat template (RLHFDataset), and RACE's "
                     "pilots fed this policy the text as it is (chat_template off, or no template)")
    need = steps * prompts_per_step
    if trainer == "trl":
        if rows is not None:
            notes.append(f"the step count draws {need:,} prompts; the training split holds {rows:,} (TRL's "
                         "sampler starts another pass when one ends, max_steps ends the run)")
        return {"dataset_name": os.path.join(d, "data"), "reward_funcs": ["race_reward.reward"]}, notes + [
            f"run `trl grpo` from {d} (race_reward.py is imported from there) or put it on PYTHONPATH"]
    if trainer == "verl":
        out = {"data.train_files": os.path.join(d, "data", "train.parquet"),
               "data.val_files": os.path.join(d, "data", "test.parquet"),
               "data.prompt_key": "prompt",
               # verl 0.9 reads the reward function under reward. only (main_ppo dropped the old top-level key)
               "reward.custom_reward_function.path": os.path.join(d, "race_reward.py"),
               "reward.custom_reward_function.name": "compute_score",
               # verl's naive reward manager decodes without special tokens; this one keeps them (the
               # end-of-turn marker RACE's structured and format rules check), as RACE's pilots decode
               "reward.reward_manager.source": "importlib",
               "reward.reward_manager.name": VERL_MANAGER,
               "reward.reward_manager.module.path": os.path.join(d, VERL_MANAGER_FILE)}
        if rows is not None:
            ep = epochs(steps, prompts_per_step, rows)
            out["trainer.total_epochs"] = ep
            notes.append(f"the step count draws {need:,} prompts; the training split holds {rows:,} "
                         f"({rows // max(1, prompts_per_step):,} whole batches), so the recipe makes {ep} pass(es) "
                         "over it and trainer.total_training_steps ends the run")
        return out, notes
    out = {"--data.prompt_dataset": os.path.join(d, "data", "train.jsonl"), "--data.input_key": "prompt",
           "--data.label_key": "answer", "--reward.remote_url": os.path.join(d, "race_reward.py"),
           "--eval.dataset": os.path.join(d, "data", "test.jsonl"),
           **({"--data.apply_chat_template": True} if chat else {})}
    if rows is not None:
        episodes, samples = openrlhf_passes(steps, prompts_per_step, rows)
        out["--data.max_samples"] = samples
        out["--train.num_episodes"] = episodes
        notes.append(f"the step count draws {need:,} prompts; the training split holds {rows:,}: OpenRLHF draws "
                     f"{episodes} episode(s) × {samples:,} prompts = {episodes * samples:,}")
    return out, notes
