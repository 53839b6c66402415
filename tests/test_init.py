"""race init: the written config loads, plans, is sized from the full run and fits the GPU."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from click.testing import CliRunner

from race.run.cli import main
from race.config.configfile import ConfigError, config_from_dict, load_config
from race.flops.grid import plan_grid
from race.run.newconfig import fit_memory, init_raw, render_init

QWEN = "Qwen/Qwen2.5-1.5B-Instruct"


def test_qwen_config_is_sized_from_the_full_run_and_fits_the_gpu(tmp_path):
    raw = fit_memory(init_raw(model=QWEN, task="polaris", full_run=5e18, gpu_memory="80GiB"))
    assert raw["budget"] == pytest.approx(0.1 * 5e18 / (5 * 2))
    # the largest micro-batch that fits: two prompt groups of 8; four do not fit 80 GiB
    assert raw["grpo"]["micro_batch"] == 16 and "grad_checkpointing" not in raw["grpo"]
    with pytest.raises(ConfigError, match="GPU memory"):
        plan_grid(config_from_dict({**raw, "grpo": {**raw["grpo"], "micro_batch": 32}}))
    text = render_init(raw, share=0.1)
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    cfg = load_config(str(path))
    assert cfg == config_from_dict(raw)                       # the YAML says exactly what was planned
    assert cfg.gpu_memory == 80 * 2 ** 30 and cfg.full_run_budget == 5e18 and cfg.grpo.temperature == 0.6
    plan = plan_grid(cfg)
    for s in plan.schedules:                                 # the header's plan lines are the planner's
        assert f"ρ {s.rho_target:.2f} (achieved {s.rho:.3f}): {s.prompts_per_step} prompts × {s.n_gen} rollouts → " \
               f"{s.n_train} trained, μ {s.mu}: {s.steps} steps a pilot, " \
               f"{int(5e18 // s.flops_per_step.total):,} in the full run" in text
    assert f"= {plan.grid_flops / 5e18:.1%} of the full run" in text
    # before any pilot: the stability line says it is not tested yet, and the range at F what will move it
    assert "# Stability at F (100 × B): not tested: no pilot has run yet" in text
    assert "# Range at F: the pilots' range at B will be moved by the budget drift" in text
    assert "past the validated factor the range is widened" in text            # 100 × B > 30 × B


def test_a_gpu_too_small_without_checkpointing_turns_it_on():
    raw = fit_memory(init_raw(model=QWEN, task="polaris", full_run=5e18, gpu_memory="24GiB", grid="0.4,0.6,0.8"))
    assert raw["grpo"].get("grad_checkpointing") is True and raw["grpo"]["micro_batch"] == 8
    # checkpointing recomputes the forward: C_learning grows and the lowest reachable ρ with it
    with pytest.raises(ConfigError, match=r"ρ=0.3 is unreachable.*with the gradient checkpointing that gpu_memory 24GiB needs"):
        fit_memory(init_raw(model=QWEN, task="polaris", full_run=5e18, gpu_memory="24GiB"))
    # 16 GiB: the rollout's KV cache alone (64 sequences of 1,024+ tokens) does not fit, whatever the micro-batch
    with pytest.raises(ConfigError, match=r"ρ=0.4 needs an estimated 20.84 GiB .*rollout phase; largest: kv_cache"):
        fit_memory(init_raw(model=QWEN, task="polaris", full_run=5e18, gpu_memory="16GiB", grid="0.4,0.6,0.8"))
    with pytest.raises(ConfigError, match="GPU memory"):
        fit_memory(init_raw(model=QWEN, task="polaris", full_run=5e18, gpu_memory="2GiB", grid="0.4,0.6,0.8"))


def test_rewards(tmp_path):
    (tmp_path / "init_reward.py").write_text("def score(p, c, r):\n    return 1.0\n")
    fn = f"{tmp_path / 'init_reward.py'}:score"
    assert init_raw(model=QWEN, task="t", full_run=1e18, reward=fn)["reward"] == {"kind": "custom", "function": fn}
    with pytest.raises(ValueError, match="cannot import module .no_such_init_reward."):
        init_raw(model=QWEN, task="t", full_run=1e18, reward="no_such_init_reward:score")
    assert init_raw(model=QWEN, task="t", full_run=1e18, reward="prm", reward_model="Qwen/Qwen2.5-Math-PRM-7B"
                    )["reward"] == {"kind": "prm", "model": "Qwen/Qwen2.5-Math-PRM-7B"}
    with pytest.raises(ConfigError, match="reward 'prm' needs --reward-model"):
        init_raw(model=QWEN, task="t", full_run=1e18, reward="prm")
    with pytest.raises(ConfigError, match="reward 'judge' is unknown"):
        init_raw(model=QWEN, task="t", full_run=1e18, reward="judge")


def test_cli_init_writes_a_config_race_plan_accepts(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(200)))
    out = tmp_path / "tiny.yaml"
    args = ["init", "--model", "race/tiny-arith", "--task", str(data), "--full-run", "6e13", "--grid", "0.5,0.62,0.74",
            "--seeds", "3", "--prompt-len", "6", "--completion-len", "4", "--max-completion-len", "6", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    text = out.read_text()
    counts = re.search(r"([\d,]+) training problems, ([\d,]+) held out", text)
    assert counts and sum(int(c.replace(",", "")) for c in counts.groups()) == 200
    # the budget race pilot gives each pilot (race.run.sizing, design fit): 10 % of F over 9 pilots, less each
    # pilot's held-out evaluation; the config records the design and its share
    written = yaml.safe_load(text)
    assert (written["pilot_design"], written["pilot_share"]) == ("fit", 0.1)
    from race.config.configfile import load_config
    from race.run.sizing import size_pilots

    sized, d = size_pilots(load_config(str(out)), full_run=6e13)
    assert len(d["pilots"]) == 9 and d["spent"] == pytest.approx(0.1 * 6e13)
    assert written["budget"] == pytest.approx(0.1 * 6e13 / 9 - d["eval_flops"], rel=1e-5)
    assert sized.budget == pytest.approx(written["budget"], rel=1e-5)
    assert "design fit: 9 pilots" in text
    p = CliRunner().invoke(main, ["plan", str(out)])
    assert p.exit_code == 0 and "the grid costs 9.9% of the full-run budget 6e+13" in p.output
    r = CliRunner().invoke(main, args)                          # never overwrites silently
    assert r.exit_code == 2 and "exists: pass --force" in r.output and out.read_text() == text
    assert CliRunner().invoke(main, args + ["--force"]).exit_code == 0


@pytest.mark.parametrize("extra,msg", [
    (("--full-run", "6e9"), "too small for one step at ρ=0.3"),
    (("--full-run", "6e13", "--share", "0"), "--share 0.0 is outside (0, 1)"),
    (("--full-run", "6e13", "--share", "1"), "--share 1.0 is outside (0, 1)"),
    (("--full-run", "6e13", "--share", "nan", "--task", "missing.jsonl"), "--share nan is outside (0, 1)"),
    (("--full-run", "-1"), "full run budget"),
    (("--full-run", "6e13", "--task", "missing.jsonl"), "task file 'missing.jsonl' does not exist"),
])
def test_cli_init_errors(extra, msg):
    args = ["init", "--model", "race/tiny-arith", "--task", "arithmetic-easy", *extra]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def test_default_names():
    from race.run.newconfig import _reward_label

    assert [_reward_label(r) for r in ("sparse", "myreward:score", "/a/b/my_r.py:score", "pkg.mod:fn")] == [
        "sparse", "myreward", "my_r", "mod"]
    assert init_raw(model=QWEN, task="t", full_run=1e18)["name"] == "qwen2.5-1.5b-instruct-sparse"


def test_init_fits_the_grid_to_the_budget_or_names_the_smallest_full_run():
    """A full run whose pilots cannot plan the low-ρ points (too few prompt-steps to meet the
    budget within 2 %) drops them from the low end, down to 3 points, and says so with the full run
    that keeps them all; below that, the error names the smallest full run that fits."""
    from race.run.newconfig import fit_grid, smallest_full_run

    raw = init_raw(model="race/tiny-arith", task="arithmetic-easy", full_run=1.5e14)
    fitted, note = fit_grid(raw, share=0.1)
    assert fitted["grid"] == [0.6, 0.72, 0.85] and fitted["budget"] == pytest.approx(2.5e12)
    assert note.startswith("Fitted to the budget: ρ 0.3, 0.45 dropped") and "--full-run 1.9e+14 keeps all 5" in note
    plan_grid(config_from_dict(fitted))                               # what it writes plans
    whole = smallest_full_run(raw, share=0.1)
    plan_grid(config_from_dict(init_raw(model="race/tiny-arith", task="arithmetic-easy", full_run=whole)))
    with pytest.raises(ConfigError, match=r"no grid of 3 or more points fits this full run: the smallest that "
                                          r"fits is about --full-run 1\.8e\+14"):
        fit_grid(init_raw(model="race/tiny-arith", task="arithmetic-easy", full_run=6e13), share=0.1)
    same = init_raw(model="race/tiny-arith", task="arithmetic-easy", full_run=6e14)
    assert fit_grid(same, share=0.1) == (same, "")                     # fits as it is: unchanged


def test_small_datasets_are_named_by_init_and_plan(tmp_path):
    """30 rows: 3 held out resolve only √(2/3) = 0.82 between grid points (200 resolve 0.10), and a
    pilot draws each training problem several times: init's header and race plan both say so."""
    from race.run.newconfig import resolvable

    assert resolvable(200) == pytest.approx(0.1) and resolvable(3) == pytest.approx(0.8165, abs=1e-4)
    data = tmp_path / "t30.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(30)))
    out = tmp_path / "grid.yaml"
    r = CliRunner().invoke(main, ["init", "--model", "race/tiny-arith", "--task", str(data), "--full-run", "6e14",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "# WARNING: the held-out set has 3 problems: it resolves only differences of 0.82" in text
    assert re.search(r"# WARNING: the training set has 27 problems and a pilot draws \d+ prompts", text)
    load_config(str(out))                                   # every header line is a comment: still valid YAML
    p = CliRunner().invoke(main, ["plan", str(out)])
    assert p.exit_code == 0 and "warning: the held-out set has 3 problems" in p.stderr


def test_a_shipped_policy_is_sized_with_its_own_lengths(tmp_path):
    """race/tiny-arith writes 2–3 answer digits and its end token, not a 512-token reasoning trace:
    init measures its prompts (5.8 tokens on arithmetic-easy, as its tokenizer reads them) and takes
    its completion (3.5) and cap (6), so the 6e12-FLOP full run of the validation study, which the LLM
    defaults refused, plans all 5 points. Any other model keeps the LLM defaults; given values win."""
    from race.run.newconfig import LLM_LENGTHS, expected_lengths

    out = tmp_path / "grid.yaml"
    r = CliRunner().invoke(main, ["init", "--model", "race/tiny-arith", "--task", "arithmetic-easy",
                                  "--full-run", "6e12", "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    raw = yaml.safe_load(text)
    assert raw["lengths"] == {"prompt": 5.8, "completion": 3.5} and raw["grpo"]["max_completion_len"] == 6
    assert raw["grid"] == [0.3, 0.45, 0.6, 0.72, 0.85]
    assert "# Lengths: race/tiny-arith's own (prompt measured on 256 training prompts, completion 3.5, cap 6)." in text
    assert "(5.8 prompt + 3.5 completion tokens expected; calibration measures them)" in text
    assert expected_lengths(QWEN, "arithmetic-easy") == (*LLM_LENGTHS, "")
    assert expected_lengths("race/tiny-arith", "arithmetic-easy", prompt_len=7, completion_len=4,
                            max_completion_len=8) == (7.0, 4.0, 8, "")
    p, c, m, note = expected_lengths("race/tiny-reasoner", "word-problems", completion_len=80)
    assert p > 45 and (c, m) == (80.0, 160) and note == ("Lengths: race/tiny-reasoner's own (prompt measured on "
                                                          "256 training prompts, cap 160).")


@pytest.mark.parametrize("share", [0, 1, 1.5, float("nan"), True])
def test_the_configs_pilot_share_and_inits_share_refuse_the_same_values(share):
    from race.config.configfile import ConfigError, config_from_dict
    from race.config.rules import check_share
    with pytest.raises(ConfigError, match=re.escape(f"pilot_share {share!r}") + " is (outside|not valid)"):
        config_from_dict({"model": "race/tiny-arith", "task": "arithmetic-easy", "budget": 1e10, "pilot_share": share})
    with pytest.raises(ConfigError, match=re.escape(f"--share {share!r} is outside (0, 1)")):
        check_share(share, "--share")
