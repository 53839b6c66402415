"""The word-problem tasks (race/tasks/wordproblems.py) and the tiny reasoner they train
(race/assets/tiny-reasoner): generator, splits, file formats, tokenizer, chat template, EOS,
loading through transformers and race.flops.catalog, FLOPs against FlopCounterMode, accuracy."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from race.tasks import TASKS, is_eval_prompt, load_task
from race.tasks.wordproblems import PHRASES, WordProblemTask, write_gsm8k, write_math

ROOT = Path(__file__).resolve().parents[1]
ASSET = ROOT / "race" / "assets" / "tiny-reasoner"
DATA = ROOT / "race" / "assets" / "word-problems"
WORD_TASKS = ["word-problems", "word-problems-hard", "word-problems-downstream", "word-problems-longer"]
_EQ = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")


def _check_work(work: str, answer: str) -> int:
    """Every equation of a worked solution is right and chains into the answer; returns their number."""
    eqs = _EQ.findall(work)
    for a, op, b, y in eqs:
        a, b, y = int(a), int(b), int(y)
        assert {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op] == y and (op != "/" or a % b == 0)
        assert 0 <= y
    last = int(eqs[-1][3]) if eqs else int(re.search(r"starts with (\d+)", work).group(1))
    assert str(last) == answer
    return len(eqs)


@pytest.mark.parametrize("name", WORD_TASKS)
def test_word_problems_are_right_and_split_by_prompt(name):
    task = TASKS[name]
    train, evals = load_task(name, n=2000, seed=1), load_task(name, split="eval")
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert all(not is_eval_prompt(p.prompt) for p in train) and all(is_eval_prompt(p.prompt) for p in evals)
    assert len(evals) >= 500 and len({p.prompt for p in train}) == len(train)
    for p in train[:300] + evals[:300]:
        steps = _check_work(p.meta["work"], p.answer)
        assert steps == p.meta["steps"] and task.min_steps <= steps <= task.max_steps
        assert 0 <= int(p.answer) <= task.max_value and p.answer == str(int(p.answer))
        if task.answer_format == "gsm8k":
            assert p.meta["solution"] == p.meta["work"] + f"\n#### {p.answer}"
        else:
            assert p.meta["solution"].endswith(f"\\boxed{{{p.answer}}}") and "####" not in p.meta["solution"]


def test_generator_is_deterministic_and_seeded_only_by_name_and_index():
    task = TASKS["word-problems"]
    assert task.problem(7) == task.problem(7) and task.problem(7).meta == task.problem(7).meta
    assert WordProblemTask("other", min_steps=2, max_steps=3).problem(7).prompt != task.problem(7).prompt
    assert load_task("word-problems", n=20, seed=0) == load_task("word-problems", n=20, seed=0)
    assert load_task("word-problems", n=20, seed=0) != load_task("word-problems", n=20, seed=1)
    assert load_task("word-problems", split="eval", n=20, seed=0) == load_task("word-problems", split="eval", n=20, seed=5)
    code = "from race.tasks import load_task; print(load_task('word-problems', split='eval', n=3)[2].prompt)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == load_task("word-problems", split="eval", n=3)[2].prompt


def test_downstream_is_shifted():
    """Other phrasings (none of a training phrasing's fixed words), more steps, MATH format."""
    train_style = {re.sub(r"\{[^}]*\}", "|", s) for k, v in PHRASES["train"].items() for s in v}
    pieces = {piece.strip() for s in train_style for piece in s.split("|") if len(piece.strip()) > 6}
    down = load_task("word-problems-downstream", split="eval")
    assert all(p.meta["format"] == "math" for p in down)
    assert not any(piece in p.prompt for p in down[:300] for piece in pieces)
    assert min(p.meta["steps"] for p in down) > max(p.meta["steps"] for p in load_task("word-problems", n=500))


def test_writers_and_shipped_files(tmp_path):
    probs = load_task("word-problems", split="eval", n=3)
    assert write_gsm8k(probs, str(tmp_path / "g.jsonl")) == 3 and write_math(probs, str(tmp_path / "m.jsonl")) == 3
    g = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    m = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert g[0] == {"question": probs[0].prompt, "answer": probs[0].meta["solution"]}
    assert g[0]["answer"].endswith(f"\n#### {probs[0].answer}")
    assert set(m[0]) == {"problem", "solution", "answer"} and m[0]["solution"].endswith(f"\\boxed{{{probs[0].answer}}}")
    # the shipped sample files: GSM8K style for train / eval, MATH style for downstream
    assert load_task(str(DATA / "eval.jsonl"), prompt_field="question", answer_field="answer", split="eval",
                     eval_fraction=0.5)
    rows = {f: [json.loads(line) for line in (DATA / f).read_text().splitlines()]
            for f in ("train.jsonl", "eval.jsonl", "downstream.jsonl")}
    assert not {r["question"] for r in rows["train.jsonl"]} & {r["question"] for r in rows["eval.jsonl"]}
    assert all(r["answer"].rsplit("#### ", 1)[1].isdigit() for r in rows["eval.jsonl"])
    assert all(r["solution"].endswith("\\boxed{" + r["answer"] + "}") for r in rows["downstream.jsonl"])
    assert sum((DATA / f).stat().st_size for f in rows) < 2_000_000


# ------------------------------------------------------------------------------ the asset

@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from race.flops.catalog import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("race/tiny-reasoner"))


def test_tokenizer_round_trip_and_digits(tok):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(ASSET / "tokenizer.json"))
    texts = []
    for name in WORD_TASKS:
        for p in load_task(name, split="eval", n=100):
            texts += [p.prompt, p.meta["solution"], p.meta["work"] + f"\n#### {p.answer}"]
    texts += ["Tom's 12 cats.\n\n#### 1234", "  two  spaces\tand tabs\n", "Zoë paid €5 — ok? ünïcode"]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert ids == raw.encode(text, add_special_tokens=False).ids       # tokenizer.json and the loaded class agree
    digits = tok.tokenize(" 1234 = 56")
    assert [t for t in digits if any(c.isdigit() for c in t)] == ["1", "2", "3", "4", "5", "6"]
    assert len(tok) < 1100


def test_chat_template_and_end_of_turn(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Mia has 3 apples. How many?"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nMia has 3 apples. How many?"
                    "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.apply_chat_template(msgs[1:], tokenize=False, add_generation_prompt=False) == \
        "<|im_start|>user\nMia has 3 apples. How many?<|im_end|>\n"
    for special in ("<|im_end|>", "<|im_start|>", "<|endoftext|>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    assert tok.encode("x<|im_end|>", add_special_tokens=False)[-1] == tok.eos_token_id
    cfg = json.loads((ASSET / "config.json").read_text())
    gen = json.loads((ASSET / "generation_config.json").read_text())
    assert cfg["eos_token_id"] == gen["eos_token_id"] == tok.eos_token_id
    assert cfg["pad_token_id"] == tok.pad_token_id


def test_model_loads_and_is_counted_by_race(tok):
    from transformers import AutoModelForCausalLM

    from race.flops import formulas as F
    from race.flops.catalog import load_arch, resolve_model_path, shipped_models

    assert "race/tiny-reasoner" in shipped_models()
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("race/tiny-reasoner"))
    meta = json.loads((ASSET / "race_meta.json").read_text())
    params = sum(p.numel() for p in model.parameters())
    assert params == meta["parameters"] == F.param_count(load_arch("race/tiny-reasoner")) < 3_000_000
    assert (ASSET / "model.safetensors").stat().st_size < 25_000_000
    import hashlib
    assert hashlib.sha256((ASSET / "model.safetensors").read_bytes()).hexdigest() == meta["model_sha256"]
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)


def test_flops_match_flop_counter():
    """Forward, full fwd+bwd and LoRA fwd+bwd of the shipped model: race.flops.formulas vs FlopCounterMode."""
    import torch
    from transformers import AutoModelForCausalLM

    from race.flops import formulas as F
    from race.flops.catalog import load_arch

    spec = importlib.util.spec_from_file_location("flop_accuracy", ROOT / "bench" / "flop_accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    arch = load_arch("race/tiny-reasoner")
    p, c, b = 30, 50, 2
    ids = torch.randint(3, arch.vocab_size, (b, p + c))

    def fresh():
        return AutoModelForCausalLM.from_pretrained(str(ASSET), attn_implementation="eager").float()

    model = fresh()
    with torch.no_grad():
        counted = bench.count(lambda: model(input_ids=ids))
    assert counted == b * F.forward_flops(arch, p + c, causal=False)
    model.train()
    counted = bench.count(lambda: bench._completion_logprob_loss(model, ids, p).backward())
    assert counted == F.learning_flops(arch, sequences=b, prompt_len=p, completion_len=c, causal=False)
    peft_model, lora = bench.add_lora(fresh(), arch)
    peft_model.train()
    counted = bench.count(lambda: bench._completion_logprob_loss(peft_model, ids, p).backward())
    assert counted == F.learning_flops(arch, sequences=b, prompt_len=p, completion_len=c, lora=lora, causal=False)


def test_sampled_accuracy_and_length_are_in_range(tok):
    """Sampled (T = 1) accuracy on 100 easy held-out problems: room for RL, but not zero; the
    completions are worked solutions of 30–150 tokens that end their turn."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "scripts"))
    from build_tiny_reasoner import accuracy

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(ASSET)).eval()
    acc = accuracy(model, tok, load_task("word-problems", split="eval", n=100), sample=True, seed=0)
    assert 0.1 <= acc["accuracy"] <= 0.6, acc
    assert 30 <= acc["mean_tokens"] <= 150 and acc["ended"] >= 0.9, acc


@pytest.mark.slow
def test_a_short_pilot_raises_the_reasoners_heldout_pass_at_1(torch_one_thread):
    """One on-policy pilot of 1.2e12 FLOPs (~50 GRPO steps, ~80 s on one core) on the reasoner's
    smoke config — chat template, 60-token worked solutions stopped at <|im_end|>, the 0.9 math +
    0.1 format reward, pass@1 by math-verify — lifts held-out pass@1 on 200 prompts × 4 samples by
    ≥ 0.03 (measured: 0.369 → 0.43; the sampling SE of the difference is about 0.015), with its
    rollouts and update in sync (gap ≤ 1e-4)."""
    from dataclasses import replace

    from race.run.api import build_config
    from race.flops.grid import plan_grid
    from race.tasks.taskdata import answer_check, task_problems
    from race.engine.evaluation import evaluate
    from race.engine.loading import load_rollout
    from race.engine.pilot import run_pilot
    from race.tasks.rewards import build_reward

    cfg = build_config(str(ROOT / "pilots" / "tiny-reasoner-smoke.yaml")).with_overrides(budget=1.2e12)
    cfg = replace(cfg, eval=replace(cfg.eval, prompts=200, checkpoints=0, tasks=()))
    schedule = plan_grid(cfg, prompt_len=45, completion_len=60).schedules[1]
    assert schedule.mu == 1                                              # one update per batch of rollouts
    _, backend = load_rollout(cfg)
    problems = task_problems(cfg, backend.tok, split="eval", n=200)
    assert problems[0].prompt.startswith("<|im_start|>user\n") and answer_check(cfg, problems).__name__ == "math_correct"
    base = evaluate(backend, problems, build_reward(cfg), samples=4, temperature=1.0, max_new_tokens=160, seed=0,
                    check=answer_check(cfg, problems))
    before = sum(base["pass@1"]) / 200
    result = run_pilot(cfg, schedule, seed=0)
    after = result.score("pass@1")
    assert after - before >= 0.03, (before, after)
    assert result.extra["sync"]["gap_max"] <= 1e-4
