"""The learning-rate schedule over a run's own optimizer steps (learning_rate.schedule / warmup)."""
import math

import pytest

from race.config.configfile import ConfigError, config_from_dict
from race.flops.grid import lr_factor


def test_factors_by_hand():
    # 10 optimizer steps, 20 % warm-up: W = 2 steps rising 0, 1/2; then decay over the other 8
    f = [lr_factor(t, total=10, schedule="linear", warmup=0.2) for t in range(12)]
    assert f == pytest.approx([0, 0.5, 1, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8, 1 / 8, 1 / 8])
    c = [lr_factor(t, total=10, schedule="cosine", warmup=0.2) for t in range(10)]
    assert c == pytest.approx([0, 0.5] + [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)])
    assert c[2] == 1.0 and c[6] == pytest.approx(0.5)                   # half-way through the decay
    assert [lr_factor(t, total=10, schedule="constant", warmup=0.2) for t in range(4)] == [0, 0.5, 1, 1]
    assert {lr_factor(t, total=7) for t in range(9)} == {1.0}           # the default: constant, no warm-up
    assert [lr_factor(t, total=4, schedule="linear") for t in range(4)] == [1, 0.75, 0.5, 0.25]
    # warm-up–stable–decay: 10 steps, 20 % warm-up (2), 30 % decay (3 steps: 3/3, 2/3, 1/3)
    w = [lr_factor(t, total=10, schedule="wsd", warmup=0.2, decay=0.3) for t in range(11)]
    assert w == pytest.approx([0, 0.5, 1, 1, 1, 1, 1, 1, 2 / 3, 1 / 3, 1 / 3])


def test_factors_are_transformers_schedules():
    import torch
    from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)

    total, warmup = 37, 0.1                                             # W = round(3.7) = 4
    for name, make in (("constant", lambda o: get_constant_schedule_with_warmup(o, 4)),
                       ("linear", lambda o: get_linear_schedule_with_warmup(o, 4, total)),
                       ("cosine", lambda o: get_cosine_schedule_with_warmup(o, 4, total))):
        sched = make(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0))
        assert [sched.lr_lambdas[0](t) for t in range(total)] == \
            [lr_factor(t, total=total, schedule=name, warmup=warmup) for t in range(total)], name
    from transformers.optimization import get_wsd_schedule

    # W = 4, D = round(0.2 · 37) = 7 decay steps, linear to 0: transformers' WSD with min_lr_ratio 0
    sched = get_wsd_schedule(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), 4, 7,
                             num_stable_steps=total - 4 - 7, decay_type="linear", min_lr_ratio=0.0)
    got = [lr_factor(t, total=total, schedule="wsd", warmup=warmup, decay=0.2) for t in range(total)]
    assert got == pytest.approx([sched.lr_lambdas[0](t) for t in range(total)], abs=1e-12)


def test_schedule_settings_and_errors():
    cfg = config_from_dict({"model": "m", "budget": 1e12})
    assert (cfg.learning_rate.schedule, cfg.learning_rate.warmup) == ("constant", 0.0)
    cfg = config_from_dict({"model": "m", "budget": 1e12, "learning_rate": {"schedule": "cosine", "warmup": 0.05}})
    assert (cfg.learning_rate.schedule, cfg.learning_rate.warmup) == ("cosine", 0.05)
    import yaml

    raw = yaml.safe_load("model: m\nbudget: 1e12\nlearning_rate: {schedule: linear, warmup: 5e-2}\n")
    assert config_from_dict(raw).learning_rate.warmup == 0.05                # YAML's "5e-2" string
    for lr, msg in [({"warmup": "soon"}, "learning_rate.warmup 'soon' must be a share"),
                    ({"schedule": "step"}, "learning_rate.schedule 'step' is unknown: expected one of constant"),
                    ({"warmup": 1.0}, r"learning_rate.warmup 1.0 must be a share .* in \[0, 1\)"),
                    ({"warmup": -0.1}, "learning_rate.warmup -0.1"), ({"warmup": True}, "learning_rate.warmup True"),
                    ({"schedule": "wsd", "decay": 0}, r"learning_rate.decay 0(\.0)? must be a share .* in \(0, 1\]"),
                    ({"schedule": "wsd", "warmup": 0.5, "decay": 0.6}, "learning_rate.decay 0.6 .* beside the warm-up"),
                    ({"decay": "late"}, "learning_rate.decay 'late' must be a share")]:
        with pytest.raises(ConfigError, match=msg):
            config_from_dict({"model": "m", "budget": 1e12, "learning_rate": lr})


def test_a_pilot_steps_its_rate_once_per_optimizer_step(torch_one_thread):
    """4 GRPO steps × μ 2 = 8 optimizer steps, 25 % warm-up then linear decay: the rate each
    optimizer step ran with is η · (0, 1/2, 1, 5/6, 4/6, 3/6, 2/6, 1/6), by hand."""
    from dataclasses import replace

    from race.config import presets
    from race.run.api import build_config
    from race.flops.grid import plan_grid
    from race.engine.seed_axis import SeedAxisEngine
    from race.tasks import load_task

    raw = {**presets.DEFAULT, "budget": 1e10, "seeds": 1}
    cfg = build_config({**raw, "learning_rate": {**raw["learning_rate"], "schedule": "linear", "warmup": 0.25}})
    schedule = replace(plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[3], steps=4)
    assert schedule.mu == 2
    engine = SeedAxisEngine(cfg, schedule, [0])
    seen = []
    engine.optimizers[0].register_step_pre_hook(lambda opt, *_: seen.append(opt.param_groups[0]["lr"]))
    train = load_task(cfg.task, split="train", n=32, seed=0)
    for k in range(4):
        engine.step([0], [train[8 * k:8 * k + 8]])
    eta = schedule.learning_rate
    assert seen == pytest.approx([eta * f for f in (0, 1 / 2, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6)], rel=1e-12)
    # the default, constant without warm-up, adds no scheduler: the optimizer runs exactly as before
    assert SeedAxisEngine(build_config(raw), schedule, [0]).lr_schedulers == [None]


def test_the_plan_names_a_schedule_and_the_default_says_nothing():
    from conftest import TINY_MODEL
    from race.config.configfile import GridConfig, LearningRate
    from race.flops.grid import plan_grid
    from race.stats.report import render_plan

    cfg = GridConfig(model=TINY_MODEL, budget=1.5e12, prompt_len=6, completion_len=4, grid=(0.5, 0.6, 0.75),
                     learning_rate=LearningRate(schedule="cosine", warmup=0.05))
    assert ("learning rate: cosine decay to 0 after a 5% warm-up over each pilot's own optimizer steps"
            in render_plan(plan_grid(cfg)))
    assert "learning rate:" not in render_plan(plan_grid(GridConfig(model=TINY_MODEL, budget=1.5e12, prompt_len=6,
                                                                      completion_len=4, grid=(0.5, 0.6, 0.75))))
