"""Tasks: built-in arithmetic splits and user-dataset loaders."""
import json
import subprocess
import sys
import types

import pytest

from conftest import ROOT
from race.tasks import TASKS, Problem, TaskError, apply_chat_template, is_eval_prompt, load_task


@pytest.mark.parametrize("name", sorted(n for n in TASKS if n.startswith("arithmetic")))
def test_train_and_eval_are_disjoint_and_correct(name):      # word problems: tests/test_reasoner.py
    train = load_task(name, split="train", n=3000, seed=1)
    evals = load_task(name, split="eval")
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert len({p.prompt for p in train}) == len(train)            # no repeats within a split
    assert all(not is_eval_prompt(p.prompt) for p in train)
    assert all(is_eval_prompt(p.prompt) for p in evals)
    for p in train[:200] + evals[:200]:
        a, b = p.prompt[:-1].split("+")
        assert p.prompt.endswith("=") and p.answer == str(int(a) + int(b))


def test_easy_is_two_digit_addition():
    train = load_task("arithmetic-easy")
    evals = load_task("arithmetic-easy", split="eval")
    assert len(train) + len(evals) == 100 * 100
    assert 0.08 < len(evals) / 10_000 < 0.12
    p = next(p for p in train + evals if p.prompt == "12+34=")
    assert (p.answer, p.id) == ("46", 1234)


def test_hard_has_three_digit_operands():
    hard = load_task("arithmetic-hard", n=100, seed=0)
    for p in hard:
        a, b = (int(x) for x in p.prompt[:-1].split("+"))
        assert 100 <= a <= 999 and 100 <= b <= 999
    assert len(load_task("arithmetic-hard")) == TASKS["arithmetic-hard"].train_size


def test_seed_shuffles_train_but_not_eval():
    a = load_task("arithmetic-easy", n=50, seed=0)
    assert a == load_task("arithmetic-easy", n=50, seed=0)
    assert a != load_task("arithmetic-easy", n=50, seed=1)
    assert load_task("arithmetic-easy", split="eval", n=50, seed=0) == \
        load_task("arithmetic-easy", split="eval", n=50, seed=7)
    assert load_task("arithmetic-hard", split="eval", n=20, seed=0) == \
        load_task("arithmetic-hard", split="eval", n=20, seed=3)
    # a prefix of the eval list is the eval list cut short
    assert load_task("arithmetic-easy", split="eval", n=10) == load_task("arithmetic-easy", split="eval")[:10]


def test_eval_set_is_the_same_in_a_fresh_process():
    code = ("from race.tasks import load_task\n"
            "print([p.prompt for p in load_task('arithmetic-hard', split='eval', n=5)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == str([p.prompt for p in load_task("arithmetic-hard", split="eval", n=5)])


@pytest.mark.parametrize("kw, match", [
    ({"split": "test"}, "split 'test'"),
    ({"n": 0}, "n 0"),
    ({"n": 10**6, "split": "eval"}, "exceeds"),
])
def test_bad_arguments(kw, match):
    with pytest.raises(TaskError, match=match):
        load_task("arithmetic-easy", **kw)


def test_unknown_builtin_name():
    with pytest.raises(ValueError, match="arithmetic-medium.*arithmetic-easy"):
        load_task("arithmetic-medium")


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_jsonl_split_is_deterministic_and_disjoint(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": f" {i} "} for i in range(400)] + [{"prompt": "q7", "answer": "7"}]
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    train = load_task(path, seed=0)
    evals = load_task(path, split="eval", eval_fraction=0.25)
    train25 = load_task(path, eval_fraction=0.25)
    assert not {p.prompt for p in train25} & {p.prompt for p in evals}
    assert len(train25) + len(evals) == len(rows)
    assert 60 < len(evals) < 140
    assert {p.answer for p in train if p.prompt == "q3"} <= {"3"}      # answers are stripped
    # duplicated prompts stay on one side
    sevens = [p for p in load_task(path) + load_task(path, split="eval") if p.prompt == "q7"]
    assert len(sevens) == 2
    assert load_task(path, seed=3, n=20) == load_task(path, seed=3, n=20)


def test_jsonl_custom_fields(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": f"{i}+1=", "target": i + 1} for i in range(100)])
    probs = load_task(path, prompt_field="question", answer_field="target", eval_fraction=0.5)
    assert all(p.answer == str(int(p.prompt.split("+")[0]) + 1) for p in probs)


def test_jsonl_errors_are_one_line_and_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_task(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        load_task(str(empty))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 3: field 'answer' is missing") as e:
        load_task(str(bad))
    assert "\n" not in str(e.value)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "answer": "1"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        load_task(str(broken))


def test_tiny_dataset_without_eval_rows_is_an_error(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "only", "answer": "1"}])
    side = "eval" if not is_eval_prompt("only") else "train"
    with pytest.raises(ValueError, match=f"the {side} split .* is empty"):
        load_task(path, split=side)


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    path = str(tmp_path / "d.parquet")
    table = pa.table({"prompt": [f"{i}+2=" for i in range(50)], "answer": [str(i + 2) for i in range(50)]})
    pq.write_table(table, path)
    probs = load_task(path, eval_fraction=0.3) + load_task(path, split="eval", eval_fraction=0.3)
    assert sorted(p.id for p in probs) == list(range(50))
    with pytest.raises(ValueError, match="field 'solution' is missing"):
        load_task(path, answer_field="solution")


def test_parquet_without_pyarrow_says_so(tmp_path, monkeypatch):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match="needs pyarrow: pip install pyarrow"):
        load_task(str(path))


def test_hf_dataset_through_a_fake_datasets_module(monkeypatch):
    calls = []

    class FakeDataset(list):
        column_names = ["question", "answer"]

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return FakeDataset({"question": f"{i}*2=", "answer": str(2 * i)} for i in range(200))

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    probs = load_task("someone/doubling:main", split="eval", prompt_field="question", hf_split="test")
    assert calls == [("someone/doubling", "main", "test")]
    assert probs and all(p.answer == str(2 * int(p.prompt.split("*")[0])) for p in probs)
    with pytest.raises(ValueError, match="field 'prompt' is missing"):
        load_task("someone/doubling")


def test_hf_errors(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="needs the datasets package"):
        load_task("someone/dataset")

    def offline(*a, **k):
        raise ConnectionError("couldn't reach the hub\nmore detail")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(ValueError, match="could not load Hugging Face dataset 'someone/dataset'") as e:
        load_task("someone/dataset")
    assert "\n" not in str(e.value)


def test_chat_template():
    class Templated:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    class Plain:
        chat_template = None

    probs = [Problem("1+1=", "2", 0)]
    assert apply_chat_template(probs, Plain()) == probs
    out = apply_chat_template(probs, Templated(), system="be exact")
    assert out[0].prompt == "<system>be exact<user>1+1=<assistant>"
    assert out[0].meta == {"raw_prompt": "1+1="} and out[0].answer == "2" and out[0].id == 0


def test_problem_is_frozen_and_hashable():
    p = Problem("1+1=", "2", 0, meta={"k": 1})
    with pytest.raises(AttributeError):
        p.prompt = "x"
    assert hash(p) == hash(Problem("1+1=", "2", 0)) and p == Problem("1+1=", "2", 0)


def test_tasks_import_is_light():
    code = ("import sys, race.tasks, race.tasks.rewards\n"
            "print([m for m in ('torch', 'transformers', 'datasets', 'pyarrow') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
