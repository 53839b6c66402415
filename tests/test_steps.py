"""The step-structured task (arithmetic-steps), its step checker, the final-answer rule on
worked solutions, the PRM reward settings, and the step-task evaluation targets."""
from __future__ import annotations

import random

import pytest

from race.config.configfile import ConfigError, config_from_dict
from race.tasks.rewards import build_reward, dense, score_completions, sparse, structured
from race.tasks.rewards.rules import final_answer
from race.tasks import judges, load_task
from race.tasks.steps import (canonical_steps, corrupted_steps, parse_prompt, process_score, solution,
                              step_labels)


def test_canonical_solutions_by_hand():
    assert solution(47, 85) == "7+5+0=12;4+8+1=13;132"
    assert solution(12, 34) == "2+4+0=06;1+3+0=04;46"
    assert solution(5, 37) == "5+7+0=12;0+3+1=04;42"      # fixed width: every step x+y+c=ss
    assert solution(99, 99) == "9+9+0=18;9+9+1=19;198"
    assert solution(0, 7) == "0+7+0=07;0+0+0=00;7"
    p = load_task("arithmetic-steps", n=1, seed=3)[0]
    a, b = parse_prompt(p.prompt)
    assert len(p.prompt) == 6 and p.answer == str(a + b) and p.meta["solution"] == solution(a, b)


def test_step_labels_judge_each_step():
    assert step_labels("47+85=", "7+5+0=12;4+8+1=13;132</s><pad>") == [True, True, True]
    assert step_labels("47+85=", "7+5+0=12;4+8+0=12;122</s>") == [True, False, False]   # carry dropped
    assert step_labels("47+85=", "7+5+0=12;4+8+0=12;132</s>") == [True, False, True]    # right answer anyway
    assert step_labels("47+85=", "7+5+0=11;4+8+1=13;132") == [False, True, True]       # not terminated: still read
    assert step_labels("47+85=", "7+5+0=12;4+8+1=13;1+0+0=1;132</s>") == [True, True, False, True]  # extra step
    assert step_labels("47+85=", "7+5=12;4+8+1=13;132</s>") == [False, True, True]     # not the step format
    assert step_labels("47+85=", "132</s>") == [True]                                   # no work shown
    assert step_labels("47+85=", "</s>") == []
    assert process_score("47+85=", "7+5+0=12;4+8+0=12;132</s>") == pytest.approx(2 / 3)
    assert process_score("47+85=", "</s>") == 0.0


def test_final_answer_of_a_worked_solution():
    assert final_answer("7+5+0=12;4+8+1=13;132</s>") == ("132", True)
    assert final_answer("7+5+0=12;;4+8+1=13;132") == ("132", False)          # empty steps skipped
    assert final_answer("7+5+0=12;4+8+1=13;13x</s>") == ("7+5+0=12;4+8+1=13;13x", True)   # malformed: no answer
    assert final_answer("46</s>") == ("46", True) and final_answer("4;6</s>") == ("4;6", True)
    comps = ["7+5+0=12;4+8+1=13;132</s>", "7+5+0=12;4+8+0=12;132</s>", "7+5+0=12;4+8+0=12;122</s>"]
    assert [sparse("47+85=", c, "132") for c in comps] == [1.0, 1.0, 0.0]
    assert dense("47+85=", comps[2], "132") == pytest.approx(2 / 3)
    assert structured("47+85=", comps[2], "132") == pytest.approx(0.2)


def test_corruptions_are_wrong_where_the_rule_says():
    rng = random.Random(0)
    wrong = total = 0
    for p in load_task("arithmetic-steps", n=300, seed=0):
        a, b = parse_prompt(p.prompt)
        steps = corrupted_steps(a, b, rng)
        labels = step_labels(p.prompt, ";".join(steps))
        assert len(labels) == len(steps) == len(canonical_steps(a, b))
        assert labels == [s == c for s, c in zip(steps, canonical_steps(a, b))]
        wrong += labels.count(False)
        total += len(labels)
    assert 0.2 < wrong / total < 0.5


def test_step_task_targets():
    j = judges("arithmetic-steps")
    assert sorted(j) == ["final-answer", "process"]
    assert j["process"]("47+85=", "7+5+0=12;4+8+0=12;132</s>", "132") == pytest.approx(2 / 3)
    assert j["final-answer"]("47+85=", "7+5+0=12;4+8+0=12;132</s>", "132") == 1.0
    assert judges("arithmetic-easy") == {}


def _cfg(**reward):
    return config_from_dict({"model": "race/tiny-arith-steps", "budget": 1e11, "task": "arithmetic-steps",
                             "reward": reward})


def test_prm_reward_settings_are_validated():
    with pytest.raises(ConfigError, match="reward.aggregation 'max' is unknown"):
        _cfg(kind="prm", model="race/tiny-prm-s", aggregation="max")
    with pytest.raises(ConfigError, match="reward.kind 'proxy-prm' needs reward.model"):
        _cfg(kind="proxy-prm")
    with pytest.raises(ConfigError, match="reward.step_separator ''"):
        _cfg(kind="prm", model="race/tiny-prm-s", step_separator="")
    with pytest.raises(ConfigError, match="reward.batch_size 0"):
        _cfg(kind="prm", model="race/tiny-prm-s", batch_size=0)


def test_build_reward_gives_a_batched_prm():
    fn = build_reward(_cfg(kind="proxy-prm", model="race/tiny-prm-s", aggregation="min"))
    assert fn.step_separator == ";" and fn.aggregation == "min"       # the task's separator by default
    comps = ["7+5+0=12;4+8+1=13;132</s>", "7+5+0=12;4+8+0=12;122</s>"]
    batch = score_completions(fn, ["47+85="] * 2, comps, ["132"] * 2)
    steps, _ = fn.step_scores(["47+85="] * 2, comps)
    assert batch.scores == [min(s) for s in steps] and batch.scores[0] > batch.scores[1]
    assert batch.flops == fn.flops_of([28, 28]) and batch.errors == 0
    assert fn("47+85=", comps[0], "132") == pytest.approx(batch.scores[0])

    class Broken:
        def __call__(self, *a):
            return 1.0

        def score_batch(self, *a):
            raise RuntimeError("out of memory")
    bad = score_completions(Broken(), ["1+1="] * 3, ["2"] * 3, ["2"] * 3)
    assert bad.scores == [0.0] * 3 and bad.errors == 3 and "out of memory" in bad.first_error


def test_prm_pilot_meters_reward_share_and_step_targets():
    """A short real pilot with the larger tiny PRM: the reward share it measures (from the tokens
    the PRM read) matches the plan's and is ≥ 20 %; the step task's targets are evaluated."""
    from race.flops.grid import plan_grid
    from race.engine.pilot import run_pilot

    cfg = config_from_dict({
        "model": "race/tiny-arith-steps", "task": "arithmetic-steps", "budget": 2e10, "grid": [0.3],
        "seeds": 1, "lengths": {"prompt": 6, "completion": 21},
        "reward": {"kind": "prm", "model": "race/tiny-prm-l"}, "grpo": {"max_completion_len": 24},
        "schedule": {"prompts_per_step": 4, "n_train": 4}, "eval": {"prompts": 30, "samples": 2},
        "backend": "hf"})
    plan = plan_grid(cfg)
    planned = plan.schedules[0].flops.shares()["reward"]
    result = run_pilot(cfg, plan.schedules[0], seed=0)
    measured = result.flops.shares()["reward"]
    assert result.extra["steps"] >= 2 and planned >= 0.2 and measured >= 0.2
    assert measured == pytest.approx(planned, abs=0.05)
    assert {"reward", "pass@1", "process", "final-answer"} <= set(result.evals)
    assert all(len(v) == 30 for v in result.evals.values())
    assert result.evals["final-answer"] == result.evals["pass@1"]      # the reference is the final answer
    assert all(0.0 <= x <= 1.0 for v in result.evals.values() for x in v)


def test_step_pilot_configs_share_policy_task_grid_and_budget():
    """pilots/ has sparse, dense, proxy-PRM and PRM configs on the same policy, task, grid and
    budget; with the larger tiny PRM, reward takes ≥ 20 % of every planned grid point."""
    from pathlib import Path

    from race.config.configfile import load_config
    from race.flops.grid import plan_grid

    root = Path(__file__).resolve().parents[1] / "pilots"
    cfgs = {k: load_config(str(root / f"tiny-steps-{k}.yaml")) for k in ("sparse", "dense", "proxy-prm", "prm")}
    assert {c.reward.kind for c in cfgs.values()} == {"sparse", "dense", "proxy-prm", "prm"}
    for field in ("model", "task", "grid", "budget", "seeds", "lora", "schedule", "grpo", "eval"):
        assert len({repr(getattr(c, field)) for c in cfgs.values()}) == 1, field
    assert cfgs["prm"].reward.model == "race/tiny-prm-l" and cfgs["proxy-prm"].reward.model == "race/tiny-prm-s"
    shares = {k: [s.flops.shares()["reward"] for s in plan_grid(c).schedules] for k, c in cfgs.items()}
    assert min(shares["prm"]) >= 0.2 and min(shares["proxy-prm"]) > 0.05
    assert shares["sparse"] == shares["dense"] == [0.0] * len(cfgs["sparse"].grid)
    assert all(a > b for a, b in zip(shares["prm"], shares["proxy-prm"]))


def test_reward_heavy_advice_prices_the_feedback_levers():
    from race.core.records import FlopBreakdown, Regime
    from race.stats.regime import feedback_advice

    best = FlopBreakdown(search=30.0, learning=20.0, reward=50.0)
    (line,) = feedback_advice(best, regime=Regime.REWARD_HEAVY)
    assert "a proxy PRM 4× cheaper frees 38% of the budget" in line          # 0.5 · (1 − 1/4)
    assert "scoring half of the rollouts 25%" in line
    assert "this schedule's ρ would be 0.40 (measured 0.20)" in line         # 20 / (30 + 20) vs 20 / 100
    assert feedback_advice(best, regime=Regime.BALANCED) == []
