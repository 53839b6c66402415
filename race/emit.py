"""What a recipe needs besides its settings: the data and the reward, written where the trainer reads them.

``race recipe … --emit DIR`` (``emit``) writes, for the recipe's trainer:

- ``DIR/data/``: the RACE config's task as the trainer reads it, its training split and its
  held-out split (the same split RACE's pilots used: race.tasks.load_task). TRL and OpenRLHF read
  JSON lines ``{"prompt", "answer"}``; verl reads Parquet rows with the prompt as a user message,
  ``data_source: race`` and ``reward_model.ground_truth``;
- ``DIR/race_reward.py``: RACE's reward of that config (a rule, a mix, math-verify, or the user's
  custom function, which then runs in its own process with the config's time limit:
  race.rewards.build_reward), under each trainer's signature: ``reward`` for TRL's ``reward_funcs``,
  ``compute_score`` for verl's ``custom_reward_function``, ``reward_func`` for OpenRLHF's
  ``--reward.remote_url FILE.py``;
- ``DIR/race_config.json``: the config the reward is built from; ``DIR/recipe.json``: the recipe;
- TRL: ``DIR/train_trl.py``, a runnable training script (``python train_trl.py [--max-steps N]``).

It returns the settings that point the recipe at them (``data_settings``), and the epochs so that
the dataset never ends the run before its step count: the step count assumes ``steps × B_p``
prompts, ``rows`` are in the training split.

Invariants: the files hold the task's problems and RACE's reward only (no model text); a reward
model (``prm`` kinds) is refused here, in one line: the trainer's own reward-model support is the
way to run one; writing happens only after every check. Every file goes through
race.safeio.write_inside (a temporary file and a rename inside DIR, never through a symbolic link,
never outside DIR). A DIR that holds anything is refused unless ``force``; with it, only RACE's own
files (``own_files``) are replaced, and ``check_target`` names them; nothing else in DIR is touched.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from race.config import GridConfig
from race.errors import RaceError
from race.safeio import write_inside

REWARD_MODULE = '''"""RACE's reward for this recipe (race recipe --emit): {kind}. Needs RACE installed (pip install race-rl).

Completions reach it as the trainer decodes them: TRL and verl skip special tokens, so a reward that
checks termination (structured, format) sees no end marker there."""
import json
import os

from race.config import config_from_dict
from race.rewards import build_reward, score_completions

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "race_config.json"), encoding="utf-8") as _fh:
    _CONFIG = config_from_dict(json.load(_fh))
_REWARD = None


def _scores(prompts, completions, references):
    global _REWARD
    if _REWARD is None:
        _REWARD = build_reward(_CONFIG)
    return list(score_completions(_REWARD, list(prompts), list(completions), list(references)).scores)


def reward(completions, answer, prompts=None, **kwargs):
    """TRL: reward_funcs=["race_reward.reward"] (run from this folder, or put it on PYTHONPATH)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return _scores(prompts or [""] * len(texts), texts, answer)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl: custom_reward_function.path=race_reward.py, custom_reward_function.name=compute_score."""
    return _scores([(extra_info or {{}}).get("prompt", "")], [solution_str], [ground_truth])[0]


def reward_func(queries, prompts, labels):
    """OpenRLHF: --reward.remote_url race_reward.py (a query is the prompt and its completion)."""
    import torch

    completions = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts)]
    r = torch.tensor(_scores(prompts, completions, labels), dtype=torch.float32)
    return {{"rewards": r, "scores": r, "extra_logs": {{}}}}
'''


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
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    import race_reward
    from race.models import resolve_model_path      # a shipped race/ policy; an HF id or folder passes through

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
    return GRPOTrainer(model=resolve_model_path(model["model_name_or_path"]), reward_funcs=race_reward.reward,
                       args=args, train_dataset=data, peft_config=peft)


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


def own_files(trainer: str) -> tuple[str, ...]:
    """The files ``emit`` writes for ``trainer``, relative to DIR (recipe.json included)."""
    data = ("data/train.parquet", "data/test.parquet") if trainer == "verl" else ("data/train.jsonl", "data/test.jsonl")
    return (*data, "race_config.json", "race_reward.py", *(("train_trl.py",) if trainer == "trl" else ()), "recipe.json")


def check_target(out_dir: str, trainer: str, *, force: bool = False) -> list[str]:
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
    present = [f for f in own_files(trainer) if os.path.lexists(os.path.join(out_dir, f))]
    if entries and not force:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise RaceError(f"--emit {out_dir!r} is not empty ({shown}): pass --force to replace RACE's own files "
                        "there (" + ", ".join(own_files(trainer)) + "; nothing else is touched), or choose an empty "
                        "or new folder")
    return present


def write_recipe(rec: Any, out_dir: str) -> str:
    """``DIR/recipe.json``: the recipe as ``race recipe --format json`` prints it (the script reads it)."""
    return write_inside(out_dir, "recipe.json", json.dumps(rec.to_dict(), indent=2), what="--emit file")


def emit(config: GridConfig, trainer: str, out_dir: str, *, force: bool = False) -> dict[str, Any]:
    """Write the data and reward files for ``trainer`` into ``out_dir``; return ``{"rows", "held_out",
    "files", "replaced"}`` (training rows, held-out rows, the paths written, RACE's own files that
    were there before, relative to ``out_dir``). A non-empty ``out_dir`` is refused unless ``force``."""
    if config.reward.kind in ("prm", "proxy-prm"):
        raise RaceError(f"reward.kind {config.reward.kind!r} is a reward model: --emit writes rule and custom "
                        "rewards only; run the model through the trainer's own reward-model settings")
    replaced = check_target(out_dir, trainer, force=force)
    train, held = _rows(config)                 # before anything is written: a task that cannot load stops here
    files = []

    def put(name: str, content: Any) -> None:
        try:
            files.append(write_inside(out_dir, name, content, what="--emit file"))
        except OSError as e:
            raise RaceError(f"cannot write {os.path.join(out_dir, name)!r}: {e.strerror or e}: choose a writable "
                            "--emit folder") from None

    if trainer == "verl":
        import pyarrow as pa
        import pyarrow.parquet as pq

        for name, rows in (("train", train), ("test", held)):
            table = pa.table({
                "data_source": ["race"] * len(rows),
                "prompt": [[{"role": "user", "content": p.prompt}] for p in rows],
                "reward_model": [{"style": "rule", "ground_truth": p.answer} for p in rows],
                "extra_info": [{"index": p.id, "prompt": p.prompt} for p in rows]})
            put(f"data/{name}.parquet", lambda fh, t=table: pq.write_table(t, fh))
    else:
        for name, rows in (("train", train), ("test", held)):
            put(f"data/{name}.jsonl", "".join(json.dumps({"prompt": p.prompt, "answer": p.answer}, ensure_ascii=False)
                                              + "\n" for p in rows))
    put("race_config.json", json.dumps(config.to_dict(), indent=2, default=list))
    put("race_reward.py", REWARD_MODULE.format(kind=config.reward.kind))
    if trainer == "trl":
        put("train_trl.py", TRL_SCRIPT)
    return {"rows": len(train), "held_out": len(held), "files": files, "replaced": replaced}


def epochs(steps: int, prompts_per_step: int, rows: int) -> int:
    """Passes over ``rows`` training prompts that ``steps`` steps of ``prompts_per_step`` need."""
    return max(1, math.ceil(steps * prompts_per_step / max(1, rows)))


def data_settings(trainer: str, out_dir: str | None, *, steps: int, prompts_per_step: int,
                  rows: int | None) -> tuple[dict[str, Any], list[str]]:
    """The settings that point a recipe at the emitted files (``out_dir``), or, without one,
    placeholders the trainer rejects loudly (a path that does not exist), with the note that says so."""
    d = os.path.abspath(out_dir) if out_dir else "RACE_EMIT_DIR"
    notes = [] if out_dir else [
        "data and reward: the paths under RACE_EMIT_DIR are placeholders the trainer refuses: "
        "race recipe … --emit DIR writes the task's splits and RACE's reward module there"]
    need = steps * prompts_per_step
    if rows is not None:
        notes.append(f"the step count assumes {need:,} prompts; the training split holds {rows:,}, so the "
                     f"recipe makes {epochs(steps, prompts_per_step, rows)} pass(es) over it")
    if trainer == "trl":
        return {"dataset_name": os.path.join(d, "data"), "reward_funcs": ["race_reward.reward"]}, notes + [
            f"run `trl grpo` from {d} (race_reward.py is imported from there) or put it on PYTHONPATH"]
    if trainer == "verl":
        out = {"data.train_files": os.path.join(d, "data", "train.parquet"),
               "data.val_files": os.path.join(d, "data", "test.parquet"),
               "data.prompt_key": "prompt",
               "custom_reward_function.path": os.path.join(d, "race_reward.py"),
               "custom_reward_function.name": "compute_score"}
        if rows is not None:
            out["trainer.total_epochs"] = epochs(steps, prompts_per_step, rows)
        return out, notes
    out = {"--data.prompt_dataset": os.path.join(d, "data", "train.jsonl"), "--data.input_key": "prompt",
           "--data.label_key": "answer", "--reward.remote_url": os.path.join(d, "race_reward.py"),
           "--eval.dataset": os.path.join(d, "data", "test.jsonl")}
    if rows is not None:                # every prompt of the split per episode, as many episodes as the steps need
        out["--data.max_samples"] = min(rows, need)
        out["--train.num_episodes"] = epochs(steps, prompts_per_step, min(rows, need))
    return out, notes
