"""bench/recipe_gpu_e2e.py, the recipes end to end on a GPU (issue 51): what CPU can check of it here,
and the run itself marked ``gpu``.

- ``--dry-run`` writes a recipe per trainer whose full-run budget pays for exactly ``--steps`` steps
  (OpenRLHF: that many whole batches in one episode), and exits 0;
- the command lines it would start, the recipe's plus what it adds (verl's console logger and
  checkpoint folder, OpenRLHF's checkpoint folders), are accepted by verl 0.9.1's Hydra config and
  OpenRLHF 0.11.2's own parser;
- without a GPU and without ``--dry-run`` it stops in one line, exit 2; bad input, exit 2;
- on a GPU (``-m gpu``, TRL in this environment): 12 steps of a 0.5B policy from the emitted folder."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from test_trainer_schemas import _openrlhf_parser, _verl_config_dir

SCRIPT = os.path.join(ROOT, "bench", "recipe_gpu_e2e.py")


def _bench():
    spec = importlib.util.spec_from_file_location("recipe_gpu_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_writes_recipes_of_the_asked_steps_and_commands_the_trainers_accept(tmp_path):
    bench = _bench()
    out = tmp_path / "e2e"
    assert bench.main(["--dry-run", "--steps", "12", "--out", str(out), "--json", str(tmp_path / "rows.json")]) == 0
    rows = {r["trainer"]: r for r in json.loads((tmp_path / "rows.json").read_text())}
    assert {t: r["recipe_steps"] for t, r in rows.items()} == {"trl": 12, "verl": 12, "openrlhf": 12}
    assert all(r["flops"] <= r["F"] and r["skipped"] == "dry run" for r in rows.values())
    assert not (out / "policy" / "model.safetensors").exists()           # a dry run writes no weights
    cfg = bench.race_config(str(out / "policy"), "math", 128)
    recs = {t: json.loads((out / t / "recipe.json").read_text()) for t in rows}
    assert recs["trl"]["settings"]["max_steps"] == 12
    orl = bench.make_recipe(cfg, "openrlhf", 12, str(tmp_path / "orl"))[0]
    argv = bench.command(orl, "python", str(tmp_path))
    assert argv[:3] == ["python", "-m", "openrlhf.cli.train_ppo_ray"]
    args = vars(_openrlhf_parser().parse_args(argv[3:]))                 # an unknown flag exits
    assert args["data.max_samples"] * args["train.num_episodes"] == 12 * args["rollout.batch_size"]
    assert args["data.apply_chat_template"] is True

    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    verl = bench.make_recipe(cfg, "verl", 12, str(tmp_path / "verl"))[0]
    argv = bench.command(verl, "python", str(tmp_path))
    assert argv[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    with initialize_config_dir(config_dir=_verl_config_dir(), version_base=None):
        composed = OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=argv[3:]), resolve=True)
    assert composed["trainer"]["logger"] == ["console"] and composed["trainer"]["total_training_steps"] == 12


def test_without_a_gpu_or_with_bad_input_it_stops_in_one_line(tmp_path):
    import torch

    runs = [[sys.executable, SCRIPT, "--trainers", "trl,megatron", "--out", str(tmp_path)]]
    if not torch.cuda.is_available():
        runs.append([sys.executable, SCRIPT, "--trainers", "trl", "--out", str(tmp_path)])
    for argv in runs:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("recipe_gpu_e2e: ")


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(_no_cuda(), reason="needs a CUDA GPU")
def test_trl_trains_the_recipes_steps_of_a_05b_policy_on_a_gpu(tmp_path):
    bench = _bench()
    assert bench.main(["--trainers", "trl", "--steps", "12", "--out", str(tmp_path), "--json",
                       str(tmp_path / "rows.json")]) == 0
    row = json.loads((tmp_path / "rows.json").read_text())[0]
    assert row["passed"] and row["steps"] == row["want"] == 12 and len(row["rewards"]) == 12
