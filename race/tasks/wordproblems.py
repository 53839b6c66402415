"""Multi-step arithmetic word problems with worked solutions (GSM8K- and MATH-500-style).

A problem follows one quantity of items owned by one person through a chain of events:
it starts at a number (or at ``a`` groups of ``b``), then things are bought, found, given
away, multiplied or split into equal parts, and the question asks how many are left::

    Mia has 4 bags with 6 shells in each. She gives 5 shells to Omar.
    How many shells does Mia have now?

The worked solution writes one line per step, each with its equation, and ends with the
final answer in the format of the split (``GSM8K``: ``#### N``; ``MATH``: ``\\boxed{N}``)::

    Mia starts with 4 * 6 = 24 shells.
    She gives away 5, so she has 24 - 5 = 19 shells.
    #### 19

Invariants:

- *Deterministic*: problem ``i`` of a task is drawn from ``random.Random(f"{task}|{i}")``
  alone; no global state, no seed other than the task's name and the index.
- *Exact*: every intermediate value and the answer are integers in ``0..max_value``;
  subtractions never go below 1, divisions are exact, and the answer is
  ``Problem.answer`` (a decimal string). ``meta["solution"]`` is the worked solution in
  the task's format, ``meta["steps"]`` the number of equations.
- *Splits*: ``train`` and ``eval`` of one task are disjoint by the prompt hash
  (``race.tasks.datasets.is_eval_prompt``); a prompt that two indices happen to share is
  kept once. The ``downstream`` style (``word-problems-downstream``) uses phrasings no
  training style uses (``shifted``), more steps and the MATH format, so none of its prompts
  can occur in a training split.

Writers: ``write_gsm8k`` (``question``, ``answer`` = worked lines + ``#### N``) and
``write_math`` (``problem``, ``solution`` ending in ``\\boxed{N}``, ``answer``). Pure Python,
no torch.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from race.tasks.datasets import Problem, TaskError, check_split, eval_bucket, is_eval_prompt, take

FORMATS = ("gsm8k", "math")
STYLES = ("train", "shifted")

# (name, subject pronoun, object pronoun, possessive)
PEOPLE = [
    ("Mia", "she", "her", "her"), ("Tom", "he", "him", "his"), ("Ava", "she", "her", "her"),
    ("Sam", "he", "him", "his"), ("Lily", "she", "her", "her"), ("Omar", "he", "him", "his"),
    ("Nora", "she", "her", "her"), ("Ben", "he", "him", "his"), ("Zoe", "she", "her", "her"),
    ("Leo", "he", "him", "his"), ("Emma", "she", "her", "her"), ("Ravi", "he", "him", "his"),
    ("Jade", "she", "her", "her"), ("Noah", "he", "him", "his"), ("Ella", "she", "her", "her"),
    ("Max", "he", "him", "his"), ("Ruth", "she", "her", "her"), ("Ivan", "he", "him", "his"),
]
# (item, container for "a groups of b")
ITEMS = [
    ("apples", "bags"), ("shells", "buckets"), ("stickers", "sheets"), ("marbles", "jars"),
    ("pencils", "boxes"), ("cookies", "trays"), ("books", "shelves"), ("cards", "packs"),
    ("stamps", "albums"), ("eggs", "cartons"), ("beads", "strings"), ("coins", "purses"),
    ("flowers", "pots"), ("toy cars", "boxes"), ("oranges", "crates"), ("candies", "bowls"),
]

# Event phrasings by style and operation. Fields: {Name} {pro} {Pro} {obj} {poss} {Poss}
# {other} {items} {n}; "mul" uses {n} as the factor, "div" as the number of parts.
PHRASES: dict[str, dict[str, list[str]]] = {
    "train": {
        "start": ["{Name} has {n} {items}.", "{Name} starts the day with {n} {items}.",
                  "There are {n} {items} in {Name}'s room."],
        "start_mul": ["{Name} has {a} {box} with {b} {items} in each.",
                      "{Name} buys {a} {box} of {items}, and each one holds {b} {items}."],
        "add": ["{Pro} buys {n} more {items}.", "Then {pro} finds {n} more {items}.",
                "{other} gives {obj} {n} {items}.", "Later {pro} picks up {n} more {items}."],
        "sub": ["{Pro} gives {n} {items} to {other}.", "{Pro} loses {n} of the {items}.",
                "{Pro} sells {n} {items} at the market.", "Then {pro} uses {n} of the {items}."],
        "mul": ["Then {pro} ends up with {n} times as many {items} as before.",
                "Each of {poss} {items} is swapped for {n} new ones."],
        "div": ["{Pro} splits the {items} into {n} equal groups and keeps one group.",
                "{Pro} shares the {items} equally with friends so that {n} people get the same, "
                "and keeps one share."],
        "ask": ["How many {items} does {Name} have now?", "How many {items} does {Name} have at the end?",
                "How many {items} are left with {Name}?"],
    },
    "shifted": {
        "start": ["At first, {Name} owns {n} {items}.", "{Name}'s collection holds {n} {items}."],
        "start_mul": ["{Name} fills {a} {box}, putting {b} {items} into every one of them."],
        "add": ["Next, {Name} receives {n} extra {items} as a gift.", "A neighbour adds {n} {items} to the pile."],
        "sub": ["{Name} donates {n} {items} to a school.", "On the way home, {n} {items} go missing."],
        "mul": ["After a good week the pile is {n} times as big as it was."],
        "div": ["The {items} are packed evenly into {n} boxes, and only one box stays with {Name}."],
        "ask": ["What is the number of {items} that {Name} has in the end?",
                "Counting carefully, how many {items} remain?"],
    },
}

# One solution line per operation (the same in every style: the work is what is learnt).
WORK = {
    "start": "{Name} starts with {n} {items}.",
    "start_mul": "{Name} starts with {a} * {b} = {y} {items}.",
    "add": "{Pro} gets {n} more, so {pro} has {x} + {n} = {y} {items}.",
    "sub": "{Pro} gives away {n}, so {pro} has {x} - {n} = {y} {items}.",
    "mul": "That is {n} times as many, so {pro} has {x} * {n} = {y} {items}.",
    "div": "One of {n} equal parts is {x} / {n} = {y} {items}.",
}


def gsm8k_solution(work: str, answer: str) -> str:
    """GSM8K's answer field: the worked lines, then ``#### N`` on its own line."""
    return f"{work}\n#### {answer}"


def math_solution(work: str, answer: str) -> str:
    """A MATH-500-style solution: the worked lines, then a sentence ending in ``\\boxed{N}``."""
    return f"{work}\nThe final answer is \\boxed{{{answer}}}"


@dataclass(frozen=True)
class WordProblemTask:
    """A family of word problems: ``min_steps..max_steps`` equations, operands up to
    ``max_operand``, every value at most ``max_value``, phrasings of ``style``, worked
    solutions in ``answer_format``; ``size`` problems (indices ``0..size-1``) split by hash."""

    name: str
    min_steps: int = 1
    max_steps: int = 2
    max_operand: int = 20
    max_value: int = 100
    style: str = "train"
    answer_format: str = "gsm8k"
    size: int = 20_000
    eval_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps or self.max_operand < 2 or self.max_value < 2 * self.max_operand \
                or self.style not in STYLES or self.answer_format not in FORMATS or self.size < 10:
            raise TaskError(f"word-problem task {self.name!r}: steps {self.min_steps}..{self.max_steps}, operand "
                            f"{self.max_operand}, value {self.max_value}, style {self.style!r}, format "
                            f"{self.answer_format!r}, size {self.size} invalid")

    def problem(self, i: int) -> Problem:
        """Problem ``i`` (``id = i``), from its own generator."""
        rng = random.Random(f"{self.name}|{i}")
        steps = rng.randint(self.min_steps, self.max_steps)
        question, work, answer = compose(rng, steps, style=self.style, max_operand=self.max_operand,
                                         max_value=self.max_value)
        fmt = gsm8k_solution if self.answer_format == "gsm8k" else math_solution
        return Problem(prompt=question, answer=str(answer), id=i,
                       meta={"solution": fmt(work, str(answer)), "work": work, "steps": steps,
                             "format": self.answer_format})

    def load(self, *, split: str = "train", n: int | None = None, seed: int = 0) -> list[Problem]:
        """``n`` problems of one split (train: shuffled by ``seed``; eval: fixed order by hash)."""
        check_split(split, self.eval_fraction)
        rows = list(_split_rows(self, split == "eval"))
        if split == "train":
            random.Random(seed).shuffle(rows)
        return take(rows, n, f"the {split} split of {self.name}")


@lru_cache(maxsize=16)
def _split_rows(task: WordProblemTask, want_eval: bool) -> tuple[Problem, ...]:
    seen: set[str] = set()
    rows = []
    for i in range(task.size):
        p = task.problem(i)
        if p.prompt in seen or is_eval_prompt(p.prompt, task.eval_fraction) != want_eval:
            continue
        seen.add(p.prompt)
        rows.append(p)
    if want_eval:
        rows.sort(key=lambda p: (eval_bucket(p.prompt), p.id))
    return tuple(rows)


def _fields(person: tuple[str, str, str, str], other: str, item: tuple[str, str]) -> dict[str, str]:
    name, pro, obj, poss = person
    return {"Name": name, "pro": pro, "Pro": pro.capitalize(), "obj": obj, "poss": poss,
            "Poss": poss.capitalize(), "other": other, "items": item[0], "box": item[1]}


def _event(rng: random.Random, x: int, max_operand: int, max_value: int) -> tuple[str, int, int]:
    """(operation, operand, new value) of one event on ``x`` (1 <= x <= max_value - 2 or x >= 3,
    which always holds: some event always fits)."""
    options = []
    if x + 2 <= max_value:
        options.append("add")
    if x >= 3:
        options.append("sub")
    if 2 * x <= max_value and x <= max_operand:
        options.append("mul")
    if any(x % d == 0 for d in range(2, 6)) and x >= 4:
        options.append("div")
    op = rng.choice(options)
    if op == "add":
        n = rng.randint(2, min(max_operand, max_value - x))
        return op, n, x + n
    if op == "sub":
        n = rng.randint(2, min(max_operand, x - 1))      # never "1 apples", never below 1
        return op, n, x - n
    if op == "mul":
        n = rng.randint(2, min(5, max_value // x))
        return op, n, x * n
    n = rng.choice([d for d in range(2, 6) if x % d == 0])
    return op, n, x // n


def compose(rng: random.Random, steps: int, *, style: str, max_operand: int, max_value: int) -> tuple[str, str, int]:
    """(question, worked lines, answer) of a problem with ``steps`` equations."""
    phrases = PHRASES[style]
    person = rng.choice(PEOPLE)
    other = rng.choice([p[0] for p in PEOPLE if p[0] != person[0]])
    f = _fields(person, other, rng.choice(ITEMS))
    sentences, work = [], []
    if rng.random() < 0.4:                      # a groups of b: the first equation
        a, b = rng.randint(2, 6), rng.randint(2, min(12, max_value // 6))
        x = a * b
        sentences.append(rng.choice(phrases["start_mul"]).format(a=a, b=b, **f))
        work.append(WORK["start_mul"].format(a=a, b=b, y=x, **f))
        events = steps - 1
    else:
        x = rng.randint(4, max_operand)
        sentences.append(rng.choice(phrases["start"]).format(n=x, **f))
        work.append(WORK["start"].format(n=x, **f))
        events = steps
    for _ in range(events):
        op, n, y = _event(rng, x, max_operand, max_value)
        sentences.append(rng.choice(phrases[op]).format(n=n, **f))
        work.append(WORK[op].format(n=n, x=x, y=y, **f))
        x = y
    sentences.append(rng.choice(phrases["ask"]).format(**f))
    return " ".join(sentences), "\n".join(work), x


# ------------------------------------------------------------------------------ writers

def _write(path: str, rows: Iterable[dict]) -> int:
    from race.core.safeio import write_inside

    lines = [json.dumps(row, ensure_ascii=False) + "\n" for row in rows]
    write_inside(os.path.dirname(os.path.abspath(path)), os.path.basename(path), "".join(lines), what="task file")
    return len(lines)


def write_gsm8k(problems: Iterable[Problem], path: str) -> int:
    """GSM8K-style JSONL: ``{"question", "answer"}`` with ``answer`` = worked lines + ``#### N``.
    Returns the number of rows written."""
    return _write(path, ({"question": p.prompt, "answer": gsm8k_solution(p.meta["work"], p.answer)}
                         for p in problems))


def write_math(problems: Iterable[Problem], path: str) -> int:
    """MATH-500-style JSONL: ``{"problem", "solution", "answer"}``, the solution ending in
    ``\\boxed{N}``. Returns the number of rows written."""
    return _write(path, ({"problem": p.prompt, "solution": math_solution(p.meta["work"], p.answer),
                          "answer": p.answer} for p in problems))


WORD_PROBLEM_TASKS: dict[str, WordProblemTask] = {
    "word-problems": WordProblemTask("word-problems", min_steps=2, max_steps=3, max_operand=20, max_value=100),
    "word-problems-hard": WordProblemTask("word-problems-hard", min_steps=4, max_steps=5, max_operand=30,
                                          max_value=200),
    "word-problems-downstream": WordProblemTask("word-problems-downstream", min_steps=4, max_steps=6,
                                                max_operand=20, max_value=100, style="shifted",
                                                answer_format="math", size=10_000),
    # near transfer: the training phrasings, one step more than any easy problem, MATH-style solutions
    # (the shifted set above is far transfer: the tiny reasoner starts near 1 % there, 14 % here)
    "word-problems-longer": WordProblemTask("word-problems-longer", min_steps=4, max_steps=4, max_operand=20,
                                            max_value=100, answer_format="math", size=10_000),
}
