"""The rewards for worked solutions (race.tasks.rewards.answers, race.tasks.rewards.mix): final-answer
extraction, the ``math`` reward's equivalences and refusals, the ``format`` reward, weighted
``mix`` rewards, the checker's time limit and safety, GSM8K / MATH rows in user datasets, and
``answer_checker``."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

from race.tasks.rewards import REWARDS, RULE_REWARDS, answer_checker, build_reward, checker_for, extract_answer, \
    get_reward, mix_reward, score_completions
from race.tasks.rewards import answers as A
from race.tasks.rewards.base import RewardError

# (completion, reference, math reward): equivalent and malformed answers
MATH_CASES = [
    # forms of the final answer
    ("So the total is \\boxed{18}.</s>", "18", 1.0),
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72</s>", "72", 1.0),
    ("She pays 5 + 3 = 8 dollars.\nThe answer is 8.</s>", "8", 1.0),
    ("Therefore, the final answer is: $8$. I hope it is correct.<|im_end|>", "8", 1.0),
    ("Answer: 8", "8", 1.0),
    ("answer: -7</s>", "-7", 1.0),
    ("\\fbox{42}<|eot_id|>", "42", 1.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}</s>", "\\frac{\\sqrt{3}}{2}", 1.0),                  # nested braces
    ("\\boxed{\\boxed{5}}</s>", "5", 1.0),                                               # a box in a box
    ("First \\boxed{3}, no wait: \\boxed{4}.</s>", "4", 1.0),                           # two boxes: the last wins
    ("First \\boxed{3}, no wait: \\boxed{4}.</s>", "3", 0.0),
    ("#### 5\nThe answer is 6</s>", "5", 1.0),                                           # #### before "answer is"
    # references in their own forms
    ("\\boxed{18}</s>", "Step one.\n#### 18", 1.0),
    ("#### 18</s>", "\\boxed{18}", 1.0),
    ("\\boxed{18}</s>", "18.0", 1.0),
    ("\\boxed{18.0}</s>", "18", 1.0),
    # fractions and decimals
    ("\\boxed{1/2}</s>", "0.5", 1.0),
    ("\\boxed{0.5}</s>", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{1}{2}}</s>", "1/2", 1.0),
    ("\\boxed{\\tfrac{3}{4}}</s>", "0.75", 1.0),
    ("\\boxed{-\\frac{1}{2}}</s>", "-0.5", 1.0),
    ("\\boxed{0.333333}</s>", "\\frac{1}{3}", 1.0),                                      # 6 places, as math-verify
    ("\\boxed{0.33}</s>", "\\frac{1}{3}", 0.0),
    ("\\boxed{\\frac{2}{4}}</s>", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}</s>", "\\frac{1}{\\sqrt{2}}", 1.0),                  # math-verify, symbolic
    # thousands separators, units, currency, percent
    ("#### 1,234</s>", "1234", 1.0),
    ("\\boxed{1{,}234}</s>", "1234", 1.0),
    ("\\boxed{1234}</s>", "1,234", 1.0),
    ("The answer is 12 apples.</s>", "12", 1.0),
    ("\\boxed{12 \\text{ dollars}}</s>", "12", 1.0),
    ("\\boxed{12}</s>", "12 apples", 1.0),
    ("The answer is $5.</s>", "5", 1.0),
    ("\\boxed{\\$5}</s>", "$5", 1.0),
    ("\\boxed{5}</s>", "$5", 1.0),
    ("\\boxed{50\\%}</s>", "50", 1.0),
    ("\\boxed{90^\\circ}</s>", "90", 1.0),
    # negative numbers and wrong answers
    ("\\boxed{-3}</s>", "-3", 1.0),
    ("\\boxed{-3}</s>", "3", 0.0),
    ("\\boxed{17}</s>", "18", 0.0),
    ("#### 1,235</s>", "1234", 0.0),
    # EOS and what follows it
    ("\\boxed{7}</s> \\boxed{8}", "7", 1.0),                                             # garbage after EOS ignored
    ("\\boxed{7}</s> \\boxed{8}", "8", 0.0),
    ("#### 7<|im_end|>\n#### 8", "7", 1.0),
    ("\\boxed{7}", "7", 1.0),                                                            # not terminated: math still 1
    # no answer, empty, malformed
    ("42</s>", "42", 0.0),                                                               # no final answer statement
    ("", "42", 0.0),
    ("</s>\\boxed{42}", "42", 0.0),                                                      # all after the EOS
    ("\\boxed{}</s>", "42", 0.0),
    ("#### </s>", "42", 0.0),
    ("\\boxed{42</s>", "42", 0.0),                                                       # unbalanced braces
    ("\\boxed{3} then \\boxed{42", "42", 0.0),                                           # last box cut off: no answer
    ("\\boxed{3} then \\boxed{42", "3", 0.0),
    ("The answer is</s>", "42", 0.0),
    ("\\boxed{x+1}</s>", "42", 0.0),
]


@pytest.mark.parametrize("completion, reference, expected", MATH_CASES,
                         ids=[f"{i}:{c[:30]!r}" for i, c in enumerate(c for c, _, _ in MATH_CASES)])
def test_math_reward_table(completion, reference, expected):
    assert REWARDS["math"]("prompt", completion, reference) == expected


@pytest.mark.parametrize("completion, answer", [
    ("so \\boxed{\\frac{1}{2}}.</s>", "\\frac{1}{2}"),
    ("worked lines\n#### 1,234", "1,234"),
    ("The answer is 12 apples. I hope it is correct.", "12 apples"),
    ("The final answer is **18**.", "18"),
    ("ANSWER: 3.5", "3.5"),
    ("a \\boxed{\\{1, 2\\}} set", "\\{1, 2\\}"),                                          # escaped braces
    ("\\boxed {7}", "7"),
    ("42", None), ("", None), ("\\boxed{", None), ("#### ", None), ("the answer", None),
    ("answer this question please", None), (None, None),
])
def test_extract_answer(completion, answer):
    assert extract_answer(completion) == answer


# (completion, format reward): terminated, exactly one final statement that ends the text, parseable
FORMAT_CASES = [
    ("Reasoning.\n\\boxed{18}</s>", 1.0),
    ("Reasoning.\nThe answer is \\boxed{\\frac{1}{2}}.<|im_end|>", 1.0),
    ("Reasoning.\n$\\boxed{18}$</s>", 1.0),
    ("Worked lines.\n#### 72\n<|endoftext|>", 1.0),
    ("The answer is 8.</s>", 1.0),
    ("Answer: **x + 1**</s>", 1.0),
    ("\\boxed{18}", 0.0),                                                   # not terminated
    ("\\boxed{3} or \\boxed{4}</s>", 0.0),                                  # two boxes
    ("#### 3\n#### 4</s>", 0.0),                                            # two ####
    ("\\boxed{18} and some more words</s>", 0.0),                           # not at the end
    ("The answer is 8. I hope it is correct.</s>", 0.0),
    ("18</s>", 0.0),                                                        # no statement
    ("\\boxed{}</s>", 0.0),
    ("\\boxed{18</s>", 0.0),                                                # unbalanced
    ("\\boxed{\\frac{1}{}}</s>", 0.0),                                      # does not parse
    ("</s>\\boxed{18}", 0.0),
]


@pytest.mark.parametrize("completion, expected", FORMAT_CASES, ids=[f"{i}" for i in range(len(FORMAT_CASES))])
def test_format_reward_table(completion, expected):
    assert REWARDS["format"]("prompt", completion, "ignored") == expected


def test_typical_calls_are_cheap():
    completion = "Let me think step by step. " * 60 + "So 3 + 4 = 7.\n#### 7</s>"
    math, fmt = REWARDS["math"], REWARDS["format"]
    math("", completion, "7"), fmt("", completion, "")
    n = 500
    start = time.perf_counter()
    for _ in range(n):
        assert math("", completion, "7") == 1.0 and fmt("", completion, "") == 1.0
    per_call = (time.perf_counter() - start) / (2 * n)
    assert per_call < 2e-3, per_call                # ~0.05 ms here; loose for a loaded machine


def test_a_huge_pathological_input_is_bounded():
    huge = "\\boxed{" * 200_000 + "#### " * 100_000 + "answer is " * 100_000
    start = time.perf_counter()
    assert REWARDS["math"]("", huge, "1") == 0.0
    assert REWARDS["format"]("", huge + "</s>", "1") == 0.0
    assert extract_answer("x" * 5_000_000 + "\\boxed{3}") == "3"
    assert time.perf_counter() - start < 5.0


def test_a_check_over_the_time_limit_scores_zero_and_is_counted():
    before = A.check_stats()["timeouts"]
    limit = 0.5
    reward = build_reward(_config("math", check_timeout=limit))
    reward("", "\\boxed{1}</s>", "\\sqrt{1}")            # the worker is up: its start-up is not the check
    start = time.perf_counter()
    assert reward("", "\\boxed{9^{9^{9^{9}}}}</s>", "5") == 0.0       # sympy would run for ages
    assert time.perf_counter() - start < limit + 2.0
    assert A.check_stats()["timeouts"] == before + 1
    assert reward("", "\\boxed{\\sqrt{4}}</s>", "2") == 1.0           # and the checker goes on


def test_a_stuck_worker_is_killed_at_the_hard_limit_and_replaced():
    A.answers_equal("\\sqrt{9}", "3")                     # the worker is up
    stats = A.check_stats()
    os.kill(A._WORKER.proc.pid, signal.SIGSTOP)           # stuck where no alarm can reach it
    start = time.perf_counter()
    assert not A.answers_equal("\\sqrt{16}", "4", timeout=0.2)
    assert time.perf_counter() - start < 0.2 + A.KILL_GRACE + 1.0
    after = A.check_stats()
    assert after["timeouts"] == stats["timeouts"] + 1
    assert A.answers_equal("\\sqrt{25}", "5")             # a fresh worker
    assert A.check_stats()["worker_starts"] == after["worker_starts"] + 1


def test_a_worker_that_dies_mid_check_scores_zero_and_is_replaced():
    A.answers_equal("\\sqrt{49}", "7")                     # the worker is up
    before = A.check_stats()
    pid = A._WORKER.proc.pid
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()     # as the kernel's OOM killer would
    start = time.perf_counter()
    assert not A.answers_equal("9^{9^{9^{9}}}", "6", timeout=5.0)
    assert time.perf_counter() - start < 3.0
    assert A.check_stats()["worker_deaths"] == before["worker_deaths"] + 1
    assert A.answers_equal("\\sqrt{64}", "8")


def test_the_checker_works_off_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(A.answers_equal("\\sqrt{36}", "6", timeout=1.0)))
    t.start()
    t.join(30)
    assert out == [True]


@pytest.mark.parametrize("payload", [
    "__import__('os').system('touch {f}')",
    "exec(\"open('{f}', 'w')\")",
    "eval(\"__import__('os').system('touch {f}')\")",
    "(lambda: __import__('os').system('touch {f}'))()",
])
def test_model_text_is_never_evaluated(tmp_path, payload):
    target = tmp_path / "PWNED"
    text = payload.format(f=target)
    for completion in (f"\\boxed{{{text}}}</s>", f"#### {text}</s>", f"The answer is {text}</s>"):
        assert REWARDS["math"]("", completion, "0") == 0.0
        REWARDS["format"]("", completion, "")
        assert REWARDS["math"]("", "\\boxed{0}</s>", text) == 0.0        # nor the reference
    assert not target.exists()


# ---------------------------------------------------------------------------------- mix

def _config(kind, **reward):
    from race.config.configfile import config_from_dict

    return config_from_dict({"model": "race/tiny-arith", "budget": 1e10, "reward": {"kind": kind, **reward}})


def test_mix_is_the_weighted_sum_by_hand():
    mix = build_reward(_config("mix", mix={"math": 0.9, "format": 0.1}))
    assert mix("", "\\boxed{5}</s>", "5") == pytest.approx(1.0)           # 0.9·1 + 0.1·1
    assert mix("", "\\boxed{6}</s>", "5") == pytest.approx(0.1)           # 0.9·0 + 0.1·1
    assert mix("", "\\boxed{5}", "5") == pytest.approx(0.9)               # not terminated: 0.9·1 + 0.1·0
    assert mix("", "5", "5") == 0.0
    three = mix_reward({"sparse": 2.0, "dense": 0.5, "math": 1.0})
    # "146" vs "147": sparse 0, dense 2/3, math 0 (no statement)
    assert three("", "146</s>", "147") == pytest.approx(0.5 * 2 / 3)
    assert three("", "147</s>", "147") == pytest.approx(2.0 + 0.5 + 0.0)
    batch = score_completions(mix, ["p", "p"], ["\\boxed{5}</s>", "\\boxed{6}</s>"], ["5", "5"])
    assert batch.scores == pytest.approx([1.0, 0.1]) and batch.errors == 0


@pytest.mark.parametrize("weights, message", [
    ({}, "reward.mix {} is not valid"),
    ({"magic": 1.0}, "component 'magic' is unknown"),
    ({"math": -1.0}, "weight -1.0 of 'math'"),
    ({"math": True}, "weight True of 'math'"),
    ({"math": "0.5"}, "weight '0.5' of 'math'"),
    ({"math": float("inf")}, "weight inf of 'math'"),
    (["math"], "is not valid"),
])
def test_mix_reward_refuses_bad_weights_in_one_line(weights, message):
    with pytest.raises(RewardError, match=message.replace("{", "\\{").replace("}", "\\}")) as e:
        mix_reward(weights)
    assert "\n" not in str(e.value)


def test_kinds_math_format_and_mix_are_accepted_everywhere_a_kind_is():
    from race.config.rules import REWARD_KINDS, RULE_REWARDS as CONFIG_RULES

    assert tuple(CONFIG_RULES) == tuple(RULE_REWARDS) == tuple(REWARDS)
    assert {"math", "format", "mix"} <= set(REWARD_KINDS)
    assert get_reward("math") is REWARDS["math"] and get_reward("format") is REWARDS["format"]
    assert build_reward(_config("math")) is REWARDS["math"]
    assert build_reward(_config("format"))("", "\\boxed{1}</s>", "") == 1.0
    assert build_reward(_config("math", check_timeout=0.7)).__name__ == "math"
    cfg = _config("mix", mix={"math": 0.9, "format": 0.1})
    from race.config.configfile import config_from_dict

    assert config_from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg     # a stored config round-trips
    hash(cfg)


# ----------------------------------------------------------------------------- checker

def test_answer_checker():
    math, exact = answer_checker("math"), answer_checker("sparse")
    assert math("p", "So \\boxed{0.5}.</s>", "\\frac{1}{2}") is True
    assert math("p", "So \\boxed{0.6}.</s>", "\\frac{1}{2}") is False
    assert exact("p", "46</s>", "46") is True and exact("p", "\\boxed{46}</s>", "46") is False
    assert answer_checker("exact")("p", "46", "46") is True
    with pytest.raises(ValueError, match="answer checker 'fuzzy' is unknown"):
        answer_checker("fuzzy")
    assert checker_for("math") == checker_for("format") == "math"
    assert checker_for("mix", {"sparse": 1.0, "format": 0.1}) == "math"
    assert checker_for("sparse") == checker_for("dense") == checker_for("mix", {"dense": 1.0}) == "sparse"


def test_import_race_stays_light():
    import subprocess

    code = ("import sys, race, race.tasks.rewards, race.tasks.rewards.answers, race.config.configfile; "
            "print(sorted(m for m in ('math_verify', 'sympy', 'torch', 'latex2sympy2_extended') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- datasets

def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_gsm8k_rows(tmp_path):
    from race.tasks.datasets import load_dataset_problems

    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"
    path = _write(tmp_path / "gsm8k.jsonl", [{"question": "How many clips?", "answer": solution},
                                             {"question": "How much?", "answer": "Work.\n#### 1,234"}])
    first, second = load_dataset_problems(path)
    assert (first.prompt, first.answer, first.id) == ("How many clips?", "72", 0)
    assert first.meta == {"solution": solution, "format": "gsm8k"}
    assert second.answer == "1,234"
    assert REWARDS["math"]("", "so 1234 dollars\n#### 1234</s>", second.answer) == 1.0


def test_math500_rows(tmp_path):
    from race.tasks.datasets import load_dataset_problems

    path = _write(tmp_path / "math500.jsonl", [
        {"problem": "Compute 1/2 + 0.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "answer": "\\frac{1}{2}",
         "subject": "Algebra", "level": 1},
        {"problem": "Compute 2+2.", "solution": "We get $2+2=\\boxed{4}$."},                 # no answer column
        {"problem": "Compute 3.", "solution": "So \\boxed{3}.", "answer": ""},               # an empty one
    ])
    a, b, c = load_dataset_problems(path)
    assert (a.prompt, a.answer) == ("Compute 1/2 + 0.", "\\frac{1}{2}") and a.meta["format"] == "math"
    assert a.meta["solution"] == "It is $\\boxed{\\frac{1}{2}}$."
    assert (b.answer, c.answer) == ("4", "3")
    assert REWARDS["math"]("", "\\boxed{0.5}</s>", a.answer) == 1.0


def test_worked_formats_need_the_default_fields_and_the_plain_format_wins(tmp_path):
    from race.tasks.datasets import TaskError, load_dataset_problems

    gsm = _write(tmp_path / "g.jsonl", [{"question": "Q?", "answer": "w\n#### 3"}])
    with pytest.raises(TaskError, match="field 'q' is missing"):
        load_dataset_problems(gsm, prompt_field="q")
    plain = _write(tmp_path / "p.jsonl", [{"prompt": "P?", "question": "Q?", "answer": "w\n#### 3"}])
    (p,) = load_dataset_problems(plain)
    assert (p.prompt, p.answer, p.meta) == ("P?", "w\n#### 3", None)


def test_parquet_worked_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from race.tasks.datasets import load_dataset_problems

    path = tmp_path / "m.parquet"
    pq.write_table(pa.table({"problem": ["Compute 2+2."], "solution": ["So \\boxed{4}."], "level": [1]}), path)
    (p,) = load_dataset_problems(str(path))
    assert (p.prompt, p.answer, p.meta["solution"]) == ("Compute 2+2.", "4", "So \\boxed{4}.")


def test_race_init_and_the_python_api_accept_math_and_format():
    from race.run.api import build_config
    from race.run.newconfig import init_raw

    raw = init_raw(model="race/tiny-arith", task="t.jsonl", full_run=1e13, reward="math")
    assert raw["reward"] == {"kind": "math"}
    mixed = {"model": "race/tiny-arith", "budget": 1e10, "reward": {"kind": "mix", "mix": {"math": 1.0}}}
    cfg = build_config(mixed, reward="format")
    assert (cfg.reward.kind, cfg.reward.mix) == ("format", None)
