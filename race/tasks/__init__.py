"""Tasks: the prompts a pilot trains on and the held-out prompts it is evaluated on.

``load_task`` takes a built-in task name (``TASKS``), a ``.jsonl`` / ``.parquet`` file,
or a Hugging Face dataset name, and returns ``Problem`` rows of one split. Training and
evaluation prompts are disjoint by a hash of the prompt text; evaluation prompts come in
a fixed order that does not depend on ``seed``.

Interface:
- ``load_task``, ``TASKS``, ``judges``: built-in tasks (``arithmetic``, ``steps``, ``wordproblems``) and
  datasets (``datasets``: JSONL / Parquet / Hugging Face rows, GSM8K and MATH forms).
- ``taskdata``: a task's problems in the chat template and within the context; downstream sets of
  ``eval.tasks``; the answer checker pass@k uses.
- ``rewards``: the reward functions a pilot trains on and what they cost.

Invariants: no torch or transformers here; optional libraries load only when a loader needs them.
"""
from __future__ import annotations

from race.tasks.arithmetic import ARITHMETIC_TASKS, ArithmeticTask
from race.tasks.datasets import (DEFAULT_EVAL_FRACTION, Problem, TaskError, apply_chat_template,
                                 is_eval_prompt, load_dataset_problems, load_hf, load_jsonl,
                                 load_parquet, split_problems)

from race.tasks.steps import StepArithmeticTask  # noqa: E402  (column addition worked out in steps)
from race.tasks.wordproblems import WORD_PROBLEM_TASKS, WordProblemTask  # noqa: E402  (GSM8K-style)

TASKS: dict[str, ArithmeticTask | WordProblemTask] = {
    **ARITHMETIC_TASKS,
    "arithmetic-steps": StepArithmeticTask("arithmetic-steps", op="+", lo=0, hi=99),
    **WORD_PROBLEM_TASKS,
}

__all__ = [
    "TASKS", "ArithmeticTask", "Problem", "TaskError", "apply_chat_template", "is_eval_prompt", "judges",
    "load_heldout_set", "load_hf", "load_jsonl", "load_parquet", "load_task", "WordProblemTask",
]


def judges(name_or_path: str) -> dict:
    """Evaluation targets a task adds to the native reward, ``name → fn(prompt, completion,
    reference)``: for ``arithmetic-steps`` the process judge (the step checker's share of
    right steps, ``process``) and the final answer (``final-answer``); none for other tasks."""
    if name_or_path == "arithmetic-steps":
        from race.tasks.steps import final_answer_correct, process_score

        return {"process": process_score, "final-answer": final_answer_correct}
    return {}


def load_heldout_set(name_or_path: str) -> list[Problem]:
    """A downstream held-out set (``eval.tasks``): a built-in task's held-out split, or every row of
    a ``.jsonl`` / ``.parquet`` file or Hugging Face dataset (none of which is trained on)."""
    if name_or_path in TASKS:
        return TASKS[name_or_path].load(split="eval", n=None, seed=0)
    return load_dataset_problems(name_or_path)


def load_task(name_or_path: str, *, split: str = "train", n: int | None = None, seed: int = 0,
              prompt_field: str = "prompt", answer_field: str = "answer",
              eval_fraction: float = DEFAULT_EVAL_FRACTION, hf_split: str = "train") -> list[Problem]:
    """Problems of one split of a task.

    Args:
        name_or_path: a name in ``TASKS`` (``arithmetic-easy``, ``word-problems``, ...), a
            ``.jsonl``/``.json`` or ``.parquet`` file, or a Hugging Face dataset name
            (``"owner/name"`` or ``"owner/name:config"``).
        split: ``"train"`` or ``"eval"`` (the held-out prompts).
        n: how many problems (``None``: the whole split; a built-in sampled task returns
            its default size). More than the split holds is an error.
        seed: shuffles the training split; the evaluation split ignores it.
        prompt_field, answer_field: column names in user datasets.
        eval_fraction: share of distinct prompts held out for evaluation (user datasets;
            built-in tasks hold out 10 %).
        hf_split: which split of a Hugging Face dataset to read before RACE's own split.
    """
    if not isinstance(name_or_path, str) or not name_or_path:
        raise TaskError(f"task {name_or_path!r} must be a built-in task ({', '.join(TASKS)}) or a dataset path")
    if name_or_path in TASKS:
        return TASKS[name_or_path].load(split=split, n=n, seed=seed)
    if name_or_path.startswith("arithmetic"):
        raise TaskError(f"task {name_or_path!r} is unknown: expected one of {', '.join(TASKS)} or a dataset path")
    rows = load_dataset_problems(name_or_path, prompt_field=prompt_field, answer_field=answer_field,
                                 hf_split=hf_split)
    return split_problems(rows, split=split, n=n, seed=seed, eval_fraction=eval_fraction, source=name_or_path)
