"""Problems, the held-out split, and loaders for user datasets (JSONL, Parquet, HF).

A *problem* is a prompt and its reference answer. Every loader returns the whole
dataset as ``Problem`` rows; ``split_problems`` then keeps the held-out evaluation
prompts apart from the training prompts by a hash of the prompt text, so:

- the split is deterministic (no seed, no file order involved);
- a prompt that occurs twice lands on the same side both times, so no evaluation
  prompt is ever trained on;
- adding rows to a dataset never moves an existing prompt across the split.

Heavy or optional libraries (``pyarrow``, ``datasets``) are imported inside the
functions that need them; each missing piece is a one-line ``TaskError``.

Rows are ``{"prompt": ..., "answer": ...}`` (or the configured fields). When the fields are the
defaults and a row has no ``prompt``, the two common worked-solution formats are read too
(``WORKED_FORMATS``): GSM8K (``question``, and ``answer`` a worked solution ending ``#### N``:
the answer is ``N``) and MATH / MATH-500 (``problem``, ``solution`` ending in ``\\boxed{...}``,
optional ``answer``: the answer is that column, else the boxed content). The worked solution is
kept in ``meta["solution"]`` (and the format in ``meta["format"]``); a row in neither format
keeps the missing-field error.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence
from race.core.errors import RaceError
from race.core.safeio import UnsafeInput, loads_json

DEFAULT_EVAL_FRACTION = 0.1
SPLITS = ("train", "eval")


class TaskError(RaceError):
    """A bad task or dataset; the message is one line and names the bad value."""


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    ``id`` is stable for a given task or file (the enumeration index of a built-in
    problem, the row index of a dataset), independent of the seed and of the split.
    ``meta`` holds optional extras (e.g. the prompt before a chat template); it takes
    no part in equality or hashing.
    """

    prompt: str
    answer: str
    id: int
    meta: dict[str, Any] | None = field(default=None, compare=False)


def eval_bucket(prompt: str) -> float:
    """A uniform number in [0, 1) fixed by the prompt text (first 8 bytes of its SHA-256)."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def is_eval_prompt(prompt: str, eval_fraction: float = DEFAULT_EVAL_FRACTION) -> bool:
    """True when ``prompt`` belongs to the held-out evaluation split."""
    return eval_bucket(prompt) < eval_fraction


def check_split(split: str, eval_fraction: float) -> None:
    if split not in SPLITS:
        raise TaskError(f"split {split!r} is unknown: expected 'train' or 'eval'")
    if not 0.0 < eval_fraction < 1.0:
        raise TaskError(f"eval_fraction {eval_fraction!r} must lie in (0, 1)")


def take(problems: list[Problem], n: int | None, what: str) -> list[Problem]:
    """The first ``n`` problems (all when ``n`` is None); an error if there are fewer."""
    if n is None:
        return problems
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TaskError(f"n {n!r} must be a positive integer or None")
    if n > len(problems):
        raise TaskError(f"n ({n}) exceeds the {len(problems)} problems in {what}")
    return problems[:n]


def split_problems(problems: Sequence[Problem], *, split: str = "train", n: int | None = None,
                   seed: int = 0, eval_fraction: float = DEFAULT_EVAL_FRACTION,
                   source: str = "dataset") -> list[Problem]:
    """Keep one side of the hash split, ordered, and cut to ``n``.

    ``train`` rows are shuffled by ``seed``. ``eval`` rows keep a fixed order (by
    hash bucket) that ignores ``seed``: every pilot evaluates the same prompts in the
    same order, so scores can be compared prompt by prompt.
    """
    check_split(split, eval_fraction)
    want_eval = split == "eval"
    rows = [p for p in problems if is_eval_prompt(p.prompt, eval_fraction) == want_eval]
    what = f"the {split} split of {source} (eval_fraction={eval_fraction:g})"
    if not rows:
        raise TaskError(f"{what} is empty: {len(problems)} problems in all; "
                        f"expected at least one (change eval_fraction or add data)")
    if want_eval:
        rows.sort(key=lambda p: (eval_bucket(p.prompt), p.id))
    else:
        random.Random(seed).shuffle(rows)
    return take(rows, n, what)


# ------------------------------------------------------------------------------ loaders

WORKED_FORMATS = {"gsm8k": ("question", "answer"), "math": ("problem", "solution")}   # format → its fields


def _worked_format(fields: Iterable[str], prompt_field: str, answer_field: str) -> str | None:
    """The worked-solution format (``WORKED_FORMATS``) of a row or table with these fields, when
    the configured fields are the defaults and ``prompt`` is absent; else None."""
    names = set(fields)
    if (prompt_field, answer_field) != ("prompt", "answer") or "prompt" in names:
        return None
    return next((fmt for fmt, need in WORKED_FORMATS.items() if set(need) <= names), None)


def _worked_problem(row: dict, fmt: str, index: int, where: str) -> Problem | None:
    """A GSM8K or MATH row as a ``Problem`` (module docstring); None for a GSM8K-like row whose
    ``answer`` has no ``####`` (not a worked solution: the missing-field error stands)."""
    prompt_field, solution_field = WORKED_FORMATS[fmt]
    solution = row[solution_field]
    if fmt == "gsm8k" and not (isinstance(solution, str) and "####" in solution):
        return None
    prompt = row[prompt_field]
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskError(f"{where}: field {prompt_field!r} is {_kind(prompt)}: expected a non-empty string")
    if not isinstance(solution, str) or not solution.strip():
        raise TaskError(f"{where}: field {solution_field!r} is {_kind(solution)}: expected a worked solution (a string)")
    if fmt == "gsm8k":
        answer: Any = solution.rpartition("####")[2].strip().split("\n")[0].strip()
        if not answer:
            raise TaskError(f"{where}: field 'answer' has nothing after its last '####': expected a GSM8K "
                            "solution ending '#### N'")
    elif row.get("answer") is not None and str(row["answer"]).strip():
        answer = row["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) \
                or (isinstance(answer, float) and not math.isfinite(answer)):
            raise TaskError(f"{where}: field 'answer' is {_kind(answer)}: expected a string or a number")
    else:
        from race.tasks.rewards.answers import extract_answer

        answer = extract_answer(solution)
        if not answer:
            raise TaskError(f"{where}: field 'solution' has no \\boxed{{...}} final answer and the row no 'answer': "
                            "expected a MATH-style solution ending in \\boxed{ANSWER}")
    return Problem(prompt=prompt, answer=str(answer).strip(), id=index,
                   meta={"solution": solution, "format": fmt})


def _problem(row: Any, index: int, prompt_field: str, answer_field: str, where: str) -> Problem:
    if not isinstance(row, dict):
        raise TaskError(f"{where}: expected a JSON object with {prompt_field!r} and {answer_field!r}, "
                        f"got {type(row).__name__}")
    fmt = _worked_format(row, prompt_field, answer_field)
    worked = _worked_problem(row, fmt, index, where) if fmt else None
    if worked is not None:
        return worked
    for name in (prompt_field, answer_field):
        if name not in row:
            gsm8k = " or, for a GSM8K row, an 'answer' ending '#### N'" if fmt == "gsm8k" else ""
            raise TaskError(f"{where}: field {name!r} is missing{gsm8k} (fields: {', '.join(map(str, row)) or 'none'})")
        if row[name] is None:
            raise TaskError(f"{where}: field {name!r} is null: expected a string")
    prompt, answer = row[prompt_field], row[answer_field]
    if not isinstance(prompt, str) or not prompt.strip():
        raise TaskError(f"{where}: field {prompt_field!r} is {_kind(prompt)}: expected a non-empty string")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) \
            or (isinstance(answer, float) and not math.isfinite(answer)) or not str(answer).strip():
        raise TaskError(f"{where}: field {answer_field!r} is {_kind(answer)}: expected a string or a number")
    return Problem(prompt=prompt, answer=str(answer).strip(), id=index)


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return "an empty string" if not value.strip() else repr(value)[:40]
    if isinstance(value, (list, dict, bool)):
        return f"a {type(value).__name__} ({json.dumps(value)[:40]})"
    return repr(value)[:40]


def check_unique_answers(problems: list[Problem], where: Callable[[int], str]) -> list[Problem]:
    """Refuse a prompt that appears with two different answers (``where(id)`` names a row)."""
    seen: dict[str, Problem] = {}
    for p in problems:
        first = seen.setdefault(p.prompt, p)
        if first.answer != p.answer:
            raise TaskError(f"{where(p.id)}: prompt {p.prompt[:40]!r} has answer {p.answer!r}, but {where(first.id)} "
                            f"gives it {first.answer!r}: one prompt, one reference answer")
    return problems


def drop_overlong(problems: list[Problem], prompt_tokens: list[int], limit: int) -> tuple[list[Problem], list[Problem]]:
    """(problems whose prompt has at most ``limit`` tokens, those dropped), order kept; ``prompt_tokens``:
    each problem's prompt length in tokens, in the same order."""
    kept, dropped = [], []
    for p, n in zip(problems, prompt_tokens, strict=True):
        (kept if n <= limit else dropped).append(p)
    return kept, dropped


# a dataset file larger than this is refused before it is read: every loader holds all its rows in
# memory, and pilots use a few thousand problems (a 1 GiB JSONL file holds millions)
MAX_DATASET_BYTES = 1 << 30


def _existing_file(path: str) -> None:
    """A regular file of at most ``MAX_DATASET_BYTES``, or a one-line ``TaskError`` saying what it is."""
    import stat

    from race.core.safeio import quote

    try:
        st = os.stat(path)
    except OSError as e:
        why = "does not exist" if isinstance(e, FileNotFoundError) else f"cannot be read ({e.strerror or e})"
        raise TaskError(f"dataset file {quote(path, 120)} {why}: expected a readable .jsonl or .parquet file") from None
    if not stat.S_ISREG(st.st_mode):
        m = st.st_mode
        kind = ("a folder" if stat.S_ISDIR(m) else "a character device" if stat.S_ISCHR(m)
                else "a block device" if stat.S_ISBLK(m) else "a FIFO (named pipe)" if stat.S_ISFIFO(m)
                else "a socket" if stat.S_ISSOCK(m) else "not a regular file")
        endless = "" if stat.S_ISDIR(st.st_mode) else " (a pipe or a device is never read: it could be endless)"
        raise TaskError(f"dataset file {quote(path, 120)} is {kind}, not a regular file: expected a .jsonl or .parquet "
                        f"file{endless}")
    if st.st_size > MAX_DATASET_BYTES:
        raise TaskError(f"dataset file {quote(path, 120)} is {st.st_size / 2**30:.2f} GiB, over RACE's limit of "
                        f"{MAX_DATASET_BYTES / 2**30:g} GiB (every row is held in memory): pilots use a few thousand "
                        "problems, so give a random subsample of it (e.g. shuf -n 100000 FILE > sample.jsonl)")


def load_jsonl(path: str, *, prompt_field: str = "prompt", answer_field: str = "answer") -> list[Problem]:
    """All rows of a JSON-lines file, one ``{"prompt": ..., "answer": ...}`` object a line (or a
    GSM8K / MATH row: module docstring).

    Blank lines are skipped; ``id`` is the 0-based index among the non-blank rows.
    Errors name the file and the 1-based line number.
    """
    _existing_file(path)
    out: list[Problem] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path} line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TaskError(f"{where}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}): "
                                "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = loads_json(line, what=where)          # nesting, 400-digit integers, repeated keys: one line
            except UnsafeInput as e:
                raise TaskError(str(e)) from None
            except json.JSONDecodeError as e:
                raise TaskError(f"{where}: invalid JSON ({e.msg}): expected one JSON object a line") from None
            out.append(_problem(row, len(out), prompt_field, answer_field, where))
            lines.append(lineno)
    if not out:
        raise TaskError(f"dataset file {path!r} is empty: expected one JSON object a line")
    return check_unique_answers(out, lambda i: f"{path} line {lines[i]}")


def _rows(rows: Iterable[dict], source: str, prompt_field: str, answer_field: str) -> list[Problem]:
    out = [_problem(row, i, prompt_field, answer_field, f"{source} row {i}") for i, row in enumerate(rows)]
    if not out:
        raise TaskError(f"dataset {source!r} is empty: expected at least one row")
    return check_unique_answers(out, lambda i: f"{source} row {i}")


def load_parquet(path: str, *, prompt_field: str = "prompt", answer_field: str = "answer") -> list[Problem]:
    """All rows of a Parquet file (needs ``pyarrow``)."""
    _existing_file(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(f"reading {path!r} needs pyarrow: pip install pyarrow") from None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as e:       # pyarrow.ArrowInvalid is a ValueError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TaskError(f"dataset file {path!r} is not a readable Parquet file: {first[:200]}") from None
    fmt = _worked_format(table.column_names, prompt_field, answer_field)
    if fmt:
        wanted = [*WORKED_FORMATS[fmt], *(["answer"] if fmt == "math" and "answer" in table.column_names else [])]
        return _rows(table.select(wanted).to_pylist(), path, prompt_field, answer_field)
    missing = [f for f in (prompt_field, answer_field) if f not in table.column_names]
    if missing:
        raise TaskError(f"{path}: field {missing[0]!r} is missing (columns: {', '.join(table.column_names)})")
    return _rows(table.select([prompt_field, answer_field]).to_pylist(), path, prompt_field, answer_field)


def load_hf(name: str, *, hf_split: str = "train", prompt_field: str = "prompt",
            answer_field: str = "answer") -> list[Problem]:
    """All rows of one split of a Hugging Face dataset (needs ``datasets`` and the hub or its cache).

    ``name`` may carry a configuration after a colon: ``"openai/gsm8k:main"``.
    """
    repo, _, config = name.partition(":")
    try:
        import datasets
    except ImportError:
        raise TaskError(f"task {name!r} is not a built-in task or a file; loading it as a Hugging Face "
                        f"dataset needs the datasets package: pip install datasets") from None
    try:
        ds = datasets.load_dataset(repo, config or None, split=hf_split)
    except Exception as e:  # the hub raises many types (network, missing repo, missing split)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TaskError(f"could not load Hugging Face dataset {name!r} (split {hf_split!r}): {msg}; "
                        f"expected a reachable hub or a cached dataset") from None
    cols = list(getattr(ds, "column_names", None) or [])
    missing = [f for f in (prompt_field, answer_field) if cols and f not in cols]
    if missing and not _worked_format(cols, prompt_field, answer_field):
        raise TaskError(f"Hugging Face dataset {name!r}: field {missing[0]!r} is missing "
                        f"(columns: {', '.join(cols)})")
    return _rows(ds, name, prompt_field, answer_field)


def load_dataset_problems(name_or_path: str, *, prompt_field: str = "prompt", answer_field: str = "answer",
                          hf_split: str = "train") -> list[Problem]:
    """Dispatch on the name: ``.jsonl``/``.json`` → JSONL, ``.parquet`` → Parquet, else HF dataset."""
    lower = name_or_path.lower()
    kw = {"prompt_field": prompt_field, "answer_field": answer_field}
    if lower.endswith((".jsonl", ".json")):
        return load_jsonl(name_or_path, **kw)
    if lower.endswith((".parquet", ".pq")):
        return load_parquet(name_or_path, **kw)
    if os.path.exists(name_or_path):
        _existing_file(name_or_path)          # a FIFO, a device or a folder says so first
        raise TaskError(f"dataset {name_or_path!r} has an unknown format: expected a .jsonl or .parquet file")
    return load_hf(name_or_path, hf_split=hf_split, **kw)


# ------------------------------------------------------------------------ chat template

def apply_chat_template(problems: Sequence[Problem], tokenizer: Any, system: str | None = None) -> list[Problem]:
    """Wrap each prompt in the tokenizer's chat template (as a user turn, generation prompt added).

    A tokenizer without a template (such as the tiny policy's) leaves the problems
    unchanged. The prompt before templating is kept in ``meta["raw_prompt"]``.
    """
    if not getattr(tokenizer, "chat_template", None):
        return list(problems)
    out = []
    for p in problems:
        messages = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": p.prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(replace(p, prompt=text, meta={**(p.meta or {}), "raw_prompt": p.prompt}))
    return out
