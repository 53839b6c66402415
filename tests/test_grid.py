import math

import pytest

from conftest import TINY_MODEL
from race.flops import formulas as F
from race.config.configfile import ConfigError, GridConfig, LearningRate, RewardSettings, ScheduleKnobs
from race.flops.grid import ENGINE_LEARNING_KW, grouped_learning, plan_grid, shares_prefix
from race.flops.catalog import load_arch


def tiny(**kw):
    base = dict(model=TINY_MODEL, budget=1.5e12, prompt_len=6, completion_len=4, seeds=3,
                grid=(0.45, 0.6, 0.75, 0.85, 0.92))
    base.update(kw)
    return GridConfig(**base)


def test_every_point_meets_rho_and_budget():
    plan = plan_grid(tiny())
    assert [s.rho_target for s in plan.schedules] == [0.45, 0.6, 0.75, 0.85, 0.92]
    for s in plan.schedules:
        assert abs(s.rho - s.rho_target) <= 0.02, s
        assert 0.98 * 1.5e12 <= s.flops.total <= 1.5e12, s
        assert s.n_train <= s.n_gen and s.mu >= 1 and s.steps >= 1
        # the schedule's FLOPs are its per-step FLOPs times the steps
        assert math.isclose(s.flops.total, s.flops_per_step.total * s.steps, rel_tol=1e-12)
    assert plan.grid_flops == pytest.approx(sum(s.flops.total for s in plan.schedules) * 3)


def test_low_rho_downsamples_high_rho_reuses():
    plan = plan_grid(tiny())
    low, high = plan.schedules[0], plan.schedules[-1]
    assert low.mu == 1 and low.n_gen > low.n_train
    assert high.mu > 1 and high.n_gen == high.n_train


def test_schedule_flops_recomputed_from_formulas():
    """The planner's breakdown is exactly the flops module's terms × B_p × steps."""
    cfg = tiny(grid=(0.6,))
    s = plan_grid(cfg).schedules[0]
    arch = load_arch(TINY_MODEL)
    lora = F.LoRASpec(rank=8)
    search = F.search_flops(arch, prompt_len=6, completion_len=4, n=s.n_gen, prefix_shared=True, lora=lora)
    def seq(p, c):
        return F.learning_flops(arch, prompt_len=p, completion_len=c, sequences=1, lora=lora, mu=s.mu,
                                **ENGINE_LEARNING_KW)
    # the lean update runs the prompt once per group: prompt cost once + n_train completions
    learning = seq(6, 0) + s.n_train * (seq(6, 4) - seq(6, 0))
    assert shares_prefix(cfg)
    assert learning == pytest.approx(grouped_learning([seq(6, 4)] * s.n_train, [seq(6, 0)], [0] * s.n_train,
                                                      shared_prefix=True))
    assert s.flops.search == pytest.approx(search * s.prompts_per_step * s.steps, rel=1e-12)
    assert s.flops.learning == pytest.approx(learning * s.prompts_per_step * s.steps, rel=1e-12)
    assert s.flops.reward == 0.0


def test_sqrt_batch_learning_rate_rule():
    plan = plan_grid(tiny(learning_rate=LearningRate(ref=1e-3, ref_batch=64)))
    for s in plan.schedules:
        assert s.learning_rate == pytest.approx(1e-3 * math.sqrt(s.prompts_per_step * s.n_train / 64))
    fixed = plan_grid(tiny(learning_rate=LearningRate(ref=1e-3, ref_batch=64, fixed=True)))
    assert {s.learning_rate for s in fixed.schedules} == {1e-3}


def test_unreachable_rho_names_value_and_reason():
    with pytest.raises(ConfigError, match=r"ρ=0.99 is unreachable: the highest reachable is 0\.9\d+ with μ ≤ 4"):
        plan_grid(tiny(grid=(0.5, 0.99), schedule=ScheduleKnobs(max_mu=4)))
    with pytest.raises(ConfigError, match=r"ρ=0.05 is unreachable: the lowest reachable"):
        plan_grid(tiny(grid=(0.05, 0.5)))
    with pytest.raises(ConfigError, match=r"ρ=0.6 is unreachable.*fixed knobs"):
        plan_grid(tiny(grid=(0.6, 0.85), schedule=ScheduleKnobs(mu=1, n_gen=8)))


def test_budget_too_small_for_one_step():
    with pytest.raises(ConfigError, match=r"budget 1e\+06 FLOPs is too small for one step at ρ=0.45"):
        plan_grid(tiny(budget=1e6))


def test_calibrated_lengths_override_config():
    a = plan_grid(tiny(grid=(0.6,)))
    b = plan_grid(tiny(grid=(0.6,)), prompt_len=12, completion_len=20)
    assert b.prompt_len == 12 and b.completion_len == 20
    assert b.schedules[0].flops_per_step.total / b.schedules[0].prompts_per_step > \
        a.schedules[0].flops_per_step.total / a.schedules[0].prompts_per_step


def test_real_model_plan_with_full_run_budget():
    cfg = GridConfig(model="Qwen/Qwen2.5-1.5B-Instruct", budget=2e16, full_run_budget=1e18,
                     prompt_len=150, completion_len=1024, seeds=2)
    plan = plan_grid(cfg)
    d = plan.to_dict()
    assert d["grid_cost_fraction"] == pytest.approx(plan.grid_flops / 1e18)
    for s in plan.schedules:
        assert abs(s.rho - s.rho_target) <= 0.02 and 0.98 * 2e16 <= s.flops.total <= 2e16


def test_reward_model_cost_enters_the_plan():
    """A PRM scores every generated rollout, so it takes a share and lowers reachable ρ."""
    cfg = GridConfig(model="Qwen/Qwen2.5-1.5B-Instruct", budget=2e16, prompt_len=150, completion_len=1024,
                     grid=(0.3, 0.45), reward=RewardSettings(kind="prm", model="Qwen/Qwen2.5-Math-PRM-7B"))
    plan = plan_grid(cfg)
    for s in plan.schedules:
        assert s.flops.reward > 0.2 * s.flops.total
        assert abs(s.rho - s.rho_target) <= 0.02


def test_planner_follows_the_engine_path():
    """Without the lean fast path each sequence carries its prompt: learning costs more per
    trained sequence, so the same ρ needs more generations."""
    from race.config.configfile import GRPOSettings

    lean = plan_grid(tiny(grid=(0.6,))).schedules[0]
    whole = plan_grid(tiny(grid=(0.6,), grpo=GRPOSettings(fast_path=False))).schedules[0]
    assert whole.n_gen > lean.n_gen


def test_keep_mode_lowers_rho_by_training_fewer_of_a_fixed_group():
    """lower_rho_by="keep": n_gen stays the group size, n_train falls (REFERENCES' knob)."""
    plan = plan_grid(tiny(grid=(0.49, 0.59, 0.72, 0.84),
                          schedule=ScheduleKnobs(n_train=8, lower_rho_by="keep")))
    got = [(s.n_gen, s.n_train, s.mu) for s in plan.schedules]
    assert got == [(8, 2, 1), (8, 4, 1), (8, 8, 1), (8, 8, 2)]
    for s in plan.schedules:
        assert abs(s.rho - s.rho_target) <= 0.02, s
    # fewer trained rollouts per step: more steps (distinct prompts) for the same FLOPs
    steps = [s.steps for s in plan.schedules]
    assert steps[0] > steps[1] > steps[2] > steps[3]


def test_keep_mode_unreachable_and_bad_values():
    with pytest.raises(ConfigError, match=r"ρ=0.1 is unreachable: the lowest reachable is 0\.\d+ keeping 2 of n_gen ≤ 64"):
        plan_grid(tiny(grid=(0.1,), schedule=ScheduleKnobs(n_train=8, lower_rho_by="keep")))
    from race.config.configfile import config_from_dict
    with pytest.raises(ConfigError, match="lower_rho_by must be 'generate' or 'keep', got 'drop'"):
        config_from_dict({"model": TINY_MODEL, "budget": 1e12, "schedule": {"lower_rho_by": "drop"}})
    with pytest.raises(ConfigError, match=r"min_n_train \(9\) must be ≤ the group size"):
        config_from_dict({"model": TINY_MODEL, "budget": 1e12,
                          "schedule": {"lower_rho_by": "keep", "min_n_train": 9}})


def test_held_out_evaluation_above_a_tenth_of_the_budget_is_a_warning_with_its_knobs():
    """(8 checkpoint evaluations × 100 prompts + the final 500) × 4 samples of the default grid's
    task: under 10 % of its 6e11 pilots, 56 % of a 6e10 one; off with fewer checkpoint prompts."""
    from race.flops import formulas as F
    from race.config import presets
    from race.config.configfile import config_from_dict
    from race.flops.grid import EVAL_SHARE_WARN, eval_share, plan_grid
    from race.flops.specs import lora_spec, policy_arch

    cfg = config_from_dict(presets.DEFAULT)
    arch = policy_arch(cfg)
    one = F.search_flops(arch, prompt_len=cfg.prompt_len, completion_len=cfg.completion_len, n=4,
                         prefix_shared=True, lora=lora_spec(cfg, arch))
    assert (cfg.eval.prompts, cfg.eval.samples) == (500, 4)
    assert eval_share(cfg, arch, cfg.prompt_len, cfg.completion_len) == pytest.approx(one * 1300 / 6e11)
    assert not [w for w in plan_grid(cfg).warnings if "held-out evaluation" in w]
    small = config_from_dict({**presets.DEFAULT, "budget": 6e10})
    (w,) = [w for w in plan_grid(small).warnings if "held-out evaluation" in w]
    share = eval_share(small, arch, small.prompt_len, small.completion_len)
    assert share > EVAL_SHARE_WARN and f"costs about {share:.0%} of a pilot's budget" in w
    assert "8 checkpoint evaluations of 100 prompts and the final one of 500, × 4 samples" in w
    assert "lower eval.checkpoint_prompts, eval.checkpoints or eval.samples" in w
    quiet = config_from_dict({**presets.DEFAULT, "budget": 6e10,
                              "eval": {**presets.DEFAULT.get("eval", {}), "checkpoints": 0, "prompts": 40}})
    assert not [w for w in plan_grid(quiet).warnings if "held-out evaluation" in w]
