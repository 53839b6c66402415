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
  completion's ids end with one, and scores the text RACE's pilots score;
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

# What race_reward.py carries: RACE's answer parsing and rules, copied from these modules at emit time
# (the math checker's worker is this file itself, run as a script), so it runs where the trainer runs,
# without RACE (RACE cannot share an environment with verl 0.9.1 or OpenRLHF 0.11.2: transformers pins)
VENDORED = ("race.tasks.rewards.rules", "race.tasks.rewards.answers")
_WORKER_CMD = '[sys.executable, "-c", "from race.tasks.rewards.answers import serve; serve()"]'
_WORKER_CMD_HERE = '[sys.executable, os.path.abspath(__file__), "--race-math-worker"]'
CUSTOM_FILE = "race_custom_reward.py"
VERL_MANAGER_FILE = "race_verl_reward.py"
VERL_MANAGER = "RaceRewardManager"

REWARD_HEAD = '''"""RACE's reward for this recipe (race recipe --emit): {kind}. Self-contained: it imports no RACE code
(the rules and answer parsing below are copied from RACE {version}: {vendored}){needs}.

RACE's pilots score a completion decoded with its special tokens, so a reward that checks termination
(structured, format) sees the end-of-turn marker of a finished answer. TRL decodes with skip_special_tokens,
so reward (TRL's) puts the marker back where the completion's ids (TRL's completion_ids) end with one of
END_TOKENS, the policy's end-of-turn ids taken from its tokenizer at emit time; verl's naive reward
manager skips them too, and the recipe's reward manager ({verl_manager}, written beside this file) keeps
them.

    TRL:      reward_funcs=["race_reward.reward"] (run from this folder, or put it on PYTHONPATH)
    verl:     reward.custom_reward_function.path=THIS_FILE reward.custom_reward_function.name=compute_score
              reward.reward_manager.source=importlib reward.reward_manager.name={verl_class}
              reward.reward_manager.module.path={verl_manager} (beside this file)
    OpenRLHF: --reward.remote_url THIS_FILE (its loader calls reward_func)
"""
from __future__ import annotations
'''

REWARD_TAIL = '''

# ------------------------------------------------------------------------------ this recipe's reward

KIND = {kind!r}
MIX = {mix!r}
CHECK_SECONDS = {check!r}
CUSTOM = {custom!r}           # (file beside this one, function name) for reward.kind custom
MAX_ABS = 1e6                 # as RACE: a reward beyond ± this, or not a finite number, scores 0
# TRL: the token ids that end a completion (the policy's EOS / end-of-turn ids, as GRPOTrainer stops at them),
# each with its text as RACE's pilots decode it (special tokens kept); empty: the tokenizer was not found
END_TOKENS = {end!r}


def _rule(name):
    if name == "math":
        return lambda p, c, r: math_answer(p, c, r, timeout=CHECK_SECONDS)
    if name == "format":
        return lambda p, c, r: answer_format(p, c, r, timeout=CHECK_SECONDS)
    return {{"sparse": sparse, "structured": structured, "dense": dense}}[name]


def _custom():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), CUSTOM[0])
    spec = importlib.util.spec_from_file_location("race_custom_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = module
    for part in CUSTOM[1].split("."):
        fn = getattr(fn, part)
    return fn


_FN = None


def _fn():
    global _FN
    if _FN is None:
        if KIND == "custom":
            _FN = _custom()
        elif KIND == "mix":
            parts = [(w, _rule(n)) for n, w in MIX.items()]
            _FN = lambda p, c, r: sum(w * float(f(p, c, r)) for w, f in parts)   # noqa: E731
        else:
            _FN = _rule(KIND)
    return _FN


_SAID = set()


def score(prompt, completion, reference):
    """RACE's reward of one completion; an exception or a value that is not a finite number scores 0.
    A math checker that cannot run (math-verify missing) scores 0 too, and says so once on stderr."""
    try:
        raw = _fn()(prompt, completion, reference)
        if raw is None or isinstance(raw, (bool, str, bytes)):
            return 0.0
        value = float(raw)
    except CheckerError as e:     # noqa: F405 — the copied answers module's
        if str(e) not in _SAID:
            _SAID.add(str(e))
            print(f"race_reward.py: {{e}}; answers that are not plain numbers score 0 until it is installed",
                  file=sys.stderr, flush=True)
        return 0.0
    except Exception:  # noqa: BLE001 — a reward must never stop the run
        return 0.0
    return value if value == value and abs(value) <= MAX_ABS else 0.0


def _prompt_text(prompt):
    """A prompt as text: a conversational prompt (chat turns) gives its last user turn's content."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt or () if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users and isinstance(users[-1], str) else ""


def _as_decoded(text, ids):
    """A completion's text as RACE's pilots decode it. TRL decodes with skip_special_tokens, which drops
    the end-of-turn marker; its completion_ids run to the first end id, inclusive, so a finished completion's
    ids end with one of END_TOKENS, and its marker goes back after the text (a cut-off one's ids do not)."""
    try:
        last = int(ids[-1]) if ids is not None and len(ids) else None
    except (TypeError, ValueError, IndexError):
        return text
    marker = END_TOKENS.get(last)
    return text + marker if marker and not text.endswith(marker) else text


def reward(completions, answer, prompts=None, completion_ids=None, **kwargs):
    """TRL: reward_funcs=["race_reward.reward"]: the dataset's answer column is the reference; a
    conversational completion is its last turn's content; completion_ids (TRL's sampled ids) tell a
    finished completion (its end-of-turn marker put back, as RACE's pilots see it) from a cut-off one."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    ids = completion_ids if completion_ids is not None else [None] * len(texts)
    texts = [_as_decoded(t, i) for t, i in zip(texts, ids)]
    prompts = prompts or [""] * len(texts)
    return [score(_prompt_text(p), c, a) for p, c, a in zip(prompts, texts, answer)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """verl: reward.custom_reward_function.name=compute_score (its naive reward manager's call)."""
    return score((extra_info or {{}}).get("prompt", ""), solution_str, ground_truth)


def reward_func(queries, prompts, labels):
    """OpenRLHF: --reward.remote_url race_reward.py (a query is the prompt and its completion)."""
    import torch

    completions = [q[len(p):] if q.startswith(p) else q for q, p in zip(queries, prompts)]
    r = torch.tensor([score(p, c, a) for p, c, a in zip(prompts, completions, labels)], dtype=torch.float32)
    return {{"rewards": r, "scores": r, "extra_logs": {{}}}}


if __name__ == "__main__" and sys.argv[1:2] == ["--race-math-worker"]:
    serve()
'''


def _vendored(module_name: str) -> str:
    """A RACE module's source without its docstring, ``from __future__`` and RACE imports."""
    import ast
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(module_name))
    tree, lines = ast.parse(src), src.splitlines(keepends=True)
    drop: set[int] = set()
    for i, node in enumerate(tree.body):
        doc = i == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant)
        ours = isinstance(node, ast.ImportFrom) and (node.module == "__future__" or
                                                     (node.module or "").split(".")[0] == "race")
        if doc or ours:
            drop |= set(range(node.lineno - 1, node.end_lineno))
    body = "".join(line for i, line in enumerate(lines) if i not in drop)
    return f"\n# ------------------------------------------------------------------------------ {module_name}\n" + body


def end_tokens(model: str) -> dict[int, str]:
    """The ids at which TRL 1.16's GRPOTrainer ends a completion of ``model`` (the tokenizer's EOS and the
    generation config's ``eos_token_id``\ s), each with its text as RACE's pilots decode it (special
    tokens kept); {} when the tokenizer is not on this machine (a Hub id outside the local cache: nothing
    is downloaded). Read from the model's own files (tokenizer.json, tokenizer_config.json,
    generation_config.json) as JSON: this module stays free of transformers (the import contracts)."""
    from race.flops.catalog import resolve_model_path

    folder = resolve_model_path(model)

    def read(name: str) -> Any:
        if os.path.isdir(folder):
            path = os.path.join(folder, name)
        else:                               # a Hub id: its file in the local cache, if any (never downloaded)
            try:
                from huggingface_hub import try_to_load_from_cache

                path = try_to_load_from_cache(folder, name)
            except Exception:  # noqa: BLE001 — not a valid Hub id, or no cache: no tokenizer here
                return None
        if not isinstance(path, str) or not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    tok, cfg, gen = read("tokenizer.json"), read("tokenizer_config.json") or {}, read("generation_config.json") or {}
    if not isinstance(tok, dict):
        return {}
    text: dict[int, str] = {t["id"]: t["content"] for t in tok.get("added_tokens") or []
                            if isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str)}
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        for piece, i in vocab.items():
            if isinstance(i, int):
                text.setdefault(i, piece)
    ids = {v: k for k, v in sorted(text.items(), reverse=True)}
    eos = cfg.get("eos_token") if isinstance(cfg, dict) else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    more = gen.get("eos_token_id") if isinstance(gen, dict) else None
    found: list[int] = []
    for i in [ids.get(eos) if isinstance(eos, str) else None, *(more if isinstance(more, (list, tuple)) else [more])]:
        if isinstance(i, int) and not isinstance(i, bool) and i in text and i not in found:
            found.append(i)
    return {i: text[i] for i in found}

def reward_module(config: GridConfig, custom_function: str | None = None,
                  end: dict[int, str] | None = None) -> str:
    """The text of ``race_reward.py`` for ``config``'s reward: RACE's rules and answer checker copied
    in, the mix or rule the config names, or the user's function (``custom_function``, the name in
    the copy beside it, ``CUSTOM_FILE``), under TRL's, verl's and OpenRLHF's signatures. ``end``: the
    policy's end-of-turn ids and their text (``end_tokens``), with which TRL's ``reward`` puts back the
    marker TRL decodes away."""
    from race.tasks.rewards.mix import check_mix
    from race.core.version import __version__

    r = config.reward
    answers = _vendored("race.tasks.rewards.answers")
    if _WORKER_CMD not in answers:      # the checker's worker must be this file, not an import of race
        raise RaceError("race.tasks.rewards.answers no longer starts its worker as race_reward.py expects: "
                        "update race.fullrun.emit.reward_module")
    answers = answers.replace(_WORKER_CMD, _WORKER_CMD_HERE)
    kinds = set(r.mix or ()) if r.kind == "mix" else {r.kind}
    needs = ("; the math and format rules need math-verify for answers that are not plain numbers (pip install "
             "'math-verify>=0.9,<1'; verl users: pip install 'verl[math]'), and without it score them 0 and say so "
             "once on stderr") if kinds & {"math", "format"} else ""
    return (REWARD_HEAD.format(kind=r.kind, version=__version__, vendored=", ".join(VENDORED), needs=needs,
                               verl_manager=VERL_MANAGER_FILE, verl_class=VERL_MANAGER)
            + _vendored("race.tasks.rewards.rules") + answers
            + REWARD_TAIL.format(kind=r.kind, mix=check_mix(r.mix) if r.kind == "mix" else None,
                                 check=float(getattr(r, "check_timeout", 2.0)),
                                 custom=(CUSTOM_FILE, custom_function) if custom_function else None,
                                 end=dict(end or {})))


VERL_MANAGER_TEXT = '''"""The reward manager of this RACE recipe for verl (race recipe --for verl --emit): verl's own naive
reward manager, except that it decodes each response with its special tokens, as RACE's pilots decode
completions. verl's naive manager decodes with skip_special_tokens=True, so the end-of-turn marker is gone
before compute_score sees the text, and a reward that checks termination (RACE's structured and format
rules) cannot tell a finished answer from a cut-off one. Everything else (the response's valid length, the
call to compute_score from race_reward.py, the score and its extra info) is the naive manager's own.

    reward.reward_manager.source=importlib reward.reward_manager.name={cls}
    reward.reward_manager.module.path=THIS_FILE

It runs in verl's environment (it imports verl 0.9.1's naive manager) and nowhere else.
"""
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager


class _DecodeWithSpecialTokens:
    """The policy's tokenizer, except that decode keeps the special tokens (the end-of-turn marker)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def decode(self, token_ids, *args, **kwargs):
        kwargs["skip_special_tokens"] = False
        return self._tokenizer.decode(token_ids, *args, **kwargs)

    def batch_decode(self, sequences, *args, **kwargs):
        kwargs["skip_special_tokens"] = False
        return self._tokenizer.batch_decode(sequences, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


class {cls}(NaiveRewardManager):
    """verl's naive reward manager, decoding responses as RACE's pilots do (special tokens kept)."""

    def __init__(self, config, tokenizer, compute_score, **kwargs):
        super().__init__(config, tokenizer, compute_score, **kwargs)
        self.tokenizer = _DecodeWithSpecialTokens(tokenizer)
'''.format(cls=VERL_MANAGER)


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
        tok = trainer.processing_class
        tok = getattr(tok, "tokenizer", tok)
        race_reward.END_TOKENS.update({i: tok.decode([i], skip_special_tokens=False) for i in trainer.eos_token_ids})
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
    reward_text = reward_module(config, custom_fn, end_tokens(config.model) if trainer == "trl" else None)
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
