"""The recipes checked against the trainers' own schemas (issue 35): verl's overrides composed with
its ``ppo_trainer.yaml`` through Hydra and every value resolved; OpenRLHF's flags parsed by its own
argument parser. The trainers' sources are their release wheels, unpacked and not installed
(.ci/trainers.sh puts them in $RACE_TRAINER_SOURCES; CI fails without them). TRL's check (its
``GRPOConfig`` and ``TrlParser``) is in tests/test_recipe.py, TRL being installed."""
from __future__ import annotations

import ast
import glob
import os
from dataclasses import replace

import pytest

from conftest import ROOT, hydra_overrides, require
from race.fullrun.recipes import recipe

SOURCES = os.environ.get("RACE_TRAINER_SOURCES") or os.path.join(ROOT, ".ci", "cache", "trainers")
RESULTS = os.path.join(ROOT, "docs", "runs", "default.results.json.gz")
REASONER = os.path.join(ROOT, "docs", "runs", "tiny-reasoner.results.json.gz")
# keys verl marks mandatory (`???`) in sections a GRPO recipe without a reward model never reads
UNUSED_MANDATORY = {"reward.reward_model.rollout.name"}


def _recipes(trainer: str):
    """Recipes over the axes that change their keys: the default grid and the reasoner, 8 GPUs and
    an odd shape, β > 0, a dr_grpo loss, μ > 1."""
    from race.config.configfile import config_from_dict
    from race.stats.results import load_results

    yield recipe(RESULTS, trainer=trainer, full_run_budget=6e12)
    yield recipe(REASONER, trainer=trainer, full_run_budget=1e14, gpus=3, nodes=2)
    cfg = config_from_dict(load_results(RESULTS).config)
    kl = replace(cfg, grpo=replace(cfg.grpo, beta=0.04, loss_agg="dr_grpo", advantage="dr_grpo"),
                 lora=replace(cfg.lora, alpha=12.5))
    yield recipe(kl, trainer=trainer, full_run_budget=6e12, rho=0.8, gpus=4)


def _verl_config_dir() -> str:
    path = os.path.join(SOURCES, "verl", "verl", "trainer", "config")
    require(os.path.isfile(os.path.join(path, "ppo_trainer.yaml")), f"verl 0.9.1's config (in {SOURCES})")
    return path


def test_verl_overrides_compose_with_its_config_and_resolve():
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    config_dir = _verl_config_dir()
    for rec in _recipes("verl"):
        overrides = hydra_overrides(rec.settings)
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)    # an unknown key raises here
        assert set(OmegaConf.missing_keys(cfg)) <= UNUSED_MANDATORY, OmegaConf.missing_keys(cfg)
        resolved = OmegaConf.to_container(cfg, resolve=True)             # every interpolation resolves
        s, world = rec.schedule, rec.extra["gpus"] * rec.extra["nodes"]
        actor = resolved["actor_rollout_ref"]["actor"]
        assert resolved["actor_rollout_ref"]["rollout"]["name"] == "vllm"
        assert resolved["trainer"]["n_gpus_per_node"] * resolved["trainer"]["nnodes"] == world
        # verl's own normalisation (fsdp_workers): mini-batch × n over the GPUs, divisible by the micro-batch
        per_gpu = actor["ppo_mini_batch_size"] * resolved["actor_rollout_ref"]["rollout"]["n"] // world
        assert per_gpu > 0 and actor["ppo_mini_batch_size"] * s.n_gen % world == 0
        assert per_gpu % actor["ppo_micro_batch_size_per_gpu"] == 0
        assert resolved["trainer"]["total_epochs"] >= resolved["trainer"]["total_training_steps"] == s.steps
        # the reward function where verl 0.9.1's main_ppo reads it (reward.custom_reward_function), and
        # nothing left at the legacy top-level key, which 0.9.1's main_ppo ignores
        fn = resolved["reward"]["custom_reward_function"]
        assert fn["path"] == rec.settings["reward.custom_reward_function.path"] and fn["name"] == "compute_score"
        assert all(v is None for v in resolved["custom_reward_function"].values())
        # the reward manager from the emitted file (verl's importlib source), which decodes with the end-of-turn
        # marker; verl's RewardManagerConfig requires module.path for that source
        manager = resolved["reward"]["reward_manager"]
        assert manager["source"] == "importlib" and manager["name"] == "RaceRewardManager"
        assert manager["module"]["path"] == rec.settings["reward.reward_manager.module.path"]
        assert manager["module"]["path"].endswith("/race_verl_reward.py")


def _openrlhf_parser():
    """OpenRLHF 0.11's own parser: the statements of ``train_ppo_ray.py``'s ``__main__`` block from
    ``argparse.ArgumentParser()`` to ``parse_args()``, run as they are (no import of ray or torch)."""
    import argparse
    import datetime

    found = glob.glob(os.path.join(SOURCES, "openrlhf", "*", "purelib", "openrlhf", "cli", "train_ppo_ray.py"))
    require(bool(found), f"OpenRLHF 0.11.2's train_ppo_ray.py (in {SOURCES})")
    tree = ast.parse(open(found[0], encoding="utf-8").read())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    body = []
    for stmt in main.body:
        if "parse_args" in ast.unparse(stmt):
            break
        body.append(stmt)
    space = {"argparse": argparse, "datetime": datetime.datetime, "os": os}   # the module's own imports
    exec(compile(ast.Module(body=body, type_ignores=[]), found[0], "exec"), space)    # noqa: S102 — a pinned release
    return space["parser"]


def _argv(flags) -> list[str]:
    out = []
    for k, v in flags.items():
        if v is True:
            out.append(k)
        elif isinstance(v, (list, tuple)):
            out += [k, *map(str, v)]
        else:
            out += [k, str(v)]
    return out


def test_openrlhf_flags_parse_with_its_own_parser():
    parser = _openrlhf_parser()
    for rec in _recipes("openrlhf"):
        args = vars(parser.parse_args(_argv(rec.settings)))             # an unknown flag or a bad type exits
        f, world = rec.settings, rec.extra["gpus"] * rec.extra["nodes"]
        assert args["vllm.num_engines"] == world > 0 and args["ds.lora.rank"] == rec.schedule.lora_rank
        assert args["train.batch_size"] % (args["train.micro_batch_size"] * world) == 0
        assert args["rollout.n_samples_per_prompt"] == rec.schedule.n_gen > 1     # group_norm needs > 1
        assert isinstance(args["ds.lora.alpha"], int) and args["ds.lora.alpha"] == f["--ds.lora.alpha"]
