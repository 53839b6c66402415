"""A grid over policies (race.run.multimodel): the models: key, the paired bootstrap, the joint view,
and a two-policy grid run end to end through the CLI at a tiny budget."""
from __future__ import annotations

import json
import os
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from race.run.cli import main
from race.config.configfile import ConfigError, config_from_dict
from race.stats.fit import bootstrap_paired_grids, grid_scores
from race.run.multimodel import gave_up, joint_view, part_configs, part_labels, point_costs, render_joint
from race.config.presets import DEFAULT
from race.core.records import FlopBreakdown, Schedule
from race.stats.regime import classify
from race.stats.results import Results
from test_regime import FALLING, FLOPS_PER_PILOT, RISING, synthetic_results

BASE = {k: v for k, v in DEFAULT.items() if k != "model"}


def run(*args):
    return CliRunner().invoke(main, list(args))


# ----------------------------------------------------------------------------- config

def test_models_key_makes_one_config_per_policy():
    cfg = config_from_dict({**BASE, "models": ["race/tiny-arith-s", "race/tiny-arith", "race/tiny-arith-l"]})
    assert cfg.model == "race/tiny-arith-s" and len(cfg.models) == 3
    assert tuple(cfg.to_dict()["models"]) == cfg.models
    parts = part_configs(cfg)
    assert [label for label, _ in parts] == ["tiny-arith-s", "tiny-arith", "tiny-arith-l"]
    for (label, part), model in zip(parts, cfg.models):
        assert part.model == model and part.models == () and part.name == f"{DEFAULT['name']}--{label}"
        # everything but model and name is shared: the same budget, grid, seeds and held-out prompts
        same = {k: v for k, v in part.to_dict().items() if k not in ("model", "name")}
        assert same == {k: v for k, v in cfg.to_dict().items() if k not in ("model", "name", "models")}
    # a one-policy config reads as before models existed (stored studies and results unchanged)
    assert "models" not in config_from_dict(DEFAULT).to_dict()
    assert config_from_dict(DEFAULT).with_overrides(models="race/tiny-arith-s,race/tiny-arith").models == \
        ("race/tiny-arith-s", "race/tiny-arith")


def test_part_labels_are_distinct_and_folder_safe():
    assert part_labels(["Qwen/Qwen2.5-1.5B-Instruct", "/data/ckpt/", "other/ckpt", "race/tiny-arith"]) == \
        ["Qwen2.5-1.5B-Instruct", "ckpt", "ckpt-2", "tiny-arith"]


@pytest.mark.parametrize("raw,msg", [
    ({"models": "race/tiny-arith"}, "models ['race/tiny-arith'] names 1 policy: a grid over models needs at least 2"),
    ({"models": ["race/tiny-arith"]}, "names 1 policy"),
    ({"models": ["race/tiny-arith", "race/tiny-arith"]}, "repeats 'race/tiny-arith': expected distinct policies"),
    ({"models": ["race/tiny-arith", 7]}, "models entry 7 is not valid: expected a Hugging Face id"),
    ({"models": ["race/tiny-arith", ""]}, "models entry '' is not valid"),
    ({"models": {"a": 1}}, "models {'a': 1} is not valid: expected a list of at least 2 policies"),
    ({"models": ["race/tiny-arith", "race/tiny-arith-s"], "model": "race/tiny-arith"},
     "config has both 'model' and 'models'"),
])
def test_bad_models_are_one_line_config_errors(raw, msg):
    with pytest.raises(ConfigError) as e:
        config_from_dict({**BASE, **raw})
    assert msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("models,msg", [
    ("race/tiny-arith", "names 1 policy"),
    ("race/tiny-arith,race/no-such-model", "models 'race/no-such-model' is not a folder"),
])
def test_bad_models_on_the_command_line_exit_2_before_anything_is_written(tmp_path, models, msg):
    out = tmp_path / "run"
    r = run("pilot", "--models", models, "--out", str(out), "--quiet")
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and not (out / "models.json").exists()


def test_one_policy_entry_points_refuse_a_grid_over_models(tmp_path):
    """race.diagnose returns one diagnosis and a study is one policy: both say where to go instead."""
    from race.run.api import diagnose
    from race.core.errors import RaceError
    from race.run.study import run_study
    cfg = config_from_dict({**BASE, "models": ["race/tiny-arith-s", "race/tiny-arith"]})
    with pytest.raises(RaceError, match="call race.run.api.run_models"):
        diagnose(config=cfg, out_dir=str(tmp_path / "d"))
    with pytest.raises(ConfigError, match="one study per policy"):
        run_study(cfg, out_dir=str(tmp_path / "s"))
    assert not (tmp_path / "d" / "race.db").exists() and not (tmp_path / "s").exists()


# ----------------------------------------------------------------------------- the paired bootstrap

def _grid(scores, rhos=(0.5, 0.6, 0.7), seeds=(0,)):
    keys = [(r, s) for r in rhos for s in seeds]
    return grid_scores(rho_targets=[k[0] for k in keys], pilot_seeds=[k[1] for k in keys],
                       pilot_rho=[k[0] for k in keys], scores=scores)


def test_paired_bootstrap_shares_the_prompt_resample_across_grids():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, size=(3, 50)).astype(float)
    ga, gb = _grid(a), _grid(a + 0.25)          # policy B: the same prompts, 0.25 better on each
    ra, rb = bootstrap_paired_grids(grids=[ga, gb], n_boot=200, seed=1)
    assert ra.shape == rb.shape == (200, 3)
    # one seed per point: only prompts are resampled, and the same draw for both → exact difference
    np.testing.assert_allclose(rb - ra, 0.25)
    # deterministic in (grids, n_boot, seed)
    np.testing.assert_array_equal(bootstrap_paired_grids(grids=[ga, gb], n_boot=200, seed=1)[0], ra)
    with pytest.raises(ValueError, match=r"prompt counts \[40, 50\]"):
        bootstrap_paired_grids(grids=[ga, _grid(a[:, :40])], n_boot=10)


# ----------------------------------------------------------------------------- the joint view

def _policy(response, base, model, steps_per_point, *, seed):
    """Three seeds on the grid, each pilot with a schedule (8 prompts × 8 rollouts) and steps."""
    pilots = []
    for p in synthetic_results(response=response, n_seeds=3, base=base, seed=seed):
        steps = steps_per_point[p.rho_target]
        sched = Schedule(rho_target=p.rho_target, prompts_per_step=8, n_gen=8, n_train=8, mu=2 if p.rho_target > 0.8
                         else 1, steps=steps, learning_rate=1e-3, lora_rank=8,
                         flops_per_step=FlopBreakdown(1, 1, 0), flops=FlopBreakdown(1, 1, 0))
        pilots.append(replace(p, schedule=sched, extra={"steps": steps}))
    meta = {"model": model, "task": "arithmetic-easy", "reward": "sparse", "budget_per_pilot": FLOPS_PER_PILOT}
    return Results(pilots=tuple(pilots), diagnosis=classify(pilots, meta=meta),
                   config={"model": model, "budget": FLOPS_PER_PILOT, "task": "arithmetic-easy"})


def _two_policies():
    from test_regime import GRID

    small = _policy(FALLING, 0.55, "race/tiny-arith-s", {r: 400 for r in GRID}, seed=0)
    large = _policy(RISING, 0.35, "race/tiny-arith", {r: 100 for r in GRID}, seed=0)
    return [("tiny-arith-s", small), ("tiny-arith", large)]


def test_joint_view_names_the_best_policy_and_rho_with_a_ci_and_the_costs():
    parts = _two_policies()
    view = joint_view(parts)
    small, large = view.policies
    assert (small.regime, large.regime) == ("search-heavy", "update-heavy")
    # the small policy starts 0.2 higher and falls with ρ: its lowest point is the best of all
    assert view.best_label == "tiny-arith-s" and view.best_rho == min(p.rho_target for p in parts[0][1].pilots)
    assert view.best_ci[0] < view.best_score < view.best_ci[1] and view.best_share > 0.5
    assert small.best_share + large.best_share == pytest.approx(1.0) and small.best_share > 0.95
    (other, gap, lo, hi), = view.gaps
    assert other == "tiny-arith" and lo > 0 and lo < gap < hi
    # parameters and base accuracies of the shipped assets, read from their files
    assert (small.parameters, large.parameters) == (186_624, 741_888)
    assert small.base_heldout == pytest.approx(0.0592) and large.base_heldout == pytest.approx(0.3469)
    # costs by hand: 8 prompts × 8 rollouts × steps, per 1e12 FLOPs of the pilot
    c = small.costs[0]
    assert (c.steps, c.rollouts) == (400, 400 * 64)
    assert c.rollouts_per_1e12 == pytest.approx(400 * 64 / FLOPS_PER_PILOT * 1e12)
    assert large.costs[-1].updates == 200           # μ = 2 at the top point
    line = gave_up(small, large, view.budget)
    assert "tiny-arith (4.0× the parameters)" in line and "4.0× fewer steps" in line and "4.0× fewer rollouts" in line
    text = render_joint(view)
    assert "tiny-arith-s is the better buy" in text and "best (policy, ρ): tiny-arith-s at ρ=" in text
    assert "the ranges of tiny-arith-s and tiny-arith are disjoint: the best ρ moves with size" in text
    d = json.loads(render_joint(view, "json"))
    assert d["kind"] == "models" and d["best_label"] == "tiny-arith-s" and len(d["policies"]) == 2
    for fmt in ("md", "latex"):
        assert "tiny-arith-s" in render_joint(view, fmt)


def test_an_inconclusive_policy_locates_no_best_rho():
    from test_regime import FLAT

    (a, ra), (b, _) = _two_policies()
    flat = _policy(FLAT, 0.35, "race/tiny-arith", {r.rho_target: 100 for r in ra.pilots}, seed=3)
    view = joint_view([(a, ra), (b, flat)])
    assert view.policies[1].regime == "inconclusive"
    assert ("no move of the best ρ with size is resolved at this budget: tiny-arith is inconclusive, so fewer "
            "than two policies locate their best ρ") in render_joint(view)


def test_joint_view_refuses_grids_at_different_budgets():
    (a, ra), (b, rb) = _two_policies()
    with pytest.raises(ValueError, match="budgets .* per pilot: a joint view compares policies at one budget"):
        joint_view([(a, ra), (b, replace(rb, config={**rb.config, "budget": 2 * FLOPS_PER_PILOT}))])


def test_point_costs_fall_back_to_the_schedule_when_a_pilot_recorded_no_steps():
    (_, res), _ = _two_policies()
    bare = replace(res, pilots=tuple(replace(p, extra={}) for p in res.pilots))
    assert [c.steps for c in point_costs(bare, "reward")] == [c.steps for c in point_costs(res, "reward")]


# ----------------------------------------------------------------------------- end to end

TINY = {"name": "two-sizes", "models": ["race/tiny-arith-s", "race/tiny-arith"], "budget": 1e10,
        "grid": [0.5, 0.62, 0.74], "seeds": 1, "eval": {"prompts": 40, "samples": 2, "temperature": 1.0}}


def test_a_two_policy_grid_runs_end_to_end_and_reports_jointly(tmp_path):
    """Two shipped sizes × 3 ρ × 1 seed at 1e10 FLOPs per pilot (~1 min on 2 cores): real pilots,
    one part per policy, the joint report; race compare and race report read the parts; a re-run
    resumes (no pilot runs again)."""
    cfg = tmp_path / "sizes.yaml"
    cfg.write_text(json.dumps({**{k: v for k, v in DEFAULT.items() if k not in ("model", "eval")}, **TINY}))
    out = tmp_path / "run"
    r = run("pilot", str(cfg), "--out", str(out), "--quiet", "--format", "json", "--plot", str(tmp_path / "f.png"))
    assert r.exit_code == 0, r.output
    view = json.loads(r.stdout)
    assert view["kind"] == "models" and [p["label"] for p in view["policies"]] == ["tiny-arith-s", "tiny-arith"]
    for p in view["policies"]:
        assert len(p["costs"]) == 3 and all(c["steps"] > 0 and c["rollouts"] > 0 for c in p["costs"])
        assert p["base_pass_rate"] is not None and 0 <= p["base_pass_rate"] <= 1
        part = json.loads((out / p["label"] / "results.json").read_text())
        assert part["config"]["model"] == f"race/{p['label']}" and len(part["pilots"]) == 3
        assert all(abs(q["flops"]["total"] - 1e10) / 1e10 < 0.1 for q in part["pilots"])
    s, m = view["policies"]
    # the same FLOPs per pilot buy the 4× smaller policy more steps at every ρ
    assert all(cs["steps"] > cm["steps"] for cs, cm in zip(s["costs"], m["costs"]))
    assert view["best_label"] in ("tiny-arith-s", "tiny-arith") and view["best_ci"][0] <= view["best_score"]
    assert any(line.startswith("what tiny-arith (4.0× the parameters) gave up") for line in view["lines"])
    assert (tmp_path / "f.png").stat().st_size > 10_000
    stored = json.loads((out / "models.json").read_text())
    assert stored["parts"] == {"tiny-arith-s": "tiny-arith-s", "tiny-arith": "tiny-arith"}
    assert stored["view"]["best_score"] == view["best_score"]
    # the parts are ordinary grids: race compare and race report take them; race report DIR is the joint view
    r = run("compare", str(out / "tiny-arith-s"), str(out / "tiny-arith"))
    assert r.exit_code == 0 and "two-sizes--tiny-arith-s" in r.output, r.output
    r = run("report", str(out))
    assert r.exit_code == 0 and "RACE grid over models: 2 policies at 1e+10 FLOPs per pilot" in r.output, r.output
    # a re-run resumes both parts: nothing runs again, the same view
    r = run("pilot", str(cfg), "--out", str(out), "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["best_score"] == view["best_score"]
    assert r.stderr.count("resuming, 3 pilots complete, 0 to run") == 2, r.stderr


def test_plan_of_a_grid_over_models_plans_each_policy_at_the_same_budget():
    from conftest import PILOTS

    r = run("plan", os.path.join(PILOTS, "tiny-sizes.yaml"), "--json")
    assert r.exit_code == 0, r.output
    parts = json.loads(r.stdout)["parts"]
    assert list(parts) == ["tiny-arith-s", "tiny-arith", "tiny-arith-l"]
    steps = {k: [s["steps"] for s in v["schedules"]] for k, v in parts.items()}
    for k, v in parts.items():
        assert all(abs(s["flops"]["total"] - 3e11) / 3e11 < 0.02 for s in v["schedules"]), k   # whole steps
    # 4× the parameters: fewer steps at every ρ for the same FLOPs per pilot
    assert all(a > 3 * b for a, b in zip(steps["tiny-arith-s"], steps["tiny-arith"]))
    assert all(a > 3 * b for a, b in zip(steps["tiny-arith"], steps["tiny-arith-l"]))
