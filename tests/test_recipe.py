"""race recipe: RACE's schedule at a ρ, written for TRL / verl / OpenRLHF at the full-run budget.

The TRL recipe is checked against TRL itself (trl 1.16.0, the `test` extra): GRPOConfig takes its
arguments and derives the batch sizes RACE planned, `trl grpo --config` parses its YAML, and a few
real GRPOTrainer steps of the tiny policy under torch's FlopCounterMode split their FLOPs between
generation and training as the recipe states (within 2 %)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace

import pytest
from click.testing import CliRunner

from race.config import presets
from race.run.cli import main
from race.config.configfile import config_from_dict
from race.core.errors import RaceError
from race.flops.grid import CostModel
from race.fullrun.recipes import TRAINERS, recipe, render_recipe
from race.flops.specs import policy_arch, reward_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json")
NO_DIAGNOSIS = os.path.join(ROOT, "tests", "data", "tiny-grid-2e10.json")
P, C = 6, 6      # "12+34=" is 6 tokens of the tiny policy; completions forced to C tokens


def run(*args):
    return CliRunner().invoke(main, list(args))


def tiny_config(mu: int = 2, micro: int | None = 4, **grpo):
    return config_from_dict({
        "model": "race/tiny-arith", "budget": 1e12, "lengths": {"prompt": P, "completion": C},
        "schedule": {"prompts_per_step": 2, "n_train": 4, "max_n_gen": 4, "mu": mu},
        "grpo": {"max_completion_len": C, "micro_batch": micro, **grpo},
        "learning_rate": {"ref": 1e-3, "ref_batch": 64}})


def on_policy_rho(cfg, n: int = 4, mu: int = 2) -> float:
    return CostModel(cfg, policy_arch(cfg), reward_spec(cfg), P, C).cost(n, mu, n).per_prompt.rho


def tiny_recipe(steps: int = 2, **kw):
    cfg = tiny_config(**kw)
    rho = on_policy_rho(cfg, mu=kw.get("mu", 2))
    one = recipe(cfg, trainer="trl", rho=rho, full_run_budget=1e15).flops_per_step.total
    return cfg, recipe(cfg, trainer="trl", rho=rho, full_run_budget=(steps + 0.5) * one)


# ----------------------------------------------------------------------------- TRL, checked by TRL

def test_trl_grpo_config_derives_what_race_planned(tmp_path):
    from trl import GRPOConfig

    cfg, rec = tiny_recipe(steps=3)
    s = rec.schedule
    assert (s.prompts_per_step, s.n_gen, s.n_train, s.mu, s.steps) == (2, 4, 4, 2, 3) and [n[:14] for n in rec.notes] == [
        "the watch: pas", "data and rewar", "run `trl grpo`", "stability at F"]
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      **rec.settings)
    assert args.num_generations == 4
    assert args.generation_batch_size == s.prompts_per_step * s.n_gen == 8      # completions per generation
    assert args.per_device_train_batch_size == 4                                # grpo.micro_batch
    assert args.steps_per_generation == args.gradient_accumulation_steps == 2   # one optimizer step per pass
    assert args.num_iterations == 2 and args.max_steps == s.steps * s.mu == 6
    assert args.learning_rate == pytest.approx(1e-3 * math.sqrt(8 / 64))       # √B rule, B = B_p · n
    assert args.loss_type == "dapo" and args.scale_rewards == "group" and args.beta == 0.0
    assert args.gradient_checkpointing is False and args.max_completion_length == C


def test_trl_yaml_parses_with_trl_grpo_cli(tmp_path):
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl.scripts.grpo import GRPOScriptArguments

    rec = recipe(dict(presets.DEFAULT), trainer="trl", rho=0.85, full_run_budget=6e12)
    path = tmp_path / "grpo.yaml"
    path.write_text(render_recipe(rec, "yaml"))
    _, args, model = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(path), "--output_dir", str(tmp_path), "--dataset_name", "x", "--use_cpu", "true",
         "--bf16", "false"])
    s = rec.schedule
    assert args.num_iterations == s.mu == 2 and args.generation_batch_size == s.prompts_per_step * s.n_gen
    assert args.max_steps == s.steps * s.mu
    assert model.use_peft and model.lora_r == 8 and model.lora_target_modules[0] == "q_proj"


def test_trl_measured_split_matches_the_recipe(tmp_path):
    """A few real GRPOTrainer steps (transformers generate on CPU, LoRA, eager attention) under
    FlopCounterMode: FLOPs inside the trainer's generate call are search, the rest learning."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from race.flops.catalog import resolve_model_path

    torch.manual_seed(0)
    path = resolve_model_path("race/tiny-arith")
    tok = AutoTokenizer.from_pretrained(path)
    pairs = [(12, 34), (56, 17), (23, 45), (61, 28), (40, 33), (19, 52), (77, 11), (35, 44)]
    prompts = [f"{a}+{b}=" for a, b in pairs]
    assert {len(tok(p)["input_ids"]) for p in prompts} == {P}         # no padding: lengths as stated
    _, rec = tiny_recipe(steps=2)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                      save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True,
                      generation_kwargs={"min_new_tokens": C}, **rec.settings)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    m = rec.model
    data = Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a, b in pairs]})

    def exact(completions, answer, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    counter = FlopCounterMode(display=False)
    seen = {"search": 0, "calls": 0, "lengths": set()}

    class Counted(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *a, **k):
            before = counter.get_total_flops()
            out = super()._generate_single_turn(prompt_ids, *a, **k)
            seen["search"] += counter.get_total_flops() - before
            seen["calls"] += 1
            seen["lengths"] |= {len(c) for c in out[0]}
            return out

    trainer = Counted(model=model, processing_class=tok, reward_funcs=exact, args=args, train_dataset=data,
                      peft_config=LoraConfig(r=m["lora_r"], lora_alpha=m["lora_alpha"],
                                             target_modules=m["lora_target_modules"]))
    with counter:
        trainer.train()
    s = rec.schedule
    assert seen["calls"] == s.steps and seen["lengths"] == {C}            # one generation per RACE step
    assert trainer.state.global_step == s.steps * s.mu                     # μ optimizer steps per batch
    search = float(seen["search"])
    learning = counter.get_total_flops() - search
    stated = rec.flops
    assert search == pytest.approx(stated.search, rel=0.02)
    assert learning == pytest.approx(stated.learning, rel=0.02)
    assert learning / (search + learning) == pytest.approx(stated.rho, rel=0.02)


# ----------------------------------------------------------------------------- mappings

def test_verl_and_openrlhf_give_mu_optimizer_steps_per_batch():
    cfg = tiny_config(mu=3, micro=None, beta=0.01, loss_agg="grpo")
    rho = on_policy_rho(cfg, mu=3)
    v = recipe(cfg, trainer="verl", rho=rho, full_run_budget=1e13)
    s, o = v.schedule, v.settings
    assert o["actor_rollout_ref.actor.ppo_mini_batch_size"] == o["data.train_batch_size"] == s.prompts_per_step
    assert o["actor_rollout_ref.rollout.n"] == s.n_gen and o["actor_rollout_ref.actor.ppo_epochs"] == 3
    assert o["trainer.total_training_steps"] == s.steps and o["algorithm.adv_estimator"] == "grpo"
    assert o["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
    assert o["actor_rollout_ref.actor.use_kl_loss"] is True and o["actor_rollout_ref.actor.kl_loss_coef"] == 0.01
    r = recipe(cfg, trainer="openrlhf", rho=rho, full_run_budget=1e13)
    f, s = r.settings, r.schedule
    assert f["--train.batch_size"] == f["--rollout.batch_size"] * f["--rollout.n_samples_per_prompt"]
    assert f["--train.max_epochs"] == 3 and f["--data.max_samples"] == s.steps * s.prompts_per_step
    assert f["--algo.advantage.estimator"] == "group_norm" and f["--algo.kl.init_coef"] == 0.01
    assert len(r.notes) == 6 and "token-level" in r.notes[1] and "\n" not in r.notes[1]   # no per-sequence mean
    assert "issue #1349" in r.notes[0] and "race recipe --for verl" in r.notes[0]   # LoRA + vLLM at 0.11.0
    # the watch: a validation every K steps (20 over the run), and the function for the means it logs
    assert f["--eval.steps"] == max(1, round(s.steps / 20)) and "race.fullrun.watch.check_means(" in r.notes[2]
    assert o["trainer.test_freq"] == max(1, round(v.schedule.steps / 20)) and o["trainer.val_before_train"] is True
    assert o["trainer.validation_data_dir"] == "race_watch_val" and "race.fullrun.watch.verl_history(" in " ".join(v.notes)
    assert r.notes[3].startswith("data and reward: the paths under RACE_EMIT_DIR are placeholders")
    assert r.notes[4].startswith("stability at F (10 × B): not tested: no pilot has run yet")   # a config
    # a constant rate over 10 pilot budgets: the rate for F is cosine decay (race.stats.rate, rule 3), used
    assert r.notes[5].startswith("rate for F: η ") and "cosine decay to 0 with 5% warm-up" in r.notes[5]
    assert f["--actor.lr_scheduler"] == "cosine" and f["--actor.lr_warmup_ratio"] == 0.05
    assert o["actor_rollout_ref.actor.optim.lr_scheduler_type"] == "cosine"


def test_every_recipe_carries_one_stability_line_at_f():
    """A config: not tested (no pilot ran). Results whose pilots all held: stable under LONG_RUN
    pilot budgets, not tested at or past it; results with a fallen pilot: at risk, naming it."""
    from dataclasses import replace

    from race.stats.instability import LONG_RUN
    from race.stats.results import load_results

    cfg = tiny_config()
    rho = on_policy_rho(cfg)
    lines = [n for n in recipe(cfg, trainer="trl", rho=rho, full_run_budget=LONG_RUN * cfg.budget).notes
             if n.startswith("stability at F")]
    assert len(lines) == 1 and "no pilot has run yet" in lines[0]
    src = os.path.join(os.path.dirname(RESULTS), "tiny-reasoner.results.json.gz")     # .json.gz is read too
    b = float(load_results(src).config["budget"])
    lines = [n for n in recipe(src, trainer="trl", full_run_budget=2 * b).notes if n.startswith("stability at F")]
    assert len(lines) == 1 and lines[0].startswith("stability at F (2 × B): AT RISK: 1 of 12 pilots fell back on "
                                                   "their held-out checkpoints (ρ 0.40: 1 of 3)")
    assert "lower η" in lines[0] and "race.fullrun.watch" in lines[0]


@pytest.mark.parametrize("trainer", TRAINERS)
def test_steps_spend_the_full_run_as_the_trainer_counts_it(trainer):
    rec = recipe(dict(presets.DEFAULT), trainer=trainer, rho=0.85, full_run_budget=6e12)
    step = rec.flops_per_step.total
    assert 6e12 - step < rec.flops.total <= 6e12
    assert rec.flops.rho == pytest.approx(rec.flops_per_step.rho)
    assert 0 < rec.flops.rho < 1 and 0 < rec.planned.rho < 1


def test_trl_without_prefix_sharing_gets_a_lower_rho_than_race_counts():
    rec = recipe(dict(presets.DEFAULT), trainer="trl", rho=0.85, full_run_budget=6e12)
    verl = recipe(dict(presets.DEFAULT), trainer="verl", rho=0.85, full_run_budget=6e12)
    assert rec.flops_per_step.search > verl.flops_per_step.search     # a prefill per rollout
    text = render_recipe(rec)
    assert f"ρ = {rec.flops.rho:.3f} as run" in text and f"{rec.planned.rho:.3f}" in text


@pytest.mark.parametrize("trainer", TRAINERS)
def test_keep_is_inexpressible_one_line_and_the_nearest_recipe(trainer):
    rec = recipe(dict(presets.DEFAULT), trainer=trainer, rho=0.5, full_run_budget=6e12)
    assert rec.asked is not None and rec.asked.n_train < rec.asked.n_gen           # RACE: 2 of 8
    s = rec.schedule
    assert s.n_gen == s.n_train >= 2                                                 # every rollout trained
    note = rec.notes[0]
    assert "\n" not in note and "lower_rho_by: keep" in note and "nearest expressible" in note
    assert f"ρ={rec.planned.rho:.3f}" in note
    # nearest: no expressible (n, μ) is closer to the asked ρ than the one chosen
    cfg = config_from_dict(dict(presets.DEFAULT))
    cm = CostModel(cfg, policy_arch(cfg), reward_spec(cfg), cfg.prompt_len, cfg.completion_len)
    best = min(abs(cm.cost(n, mu, n).per_prompt.rho - 0.5) for n in range(2, 9) for mu in range(1, 9))
    assert abs(rec.planned.rho - 0.5) <= best + 1e-12
    assert note in render_recipe(rec)


def test_results_use_the_recommended_rho():
    from race.stats.results import load_results

    res = load_results(RESULTS)
    d = res.diagnosis
    # a full run of one pilot budget: nothing moves, the verdict's ρ at B. A closed range (this
    # file's verdict): its centre; an open one would give its grid-edge point
    rec = recipe(RESULTS, trainer="trl", full_run_budget=res.config["budget"])
    assert d.open_side is None and rec.rho == pytest.approx(round(sum(d.rho_range) / 2, 4))
    assert rec.rho == pytest.approx(round(d.recommended_rho, 4))
    # longer: the range at F (race.stats.drift), said in the first note
    far = recipe(RESULTS, trainer="trl", full_run_budget=1e13)
    assert far.rho != rec.rho and far.notes[0].startswith(f"ρ={far.rho:g} is the recommended ρ of the range at F")
    assert rec.prompt_len == 6.0 and rec.completion_len == pytest.approx(21.50390625)   # calibrated lengths
    assert recipe(os.path.dirname(RESULTS) + "/tiny-steps-sparse.results.json", trainer="verl",
                  full_run_budget=1e13, rho=0.7).rho == 0.7


# ----------------------------------------------------------------------------- CLI

def test_cli_text_yaml_json(tmp_path):
    r = run("recipe", RESULTS, "--for", "trl", "--full-run", "1e13")
    assert r.exit_code == 0, r.output
    assert "GRPOConfig(" in r.output and "num_iterations=" in r.output and "as run" in r.output
    j = run("recipe", RESULTS, "--for", "verl", "--full-run", "1e13", "--format", "json")
    d = json.loads(j.output)
    assert d["settings"]["algorithm.adv_estimator"] == "grpo" and d["flops"]["total"] <= 1e13
    import yaml

    y = run("recipe", RESULTS, "--for", "verl", "--full-run", "1e13", "--format", "yaml")
    assert yaml.safe_load(y.output)["actor_rollout_ref"]["rollout"]["n"] == d["schedule"]["n_gen"]
    # OpenRLHF's trainer reads flags only: a YAML of them could not be loaded, so it is refused
    o = run("recipe", RESULTS, "--for", "openrlhf", "--full-run", "1e13", "--format", "yaml")
    assert o.exit_code == 2 and "takes command-line flags only (it has no --config)" in o.output


def test_cli_config_needs_rho_and_uses_its_full_run_budget(tmp_path):
    import yaml

    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({**presets.DEFAULT, "full_run_budget": 6e12}))
    ok = run("recipe", str(path), "--for", "trl", "--rho", "0.74")
    assert ok.exit_code == 0, ok.output
    assert "full run 6e+12" in ok.output
    r = run("recipe", str(path), "--for", "trl")
    assert r.exit_code == 2 and "--rho" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args,msg", [
    (("--for", "deepspeed-chat", "--full-run", "1e13"), "trainer 'deepspeed-chat' is unknown"),
    (("--for", "trl"), "no full-run budget"),
    (("--for", "trl", "--full-run", "1e13", "--rho", "1.5"), "ρ=1.5 is outside (0, 1)"),
    (("--for", "trl", "--full-run", "1e13", "--rho", "abc"), "ρ 'abc' is not a number"),
    (("--for", "trl", "--full-run", "-2"), "--full-run '-2' must be a positive"),
    (("--for", "trl", "--full-run", "10"), "below one TRL step"),
])
def test_cli_bad_input_exit_2_one_line(args, msg):
    r = run("recipe", RESULTS, *args)
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_cli_results_without_diagnosis():
    r = run("recipe", NO_DIAGNOSIS, "--for", "trl", "--full-run", "1e13")
    assert r.exit_code == 2 and "hold no diagnosis" in r.output and len(r.output.strip().splitlines()) == 1


def test_api_errors_are_race_errors():
    with pytest.raises(RaceError, match="trainer 'x' is unknown"):
        recipe(RESULTS, trainer="x", full_run_budget=1e13)
    with pytest.raises(RaceError, match="no verdict"):
        recipe(dict(presets.DEFAULT), trainer="trl", full_run_budget=1e13)


def test_race_recipe_is_the_api_and_import_race_stays_light():
    import subprocess
    import sys

    import race

    assert race.recipe(RESULTS, trainer="openrlhf", full_run_budget=1e13).trainer == "openrlhf"
    code = "import race, sys; race.recipe; print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_a_warmup_stable_decay_rate_is_trl_native_and_the_nearest_decay_elsewhere():
    """learning_rate.schedule wsd: TRL gets transformers' warm-up–stable–decay with RACE's decay
    length (linear to 0); verl and OpenRLHF, which cannot pass a decay length, cosine with a note."""
    cfg = tiny_config()
    d = cfg.to_dict()
    wsd = config_from_dict({**d, "learning_rate": {**d["learning_rate"], "schedule": "wsd", "warmup": 0.05,
                                                   "decay": 0.25}})
    rho = on_policy_rho(cfg)
    trl = recipe(wsd, trainer="trl", rho=rho, full_run_budget=3 * cfg.budget)
    steps = trl.settings["max_steps"]
    assert trl.settings["lr_scheduler_type"] == "warmup_stable_decay"
    assert trl.settings["lr_scheduler_kwargs"] == {"num_decay_steps": max(1, round(0.25 * steps)),
                                                   "decay_type": "linear"}
    for trainer, key in (("verl", "actor_rollout_ref.actor.optim.lr_scheduler_type"), ("openrlhf", "--actor.lr_scheduler")):
        r = recipe(wsd, trainer=trainer, rho=rho, full_run_budget=3 * cfg.budget)
        flat = r.settings
        assert flat[key] == "cosine"
        assert any("wsd" in n and "cosine" in n for n in r.notes)


def test_every_recipe_is_sized_for_its_gpus_with_the_trainers_mandatory_fields():
    """--gpus × --nodes: verl and OpenRLHF batches split evenly over the GPUs (prompts per step raised
    to the next count that does, the steps absorbing it), verl's mandatory rollout name and LoRA load
    format, its GPU and node counts and enough epochs; OpenRLHF's vLLM engines and actor GPUs, its
    integer LoRA alpha; TRL's accumulation over its processes."""
    cfg = tiny_config(mu=1, micro=None)
    rho = on_policy_rho(cfg, mu=1)
    for gpus, nodes in ((8, 1), (3, 2), (1, 1)):
        world = gpus * nodes
        v = recipe(cfg, trainer="verl", rho=rho, full_run_budget=1e13, gpus=gpus, nodes=nodes)
        o, s = v.settings, v.schedule
        assert o["actor_rollout_ref.rollout.name"] == "vllm" and o["actor_rollout_ref.rollout.load_format"] == "safetensors"
        assert (o["trainer.n_gpus_per_node"], o["trainer.nnodes"]) == (gpus, nodes)
        assert o["trainer.total_epochs"] >= o["trainer.total_training_steps"] == s.steps
        per_gpu = s.prompts_per_step * s.n_gen // world
        assert (s.prompts_per_step * s.n_gen) % world == 0 and per_gpu % o["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == 0
        r = recipe(cfg, trainer="openrlhf", rho=rho, full_run_budget=1e13, gpus=gpus, nodes=nodes)
        f, s = r.settings, r.schedule
        assert f["--vllm.num_engines"] == world and (f["--actor.num_gpus_per_node"], f["--actor.num_nodes"]) == (gpus, nodes)
        assert f["--train.batch_size"] % (f["--train.micro_batch_size"] * world) == 0
        assert isinstance(f["--ds.lora.alpha"], int)
        t = recipe(cfg, trainer="trl", rho=rho, full_run_budget=1e13, gpus=gpus, nodes=nodes).settings
        assert t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] * world == s.prompts_per_step * s.n_gen
    odd = recipe(cfg, trainer="verl", rho=rho, full_run_budget=1e13, gpus=7)
    assert (odd.schedule.prompts_per_step * odd.schedule.n_gen) % 7 == 0
    assert any(n.startswith(f"prompts per step {cfg.schedule.prompts_per_step} → ") for n in odd.notes)
    assert odd.flops.total <= 1e13
    half = recipe(replace(cfg, lora=replace(cfg.lora, alpha=8.5)), trainer="openrlhf", rho=rho, full_run_budget=1e13)
    assert half.settings["--ds.lora.alpha"] == 8 and any("lora.alpha 8.5" in n for n in half.notes)
    with pytest.raises(RaceError, match="gpus 0 is not a whole number"):
        recipe(cfg, trainer="verl", rho=rho, full_run_budget=1e13, gpus=0)


def test_emit_writes_the_tasks_splits_and_races_reward_for_each_trainer(tmp_path):
    """race recipe --emit DIR: the training and held-out splits RACE's pilots use, in the trainer's
    format, and race_reward.py under the trainer's three signatures giving RACE's reward; the recipe
    points at them and sets the passes over the data the step count needs. Without --emit: placeholders
    that do not exist, and the note naming --emit; a reward model is refused."""
    import importlib.util

    import pyarrow.parquet as pq

    from race.fullrun.emit import epochs
    from race.tasks import load_task

    from race.stats.results import load_results

    task = load_results(RESULTS).config["task"]
    train, held = load_task(task, split="train"), load_task(task, split="eval")
    for trainer in TRAINERS:
        out = tmp_path / trainer
        rec = recipe(RESULTS, trainer=trainer, full_run_budget=6e12, emit_dir=str(out))
        s = rec.schedule
        if trainer == "verl":
            rows = pq.read_table(out / "data" / "train.parquet").to_pylist()
            assert rows[0]["prompt"] == [{"role": "user", "content": train[0].prompt}]
            assert rows[0]["reward_model"]["ground_truth"] == train[0].answer and len(rows) == len(train)
            assert pq.read_table(out / "data" / "test.parquet").num_rows == len(held)
            assert rec.settings["trainer.total_epochs"] == epochs(s.steps, s.prompts_per_step, len(train))
            # verl 0.9 reads the reward function under reward. only (main_ppo no longer migrates the old key)
            assert rec.settings["reward.custom_reward_function.path"] == str(out / "race_reward.py")
            assert not any(k.startswith("custom_reward_function") for k in rec.settings)
            assert rec.settings["actor_rollout_ref.model.path"] == str(out / "model")        # the shipped policy, copied
        else:
            lines = (out / "data" / "train.jsonl").read_text().splitlines()
            # the shipped policy has a chat template, which RACE's pilots apply (chat_template auto): TRL gets the
            # conversational form, OpenRLHF the text with --data.apply_chat_template (it makes the user turn)
            prompt = [{"role": "user", "content": train[0].prompt}] if trainer == "trl" else train[0].prompt
            assert len(lines) == len(train) and json.loads(lines[0]) == {"prompt": prompt, "answer": train[0].answer}
        if trainer == "openrlhf":
            f = rec.settings
            drawn = f["--train.num_episodes"] * min(f["--data.max_samples"], len(train))
            assert 0.98 * s.steps * s.prompts_per_step <= drawn <= s.steps * s.prompts_per_step
            assert f["--actor.model_name_or_path"] == str(out / "model")
            assert f["--reward.remote_url"] == str(out / "race_reward.py") and f["--data.apply_chat_template"] is True
        if trainer == "trl":
            assert rec.model["dataset_name"] == str(out / "data") and rec.model["reward_funcs"] == ["race_reward.reward"]
        assert any(f"the training split holds {len(train):,}" in n for n in rec.notes)
        spec = importlib.util.spec_from_file_location(f"race_reward_{trainer}", out / "race_reward.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        p = train[0]
        assert mod.compute_score("race", p.answer, p.answer) == 1.0 and mod.compute_score("race", "x", p.answer) == 0.0
        assert mod.reward([p.answer, "x"], [p.answer, p.answer]) == [1.0, 0.0]
        assert mod.reward([[{"role": "assistant", "content": c}] for c in (p.answer, "x")], [p.answer] * 2,
                          prompts=[[{"role": "user", "content": p.prompt}]] * 2) == [1.0, 0.0]
        assert mod.reward_func([p.prompt + p.answer], [p.prompt], [p.answer])["rewards"].tolist() == [1.0]
    bare = recipe(RESULTS, trainer="verl", full_run_budget=6e12)
    assert bare.settings["data.train_files"].startswith("RACE_EMIT_DIR/") and not os.path.exists("RACE_EMIT_DIR")
    assert any("race recipe … --emit DIR" in n for n in bare.notes)
    prm = config_from_dict({**presets.DEFAULT, "reward": {"kind": "prm", "model": "race/tiny-prm-s"}})
    with pytest.raises(RaceError, match="reward.kind 'prm' is a reward model"):
        recipe(prm, trainer="verl", rho=0.6, full_run_budget=6e12, emit_dir=str(tmp_path / "prm"))
    assert not (tmp_path / "prm").exists()


def _trl_split():
    """bench/trl_split.py: the emitted script run under a FlopCounterMode that also counts what stock
    FlopCounterMode misses on CPU (SDPA's CPU kernel and its backward, TRL's in-place LM-head addmm_),
    phase by phase, and RACE's statement in that counter's conventions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trl_split", os.path.join(ROOT, "bench", "trl_split.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_split(bench, cfg, m):
    """Measured = stated within 2 %: search, learning and each phase of each generation batch, with the
    statement (race.fullrun.recipes.trainer_step_cost) at the batch's padded lengths, T² attention and the LM head
    where TRL ran it; TRL padded every row to the batch's longest prompt and completion."""
    want = bench.stated(cfg, m["batches"])
    assert m["search"] == pytest.approx(want.search, rel=0.02)
    assert m["learning"] == pytest.approx(want.learning, rel=0.02)
    assert m["missed"]["search"] > 0 and m["missed"]["learning"] > 0       # what stock FlopCounterMode misses
    assert m["other"] == 0                                                  # every FLOP falls in a phase
    for b in m["batches"]:
        assert b["prefill"] == (b["rows"], b["P"]) and b["decode_steps"] == b["C"] - 1
        assert {(x["width"], x["keep"]) for p in ("old_logprob", "forward")
                for x in b["phases"][p]["shapes"]} == {(b["P"] + b["C"], b["C"])}
        assert sum(x["rows"] for x in b["phases"]["forward"]["shapes"]) == cfg.schedule.mu * b["rows"]
        for name, flops in bench.stated_phases(cfg, b).items():
            assert b["phases"][name]["flops"] == pytest.approx(flops, rel=0.02), name
    return want


def test_the_emitted_trl_script_runs_and_its_flops_match_the_statement_at_the_lengths_run(tmp_path):
    """race recipe --for trl --emit DIR writes train_trl.py; two of its steps run here on the shipped
    policy, completions of the length the policy gives (no forced length), under FlopCounterMode.
    Generation FLOPs are search, the rest learning, and each phase matches RACE's statement for TRL
    (race.fullrun.recipes.trainer_step_cost) at each batch's padded lengths, within 2 %: that checks the
    LM-head recompute and the batch-wide padding at more than one length."""
    bench = _trl_split()
    cfg = tiny_config(mu=2, micro=None)
    m = bench.run_emitted(cfg, on_policy_rho(cfg, mu=2), tmp_path, logging_steps=1)
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["trainer"] == "trl"
    _check_split(bench, cfg, m)


@pytest.mark.slow
@pytest.mark.parametrize("triton_head", [False, True], ids=["cpu-head", "triton-head"])
def test_the_emitted_trl_script_on_the_reasoner_with_lengths_varying_within_a_batch(tmp_path, triton_head):
    """The same on race/tiny-reasoner (BPE vocabulary of 702, worked solutions up to 160 tokens whose
    lengths differ within a generation batch, so padding is in play), μ = 2: with TRL's fused LM head as
    it runs on CPU (every position but the last) and as on CUDA (only the real completion tokens)."""
    bench = _trl_split()
    cfg = bench.reasoner_config(mu=2)
    m = bench.run_emitted(cfg, bench.on_policy_rho(cfg), tmp_path, logging_steps=1, triton_head=triton_head)
    assert any(len(set(b["lengths"])) > 1 for b in m["batches"])          # lengths varied inside a batch
    _check_split(bench, cfg, m)


def test_a_qwen2_moe_recipe_says_peft_022_adapts_the_routed_experts_its_split_does_not_count(tmp_path):
    config = {"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 96, "moe_intermediate_size": 48,
              "shared_expert_intermediate_size": 80, "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 101}
    (tmp_path / "config.json").write_text(json.dumps(config))
    moe = {**dict(presets.DEFAULT), "model": str(tmp_path)}
    rec = recipe(moe, trainer="trl", rho=0.6, full_run_budget=6e12)
    assert [n for n in rec.notes if "peft ≥ 0.22" in n and "routed experts" in n]
    attention_only = recipe({**moe, "lora": {"rank": 8, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}},
                            trainer="trl", rho=0.6, full_run_budget=6e12)
    assert not [n for n in attention_only.notes if "routed experts" in n]
    assert not [n for n in recipe(dict(presets.DEFAULT), trainer="trl", rho=0.6, full_run_budget=6e12).notes
                if "routed experts" in n]
