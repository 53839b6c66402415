"""The prompts a recipe gives the policy (issue 51): what each trainer feeds it is what RACE's pilots fed it.

RACE's pilots render a prompt as a user turn of the policy's chat template (``chat_template: auto`` with
a tokenizer that has one, or ``on``; race.tasks.taskdata.policy_prompts). The emitted data makes each
trainer do the same, checked with the trainer's own code on the emitted files, token for token:

- TRL 1.16: the conversational prompt through ``GRPOTrainer._tokenize_prompts``;
- OpenRLHF 0.11.2: the text through its own ``preprocess_data`` with ``--data.apply_chat_template``,
  tokenized as its agent does (``add_special_tokens=False``);
- verl: the chat turns of the Parquet rows (its RLHFDataset renders them with the template: the
  rendering itself is tests/test_trainer_runs.py's chat-template test).

And it matters: on race/tiny-reasoner, the emitted TRL script's rollouts score 0.54 with the chat
prompts and 0.12 with the bare text (4 steps, measured; docs/recipes.md); the test asserts ≥ 0.2 after 2.
The emitted TRL script trains with no warning (peft's and TRL's own reading of transformers' deprecated
``is_gradient_checkpointing`` is filtered by name in the script)."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import warnings

import pytest

from conftest import ROOT, require
from race.config.configfile import config_from_dict
from race.fullrun.recipes import recipe

SOURCES = os.environ.get("RACE_TRAINER_SOURCES") or os.path.join(ROOT, ".ci", "cache", "trainers")
REASONER_YAML = os.path.join(ROOT, "pilots", "tiny-reasoner-smoke.yaml")
SYSTEM = "Solve the problem. End with #### and the answer."


def _config(policy: str, **extra):
    task = {"tiny-reasoner": "word-problems"}.get(policy, "arithmetic-easy")
    return config_from_dict({"model": f"race/{policy}", "task": task, "budget": 1e12, **extra})


def _race_ids(cfg, n: int = 8) -> list[list[int]]:
    """The token ids of the first ``n`` training prompts as RACE's pilots feed them to the policy."""
    from transformers import AutoTokenizer

    from race.flops.catalog import resolve_model_path
    from race.tasks import load_task
    from race.tasks.taskdata import policy_prompts

    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
    problems = load_task(cfg.task, split="train")[:n]
    return [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in policy_prompts(cfg, problems, tok)]


def _rows(out, n: int = 8) -> list[dict]:
    return [json.loads(x) for x in (out / "data" / "train.jsonl").read_text().splitlines()[:n]]


CASES = [("tiny-reasoner", None), ("tiny-reasoner", SYSTEM), ("tiny-arith", None)]


@pytest.mark.parametrize("policy,system", CASES)
def test_trl_tokenizes_the_emitted_prompts_to_races_tokens(tmp_path, policy, system):
    """GRPOTrainer's own prompt tokenization of the emitted conversational prompts = RACE's ids."""
    from datasets import load_dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from race.fullrun.trl import _checkpointing_key

    cfg = _config(policy, system_prompt=system)
    out = tmp_path / "emit"
    rec = recipe(cfg, trainer="trl", rho=0.7, full_run_budget=1e13, emit_dir=str(out))
    rows = _rows(out)
    assert rows[0]["prompt"][-1]["role"] == "user" and (rows[0]["prompt"][0]["role"] == "system") == bool(system)
    args = GRPOConfig(output_dir=str(tmp_path / "run"), use_cpu=True, bf16=False, report_to="none",
                      per_device_train_batch_size=4, num_generations=4, max_steps=1, **{_checkpointing_key(): False})
    data = load_dataset("json", data_files=str(out / "data" / "train.jsonl"), split="train")
    trainer = GRPOTrainer(model=rec.model["model_name_or_path"], reward_funcs=lambda completions, **k: [0.0] *
                          len(completions), args=args, train_dataset=data,
                          peft_config=LoraConfig(r=4, task_type="CAUSAL_LM"))
    ids = trainer._tokenize_prompts([r["prompt"] for r in rows])[0]
    assert [list(x) for x in ids] == _race_ids(cfg)


@pytest.mark.parametrize("policy,system", CASES)
def test_openrlhf_renders_the_emitted_prompts_to_races_tokens(tmp_path, policy, system):
    """OpenRLHF 0.11.2's own preprocess_data (the recipe's --data.apply_chat_template, input and label
    keys), tokenized as its agent tokenizes a prompt, gives RACE's ids."""
    from transformers import AutoTokenizer

    found = glob.glob(os.path.join(SOURCES, "openrlhf", "*", "purelib", "openrlhf", "datasets", "prompts_dataset.py"))
    require(bool(found), f"OpenRLHF 0.11.2's sources (in {SOURCES})")
    spec = importlib.util.spec_from_file_location("openrlhf_prompts_dataset", found[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = _config(policy, system_prompt=system)
    out = tmp_path / "emit"
    f = recipe(cfg, trainer="openrlhf", rho=0.7, full_run_budget=1e13, emit_dir=str(out)).settings
    assert f["--data.apply_chat_template"] is True
    tok = AutoTokenizer.from_pretrained(f["--actor.model_name_or_path"])
    # PromptDataset: apply_chat_template = tokenizer.apply_chat_template when --data.apply_chat_template
    texts = [module.preprocess_data(r, None, f["--data.input_key"], f["--data.label_key"], tok.apply_chat_template)
             for r in _rows(out)]
    assert [t[1] for t in texts] == [r["answer"] for r in _rows(out)]
    assert [tok(text=t[0], add_special_tokens=False)["input_ids"] for t in texts] == _race_ids(cfg)


def test_verl_rows_carry_the_system_turn_and_a_policy_without_template_gets_a_note(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "emit"
    recipe(_config("tiny-reasoner", system_prompt=SYSTEM), trainer="verl", rho=0.7, full_run_budget=1e13,
           emit_dir=str(out))
    row = pq.read_table(out / "data" / "train.parquet").to_pylist()[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["prompt"][0]["content"] == SYSTEM
    off = recipe(_config("tiny-reasoner", chat_template="off"), trainer="verl", rho=0.7, full_run_budget=1e13)
    assert any(n.startswith("prompts: verl renders every prompt with the tokenizer's chat template") for n in off.notes)
    plain = recipe(_config("tiny-reasoner", chat_template="off"), trainer="openrlhf", rho=0.7, full_run_budget=1e13)
    assert "--data.apply_chat_template" not in plain.settings
    hub = recipe(config_from_dict({"model": "Qwen/Qwen2.5-0.5B-Instruct", "budget": 1e15}), trainer="trl",
                 rho=0.7, full_run_budget=1e17)
    assert any("the recipe assumes it has" in n for n in hub.notes)


def test_the_emitted_trl_script_trains_the_reasoner_on_its_chat_prompts_without_a_warning(tmp_path):
    """train_trl.py on race/tiny-reasoner (word problems, math-verify reward): 2 steps of 56 rollouts
    score ≥ 0.2 on average (0.02 with the bare text; 0.44 over 4 steps with the chat prompts), and
    neither building the trainer nor training raises a warning."""
    pytest.importorskip("math_verify")
    from race.run.api import build_config

    out = tmp_path / "emit"
    recipe(build_config(REASONER_YAML), trainer="trl", rho=0.65, full_run_budget=1e13, emit_dir=str(out))
    spec = importlib.util.spec_from_file_location("train_trl_reasoner", out / "train_trl.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = script.build(max_steps=2, output_dir=str(tmp_path / "run"), logging_steps=1, disable_tqdm=True)
        trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == 2 and sum(rewards) / 2 >= 0.2, rewards
    assert [str(w.message) for w in caught] == []
