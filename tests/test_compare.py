"""race compare: runs side by side, and the budget line (hand-checked CIs)."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from race.run.cli import main
from race.run.compare import RunSummary, budget_trends, render_comparison, summarize_run
from race.stats.regime import classify
from race.stats.results import Results, save_results
from test_regime import FALLING, RISING, synthetic_results


def _results(response, *, reward_fraction=0.0, budget=1.5e12, name="grid", seed=0) -> Results:
    pilots = [replace(p, wall_seconds={"setup": 3.0, "rollout": 10.0 * (1 - p.rho_target), "update": 10.0 * p.rho_target,
                                       "reward": 1.0, "sync": 0.0, "eval": 7.0})
              for p in synthetic_results(response=response, n_seeds=3, reward_fraction=reward_fraction, seed=seed)]
    meta = {"model": "tiny", "task": "arith", "reward": "prm" if reward_fraction else "sparse", "budget_per_pilot": budget}
    return Results(pilots=tuple(pilots), diagnosis=classify(pilots, meta=meta), config={"name": name})


def _row(budget, slope_ci, regime="search-heavy", reward="sparse", best=0.45):
    lo, hi = slope_ci
    return RunSummary(label=f"b{budget:g}", model="m", task="t", reward=reward, budget=budget, points=4, seeds=3,
                      target="reward", regime=regime, rho_range=(0.4, 0.5), confidence=0.9, best_rho=best,
                      best_score=0.5, slope=(lo + hi) / 2, slope_ci=(lo, hi), reward_share=0.0,
                      wall_seconds=(0.0, 0.0))


def test_summary_is_the_diagnosis_row():
    res = _results(FALLING, reward_fraction=0.2)
    v = res.diagnosis.primary
    r = summarize_run(res, label="x")
    assert (r.regime, r.rho_range, r.confidence, r.slope, r.slope_ci) == (
        v.regime.value, v.rho_range, v.confidence, v.slope, v.slope_ci)
    assert (r.model, r.reward, r.budget, r.points, r.seeds) == ("tiny", "prm", 1.5e12, 5, 3)
    best = next(p for p in v.points if p.rho_target == v.best_rho)
    assert r.reward_share == pytest.approx(best.flops.reward / best.flops.total)
    # wall: rollout + update + reward per pilot = 10 + 1 = 11 s at every point (setup, eval left out)
    assert r.wall_seconds == pytest.approx((11.0, 11.0))


def test_budget_line_resolves_a_change_only_for_disjoint_cis():
    moved = budget_trends([_row(3e11, (-0.30, -0.20), best=0.3), _row(6e11, (-0.10, 0.02), "inconclusive", best=0.6)])
    assert len(moved) == 1 and "disjoint" in moved[0]
    assert "-0.250 (-0.300 … -0.200) at 3e+11 → -0.040 (-0.100 … +0.020) at 6e+11" in moved[0]
    assert "best ρ 0.30 → 0.60" in moved[0] and "verdict search-heavy → inconclusive" in moved[0]
    same = budget_trends([_row(6e11, (-0.25, -0.12)), _row(3e11, (-0.30, -0.20))])   # order does not matter
    assert len(same) == 1 and "overlap: no change with budget is resolved" in same[0]
    assert same[0].index("at 3e+11") < same[0].index("at 6e+11")
    # one budget per setup, or setups that differ in reward: nothing to say about budget
    assert budget_trends([_row(3e11, (-0.3, -0.2)), _row(6e11, (-0.1, 0.0), reward="prm")]) == []
    assert budget_trends([_row(3e11, (-0.3, -0.2)), _row(3e11, (-0.1, 0.0))]) == []


def test_labels_are_unique():
    from race.run.compare import _unique_labels

    runs = [replace(_row(b, (-0.3, -0.2)), label=n) for n, b in (("g", 3e11), ("g", 6e11), ("g", 6e11), ("h", 6e11))]
    assert [r.label for r in _unique_labels(runs)] == ["g@3e+11", "g@6e+11", "g@6e+11#2", "h"]


def test_render_formats_and_json():
    runs = [_row(3e11, (-0.30, -0.20)), _row(6e11, (-0.10, 0.02))]
    text = render_comparison(runs)
    assert "b3e+11" in text and "[0.40, 0.50]" in text and "budget (m · t · sparse, reward)" in text
    assert "\\toprule" in render_comparison(runs, "latex") and "| run" in render_comparison(runs, "md")
    d = json.loads(render_comparison(runs, "json"))
    assert d["kind"] == "comparison" and [r["budget"] for r in d["runs"]] == [3e11, 6e11]
    assert d["runs"][0]["slope_ci"] == [-0.30, -0.20] and len(d["budget_trends"]) == 1


def test_cli_compare(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    save_results(str(a), _results(FALLING, name="sparse-grid"))
    save_results(str(b), _results(RISING, reward_fraction=0.3, name="prm-grid", seed=1))
    save_results(str(c), _results(FALLING, name="sparse-grid", seed=2, budget=3e12))
    r = CliRunner().invoke(main, ["compare", str(a), str(b), str(c / "results.json")])
    assert r.exit_code == 0, r.output
    rows = {line.split()[0]: line for line in r.output.splitlines() if line.startswith(("sparse-grid", "prm-grid"))}
    assert set(rows) == {"sparse-grid@1.5e+12", "prm-grid", "sparse-grid@3e+12"}   # same name: told apart by budget
    assert "search-heavy" in rows["sparse-grid@1.5e+12"] and "3e+12" in rows["sparse-grid@3e+12"]
    assert "budget (tiny · arith · sparse, reward)" in r.output


@pytest.mark.parametrize("args,msg", [
    ((), "compare needs at least 2 results files, got 0"),
    (("--target", "pass@9"), "has no target 'pass@9': expected one of reward"),
])
def test_cli_compare_errors(tmp_path, args, msg):
    paths = []
    if args:
        for name in ("a", "b"):
            save_results(str(tmp_path / name), _results(FALLING))
            paths.append(str(tmp_path / name))
    r = CliRunner().invoke(main, ["compare", *paths, *args])
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output
