import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import PILOTS
from race.run.cli import main
from race.core.records import FlopBreakdown, PilotResult
from race.stats.results import Results, save_results


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_flops_json_qwen_1_5b():
    r = run("flops", "--model", "qwen/qwen2.5-1.5b-instruct", "--lora-rank", "8", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["params"] == 1_543_714_304
    assert d["forward_flops_per_token"]["flops"] > 2 * 1.5e9
    split = d["per_prompt_flops"]
    assert split["search"] > 0 and split["learning"] > 0 and split["reward"] == 0
    assert d["rho"] == pytest.approx(split["learning"] / split["total"])
    assert 0 < d["rho"] < 1


def test_flops_text():
    r = run("flops", "--model", "Qwen/Qwen2.5-7B-Instruct")
    assert r.exit_code == 0 and "rho" in r.output


@pytest.mark.parametrize("args,msg", [
    (("flops", "--model", "nobody/no-model"), "unknown model 'nobody/no-model'"),
    (("plan", "/nonexistent.yaml"), "does not exist"),
    (("report", "/nonexistent.json"), "does not exist"),
])
def test_bad_input_exit_2_one_line(args, msg):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output


def test_plan_tiny(tmp_path):
    r = run("plan", os.path.join(PILOTS, "tiny-cpu.yaml"))
    assert r.exit_code == 0, r.output
    assert "ρ achieved" in r.output and "C_learning" in r.output
    rj = run("plan", os.path.join(PILOTS, "tiny-cpu.yaml"), "--json")
    data = json.loads(rj.output)
    assert [round(s["rho_target"], 2) for s in data["schedules"]] == [0.35, 0.45, 0.6, 0.73, 0.84]


def test_plan_without_config_plans_the_embedded_default_grid():
    """`race plan` with no CONFIG plans what `race pilot` with no CONFIG runs (race.config.presets.DEFAULT)."""
    from race.config.presets import DEFAULT

    d = json.loads(run("plan", "--json").output)
    assert [s["rho_target"] for s in d["schedules"]] == pytest.approx(DEFAULT["grid"])
    assert d["budget_per_pilot"] == pytest.approx(float(DEFAULT["budget"])) and d["seeds"] == DEFAULT["seeds"]
    r = run("plan", "--full-run", "1.8e13")                         # 30 × the pilot budget
    assert r.exit_code == 0 and "F / B = 30" in r.output, r.output
    r = run("plan", "--budget", "2e10", "--seeds", "2", "--json")   # the Grid options still override it
    assert json.loads(r.output)["seeds"] == 2


@pytest.mark.parametrize("extra,msg", [
    (("--grid", "0.3,1.4"), "ρ=1.4 is outside (0, 1)"),
    (("--budget", "-3e12"), "budget '-3e12' must be a positive"),
    (("--budget", "1e3"), "too small for one step"),
])
def test_plan_bad_values(extra, msg):
    r = run("plan", os.path.join(PILOTS, "tiny-cpu.yaml"), *extra)
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def test_plan_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: Qwen/Qwen2.5-1.5B-Instruct\nbudget: [1\n")
    r = run("plan", str(p))
    assert r.exit_code == 2 and "not valid YAML" in r.output


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(PILOTS) if f.endswith(".yaml")))
def test_shipped_pilot_configs_plan(name):
    r = run("plan", os.path.join(PILOTS, name), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    plans = d["parts"].values() if d["kind"] == "models-plan" else [d]     # a grid over models: one plan per policy
    for s in (s for plan in plans for s in plan["schedules"]):
        assert abs(s["rho"] - s["rho_target"]) <= 0.02


def test_report_classifies_stored_pilots(tmp_path):
    """race report renders a diagnosis from a results file's pilots (synthetic falling response)."""
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0.1, 0.9, 200)
    pilots = []
    for rho in (0.3, 0.45, 0.6, 0.72, 0.85):
        for seed in range(3):
            p = np.clip(difficulty + 0.6 - 0.5 * rho + rng.normal(0, 0.02) - 0.45, 0, 1)
            scores = rng.binomial(4, p) / 4
            pilots.append(PilotResult(rho, seed, FlopBreakdown(1e12 * (1 - rho), 1e12 * rho),
                                      {"reward": tuple(scores)}))
    save_results(str(tmp_path), Results(pilots=tuple(pilots)))
    r = run("report", str(tmp_path / "results.json"))
    assert r.exit_code == 0, r.output
    assert "search-heavy" in r.output
    for fmt in ("md", "latex", "json"):
        assert run("report", str(tmp_path), "--format", fmt).exit_code == 0


@pytest.mark.parametrize("extra,msg", [
    (("--grid", "0.5,1.5"), "ρ=1.5 is outside (0, 1)"),
    (("--budget", "0"), "budget '0' must be a positive"),
    (("--thorough", os.path.join(PILOTS, "tiny-cpu.yaml")), "give either CONFIG or --thorough"),
])
def test_pilot_bad_input_exit_2(tmp_path, extra, msg):
    r = run("pilot", "--out", str(tmp_path), "--quiet", *extra)
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("cmd,device,msg", [
    ("pilot", "gpu0", "device 'gpu0' is not one RACE runs pilots on: expected cpu, cuda or cuda:N"),
    ("pilot", "cuda", "device 'cuda' needs a CUDA GPU"),
    ("worker", "cuda:0", "device 'cuda:0' needs a CUDA GPU"),
])
def test_a_device_pilots_cannot_run_on_is_refused_before_anything_is_written(tmp_path, cmd, device, msg):
    if "needs a CUDA GPU" in msg and _has_cuda():
        pytest.skip("this machine has a CUDA GPU")
    out = tmp_path / "run"
    args = ("pilot", "--out", str(out), "--quiet") if cmd == "pilot" else \
        ("worker", "--storage", f"sqlite:///{tmp_path / 'w.db'}", "--study", "s", "--quiet")
    r = run(*args, "--device", device)
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output
    assert not out.exists() and not (tmp_path / "w.db").exists()


@pytest.mark.parametrize("extra,msg", [
    ({"reward": {"kind": "custom", "function": "no_such_reward_module:score"}},
     "reward 'no_such_reward_module:score': cannot import module 'no_such_reward_module'"),
    ({"task": "DATA", "eval": {"prompts": 500}},   # 20 rows: one held out by the prompt hash
     "held-out problems of task"),
])
def test_a_grid_every_pilot_would_fail_is_refused_before_anything_is_written(tmp_path, extra, msg):
    """An unimportable custom reward or too few held-out problems would fail each pilot after
    calibration; both are one line and exit 2 before the study exists."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    cfg = {"model": "race/tiny-arith", "budget": 1e10, "grid": [0.6, 0.75, 0.92], "seeds": 1, **extra}
    if cfg.get("task") == "DATA":
        cfg["task"] = str(data)
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    out = tmp_path / "run"
    r = run("pilot", str(tmp_path / "c.yaml"), "--out", str(out), "--quiet")
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output
    assert not out.exists()



def test_a_bad_adaptive_share_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    r = run("pilot", "--out", str(out), "--quiet", "--adaptive-share", "1.5")
    assert r.exit_code == 2 and "adaptive share 1.5 is outside (0, 1]" in r.output and not out.exists()
