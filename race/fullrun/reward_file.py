"""The files a recipe's reward runs from, as text: ``race_reward.py`` and verl's reward manager.

- ``reward_module``: the text of ``race_reward.py`` for a config's reward: RACE's rules and answer checker
  copied in (``VENDORED``; the math checker's worker is the file itself, run as a script), the mix or rule
  the config names, or the user's function (copied beside it as ``CUSTOM_FILE``), under TRL's, verl's and
  OpenRLHF's signatures. For TRL it carries the policy's end-of-turn ids and their text (``end_tokens``,
  read from the model's own tokenizer files), so that ``reward`` puts back the marker TRL decodes away
  when a completion's ids end with one; where the tokenizer is not on the emitting machine (a Hub id
  outside its cache), ``reward`` reads them at its first call from the tokenizer of ``MODEL`` (the policy
  as the trainer loads it) with the trainer's transformers, and stops in one line if it cannot.
- ``VERL_MANAGER_TEXT``: ``race_verl_reward.py``, verl 0.9.1's naive reward manager decoding responses with
  their special tokens kept, as RACE's pilots decode completions (``VERL_MANAGER`` the class it defines).

Invariants: the texts import no RACE code (they run in the trainer's environment, without RACE); this
module reads files and writes none (race.fullrun.emit writes them); it imports neither torch nor
transformers (the import contracts: race.fullrun.recipes reaches it through race.fullrun.emit).
"""
from __future__ import annotations

import json
import os
from typing import Any

from race.config.configfile import GridConfig
from race.core.errors import RaceError

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
END_TOKENS, the policy's end-of-turn ids taken from its tokenizer at emit time or, when it was not on that
machine, from MODEL's tokenizer where the trainer loaded it, at the first call (transformers); verl's naive reward
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
# each with its text as RACE's pilots decode it (special tokens kept); empty: the tokenizer was not found at
# emit time, and reward reads them from MODEL's tokenizer (the policy as the trainer loads it) at its first call
MODEL = {model!r}
END_TOKENS = {end!r}
_END_READ = bool(END_TOKENS)


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


def use_tokenizer(tokenizer, end_ids):
    """END_TOKENS from a tokenizer and the ids that end a completion (train_trl.py: GRPOTrainer's own
    processing_class and eos_token_ids), each id with its text, special tokens kept."""
    global _END_READ
    tok = getattr(tokenizer, "tokenizer", tokenizer)       # a processor: its tokenizer
    END_TOKENS.update({{int(i): tok.decode([int(i)], skip_special_tokens=False) for i in end_ids if i is not None}})
    _END_READ = True


def _end_tokens():
    """END_TOKENS as emitted, or, when they were not known at emit time, MODEL's end ids as TRL 1.16's
    GRPOTrainer takes them (the generation config's eos_token_id, the tokenizer's EOS first), read once
    with transformers from where the trainer loaded the policy (its folder, or the local cache: the
    trainer has downloaded it before the first reward); a one-line RuntimeError when it cannot be loaded."""
    if _END_READ:
        return END_TOKENS
    try:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        tok = AutoTokenizer.from_pretrained(MODEL)
        try:
            gen = GenerationConfig.from_pretrained(MODEL)
        except OSError:                   # no generation_config.json: the model config's, as from_pretrained does
            gen = GenerationConfig.from_model_config(AutoConfig.from_pretrained(MODEL))
    except Exception as e:  # noqa: BLE001 — said in one line: scoring without the marker would differ from RACE
        why = (str(e).strip().splitlines() or [""])[0]
        raise RuntimeError(f"race_reward.py: the end-of-turn ids of {{MODEL!r}} were not known at emit time and its "
                           f"tokenizer cannot be loaded here ({{type(e).__name__}}: {{why}}): run where the trainer "
                           "loads the policy, or call race_reward.use_tokenizer(tokenizer, end_ids) first") from None
    ids = gen.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    use_tokenizer(tok, ids if tok.eos_token_id in ids else [tok.eos_token_id, *ids])
    return END_TOKENS


def _as_decoded(text, ids):
    """A completion's text as RACE's pilots decode it. TRL decodes with skip_special_tokens, which drops
    the end-of-turn marker; its completion_ids run to the first end id, inclusive, so a finished completion's
    ids end with one of END_TOKENS, and its marker goes back after the text (a cut-off one's ids do not)."""
    try:
        last = int(ids[-1]) if ids is not None and len(ids) else None
    except (TypeError, ValueError, IndexError):
        return text
    if last is None:
        return text
    marker = _end_tokens().get(last)
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
                  end: dict[int, str] | None = None, model: str | None = None) -> str:
    """The text of ``race_reward.py`` for ``config``'s reward: RACE's rules and answer checker copied
    in, the mix or rule the config names, or the user's function (``custom_function``, the name in
    the copy beside it, ``CUSTOM_FILE``), under TRL's, verl's and OpenRLHF's signatures. ``end``: the
    policy's end-of-turn ids and their text (``end_tokens``), with which TRL's ``reward`` puts back the
    marker TRL decodes away; ``model``: the policy as the trainer loads it (race.fullrun.emit.model_location,
    default ``config.model``), whose tokenizer ``reward`` reads them from at its first call when ``end`` is
    empty."""
    from race.tasks.rewards.mix import check_mix
    from race.core.version import __version__

    r = config.reward
    answers = _vendored("race.tasks.rewards.answers")
    if _WORKER_CMD not in answers:      # the checker's worker must be this file, not an import of race
        raise RaceError("race.tasks.rewards.answers no longer starts its worker as race_reward.py expects: "
                        "update race.fullrun.reward_file.reward_module")
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
                                 model=model or config.model, end=dict(end or {})))


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
