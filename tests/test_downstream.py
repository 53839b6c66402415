"""Downstream targets (``eval.tasks``): extra held-out sets, each its own target and verdict, and the
disagreement table across targets in every report format; the chat template and stop tokens."""
import json

import pytest

from race.config.configfile import ConfigError, config_from_dict
from race.core.records import Diagnosis, FlopBreakdown, PointSummary, Regime, TargetVerdict


def _cfg(**eval_kw):
    return config_from_dict({"model": "race/tiny-arith", "budget": 1e9, "eval": eval_kw})


def test_eval_tasks_parse_as_paths_or_mappings_and_survive_a_round_trip(tmp_path):
    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e9,
                            "eval": {"tasks": ["./sets/gsm-shift.jsonl", {"path": "arithmetic-hard", "name": "hard",
                                                                          "prompts": 50, "samples": 2}]}},
                           base_dir=str(tmp_path))
    first, second = cfg.eval.tasks
    assert first.path == str(tmp_path / "sets" / "gsm-shift.jsonl") and first.label == "gsm-shift"
    assert (second.label, second.prompts, second.samples) == ("hard", 50, 2)
    assert config_from_dict(cfg.to_dict()) == cfg          # as results.json stores it


@pytest.mark.parametrize("tasks, message", [
    (3, "eval.tasks 3 is not valid: expected a list"),
    ([{"path": ""}], "eval.tasks[0].path '' is not valid"),
    ([{"path": "a.jsonl", "prompts": 0}], "eval.tasks[0].prompts 0 is not valid: expected a positive integer"),
    ([{"path": "a.jsonl", "samples": True}], "eval.tasks[0].samples True is not valid"),
    ([{"path": "a.jsonl", "name": "a/b"}], "eval.tasks[0].name 'a/b' is not valid"),
    ([{"path": "a.jsonl", "split": "x"}], "eval.tasks[0].split is not a known setting"),
    (["a.jsonl", "other/a.jsonl"], "eval.tasks names 'a' twice"),
    (["arithmetic-easy"], "eval.tasks entry 'arithmetic-easy' is the training task"),
])
def test_bad_eval_tasks_are_one_line_errors(tasks, message):
    with pytest.raises(ConfigError) as e:
        _cfg(tasks=tasks)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("raw, message", [
    ({"eval": {"checker": "fuzzy"}}, "eval.checker 'fuzzy' is unknown: expected one of auto, exact, math"),
    ({"chat_template": "maybe"}, "chat_template 'maybe' is unknown: expected one of auto, on, off"),
    ({"system_prompt": 3}, "system_prompt 3 is not valid: expected a string"),
])
def test_bad_checker_and_template_settings(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_from_dict({"model": "race/tiny-arith", "budget": 1e9, **raw})


def _verdict(target, regime, rng, means):
    pts = tuple(PointSummary(r, r, 3, FlopBreakdown(1e12 * (1 - r), 1e12 * r, 0), m, (m - 0.01, m + 0.01))
                for r, m in zip((0.3, 0.5, 0.7, 0.85), means))
    best = max(pts, key=lambda p: p.reward_mean)
    return TargetVerdict(target, regime, rng, 0.9, best.rho_target, best.reward_mean, 0.0, (0.0, 0.0), None, pts)


def _two_targets():
    v = {"reward": _verdict("reward", Regime.SEARCH_HEAVY, (0.3, 0.4), (0.6, 0.55, 0.5, 0.45)),
         "pass@1": _verdict("pass@1", Regime.SEARCH_HEAVY, (0.3, 0.45), (0.5, 0.45, 0.44, 0.40)),
         "shift/pass@1": _verdict("shift/pass@1", Regime.UPDATE_HEAVY, (0.7, 0.85), (0.1, 0.2, 0.3, 0.4)),
         "shift/pass@4": _verdict("shift/pass@4", Regime.INCONCLUSIVE, (0.3, 0.85), (0.3, 0.3, 0.3, 0.3))}
    return Diagnosis("reward", v, (), {"model": "m"})


def test_target_agreement_compares_every_target_with_the_primary():
    from race.stats.fit import target_agreement

    rows = {r["target"]: r for r in target_agreement(_two_targets())}
    assert list(rows) == ["reward", "pass@1", "shift/pass@1", "shift/pass@4"]
    assert rows["reward"]["rank_corr"] == pytest.approx(1.0) and rows["reward"]["same_regime"]
    assert rows["pass@1"]["same_regime"] and rows["pass@1"]["ranges_overlap"]
    assert rows["pass@1"]["rank_corr"] == pytest.approx(1.0)             # same order of the grid
    assert not rows["shift/pass@1"]["same_regime"] and not rows["shift/pass@1"]["ranges_overlap"]
    assert rows["shift/pass@1"]["rank_corr"] == pytest.approx(-1.0)      # the downstream set orders it backwards
    assert rows["shift/pass@4"]["rank_corr"] is None                     # constant: no order
    assert rows["shift/pass@1"]["best_rho"] == 0.85


@pytest.mark.parametrize("fmt", ["text", "md", "latex", "json"])
def test_the_disagreement_table_is_in_every_report_format(fmt):
    from race.stats.report import render_diagnosis

    out = render_diagnosis(_two_targets(), fmt)
    if fmt == "json":
        rows = json.loads(out)["agreement"]
        assert [r["target"] for r in rows][2] == "shift/pass@1" and rows[2]["same_regime"] is False
        return
    assert "agreement across targets" in out
    line = next(ln for ln in out.splitlines() if "shift/pass@1" in ln and "NO" in ln)
    assert "-1.00" in line and "update-heavy" in line


def test_downstream_targets_get_their_own_verdict_end_to_end(tmp_path, torch_one_thread):
    """A real grid of the tiny policy with a downstream file (harder sums) and a built-in set: each
    adds NAME/pass@1 and NAME/pass@k to every pilot, a verdict per target, and the agreement table
    to the report."""
    from race.run.api import build_config
    from race.stats.report import render_diagnosis
    from race.run.study import run_grid
    from race.tasks import load_task

    rows = [{"prompt": p.prompt, "answer": p.answer} for p in load_task("arithmetic-hard", split="eval", n=40)]
    (tmp_path / "shift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config({"model": "race/tiny-arith", "budget": 2e10, "grid": [0.6, 0.75, 0.92], "seeds": 2,
                        "lengths": {"prompt": 5.9, "completion": 3.5}, "grpo": {"max_completion_len": 6},
                        "eval": {"prompts": 60, "samples": 2, "checkpoints": 0,
                                 "tasks": [str(tmp_path / "shift.jsonl"), {"path": "arithmetic-steps", "name": "steps",
                                                                           "prompts": 20, "samples": 3}]}})
    res = run_grid(cfg, out_dir=str(tmp_path / "out"), quiet=True)
    p = res.pilots[0]
    assert len(p.evals["shift/pass@1"]) == 40 and len(p.evals["shift/pass@2"]) == 40
    assert len(p.evals["steps/pass@1"]) == 20 and "steps/pass@3" in p.evals
    assert p.extra["eval_flops"]["downstream"] > 0
    assert set(res.diagnosis.verdicts) >= {"reward", "pass@1", "shift/pass@1", "steps/pass@1"}
    text = render_diagnosis(res.diagnosis, "text")
    assert "agreement across targets" in text and "shift/pass@1" in text


def test_pass_at_k_uses_the_tasks_own_checker(tmp_path):
    """exact match for the built-in arithmetic; math-verify's answer check for GSM8K / MATH rows or a
    math reward (a worked solution ending '#### 1,234' is right for 1234; exact match says no)."""
    from race.tasks.taskdata import answer_check, answer_check_name
    from race.tasks import load_task
    from race.tasks.datasets import load_jsonl

    (tmp_path / "gsm.jsonl").write_text(json.dumps({"question": "Tom has 1200 and gets 34. How many?",
                                                    "answer": "1200 + 34 = 1234\n#### 1,234"}) + "\n")
    gsm = load_jsonl(str(tmp_path / "gsm.jsonl"))
    base = _cfg()
    assert answer_check_name(base, load_task("arithmetic-easy", split="eval", n=3)) == "exact"
    assert answer_check_name(base, gsm) == "math"
    assert answer_check_name(config_from_dict({"model": "race/tiny-arith", "budget": 1e9,
                                               "reward": {"kind": "mix", "mix": {"math": 0.9, "format": 0.1}}}),
                             load_task("arithmetic-easy", split="eval", n=3)) == "math"
    assert answer_check_name(_cfg(checker="exact"), gsm) == "exact"
    check = answer_check(base, gsm)
    done = "1200 + 34 = 1234\n#### 1234<|im_end|>"
    assert check(gsm[0].prompt, done, gsm[0].answer) is True
    assert check(gsm[0].prompt, "1200 + 34 = 1244\n#### 1244<|im_end|>", gsm[0].answer) is False
    assert answer_check(_cfg(checker="exact"), gsm)(gsm[0].prompt, done, gsm[0].answer) is False
