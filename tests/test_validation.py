"""The validation study's tooling (research/scripts/validation.py): the tables of docs/validation.md are
what the committed data in research/validation/runs/ gives, and a small grid runs end to end through the
same commands (run → compact data → tables)."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "research" / "scripts" / "validation.py"
ROUND2 = ROOT / "research" / "scripts" / "validation_round2.py"


def test_the_docs_tables_are_recomputed_from_the_committed_data():
    """Round 1's summary tables (docs/validation.md) and its detail tables (the research log), in one run."""
    docs = [str(ROOT / "docs" / "validation.md"), str(ROOT / "research" / "validation-log.md")]
    out = subprocess.run([sys.executable, str(SCRIPT), "tables", "--check", *docs], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_the_second_rounds_tables_are_recomputed_from_its_committed_data():
    out = subprocess.run([sys.executable, str(ROUND2), "tables", "--check", str(ROOT / "docs" / "validation.md")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_the_at_risk_line_quotes_the_second_rounds_counts_as_its_tables_print_them():
    """The at-risk line (race.stats.instability.stability_at: some pilot fell back) quotes round 2's collapsed
    full runs of the settings whose pilots fell back; those counts are the ones the tables print."""
    import re

    from race.stats.instability import stability_at
    from race.core.records import Stability, StabilityPoint

    doc = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    line = next(x for x in doc.splitlines() if x.startswith("Settings whose pilots fell back at B"))
    counts = re.findall(r"(\d+) of (\d+) full runs collapsed", line)
    assert len(counts) >= 3, line
    pt = StabilityPoint(rho_target=0.5, pilots=3, unstable=1, checkpoints=9, prompts=100, eval_flops=1.0)
    said = stability_at(Stability(target="reward", rule={}, points=(pt,), unstable=((0.5, 0),)),
                        full_run_budget=1e13, pilot_budget=1e12)["line"]
    quoted = re.search(r"sealed second round: all (\d+) such settings lost full runs, ([^)]*)\)", said)
    assert quoted, said
    assert int(quoted.group(1)) == len(counts) and sum(c != "0" for c, _ in counts) == len(counts)
    assert sorted(re.findall(r"(\d+) of (\d+)", quoted.group(2))) == sorted(counts), (said, line)


def test_the_suite_is_split_and_sized_as_the_issue_asks():
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    suite = validation.load_suite()
    halves = {s["half"] for s in suite["settings"]}
    assert halves == {"development", "held-out"} and len(suite["settings"]) >= 8
    assert next(s for s in suite["settings"] if s["name"] == "default")["half"] == "development"
    for s in suite["settings"]:
        # the issue's 2e11–6e11 is for the tiny arithmetic policies; the reasoner's steps cost ~4× theirs
        assert 2e11 <= float(s["pilot_budget"]) <= (2e12 if "reasoner" in s["base"] else 6e11)
        assert len(s["full_grid"]) >= 5 and set(s["pilot_grid"]) < set(s["full_grid"])
        assert s["on_policy"] in s["full_grid"]
    assert sum(1 for s in suite["settings"] if s.get("long_grid")) >= 2


def test_a_small_grid_runs_end_to_end(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text("seeds: 1\nsettings:\n  - name: smoke\n    half: development\n    base: default\n"
                     "    overrides: {eval: {prompts: 40, checkpoint_prompts: 20}}\n    pilot_budget: 1e10\n"
                     "    pilot_grid: [0.5, 0.62, 0.74]\n    full_grid: [0.5, 0.62, 0.74]\n    on_policy: 0.74\n")
    common = [sys.executable, str(SCRIPT), "--suite", str(suite), "--runs", str(tmp_path / "runs")]
    out = subprocess.run(common + ["run", "smoke", "pilot", "--storage", str(tmp_path / "storage")],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    path = tmp_path / "runs" / "smoke" / "pilot.json.gz"
    with gzip.open(path, "rt") as fh:
        record = json.load(fh)
    assert record["commit"] and record["budget"] == 1e10 and len(record["pilots"]) == 3
    assert {"reward", "pass@1"} <= set(record["pilots"][0]["evals"]) and record["pilots"][0]["checkpoints"]
    # a grid run elsewhere is adopted as-is (here: the same results, as the full runs)
    out = subprocess.run(common + ["adopt", "smoke", "full10", str(tmp_path / "storage" / "smoke-pilot" / "results.json"),
                                   "--commit", "abc", "--command", "race pilot …"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    out = subprocess.run(common + ["tables"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines()       # the per-setting row (not the progress one)
               if line.startswith("| smoke | development | ") and "[" in line)
    assert "| yes |" in row                      # the same grid twice: the same regime


def test_a_grid_class_names_what_is_scored_beneath_it():
    """Reward-heavy agrees by construction through the FLOP share, so its row shows the trend
    underneath (which the suite summary scores); an unstable grid shows how many runs fell back."""
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    row = {"pilot": "reward-heavy", "pilot_regime": "reward-heavy", "pilot_trend": "search-heavy",
           "pilot_unstable": (0, 12), "full": "unstable", "full_regime": "balanced", "full_unstable": (9, 15)}
    assert validation._cls(row, "pilot") == "reward-heavy (trend underneath: search-heavy)"
    assert validation._cls(row, "full") == "unstable (9/15 fell back; balanced underneath)"
    assert validation._cls({**row, "pilot": "balanced"}, "pilot") == "balanced"


def test_the_median_ci_is_the_order_statistic_interval_with_its_binomial_coverage():
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    # n = 5: no pair reaches 0.95; (smallest, largest) covers with 1 - 2/32
    assert validation.median_ci([3.0, 1.0, 5.0, 2.0, 4.0]) == (1.0, 5.0, 1 - 2 / 32)
    # n = 9: (2nd, 8th) covers with 1 - 2 (1 + 9) / 512 = 0.961; (3rd, 7th) only 0.820
    lo, hi, cover = validation.median_ci([float(i) for i in range(1, 10)])
    assert (lo, hi) == (2.0, 8.0) and abs(cover - (1 - 20 / 512)) < 1e-12


def test_regret_and_gain_cis_bracket_the_point_figures_of_a_grid():
    """A full-run grid built by hand (test double of a record): three ρ, three seeds, 50 prompts of
    0/1 scores; the best point is ρ 0.5. Regret at the best point's own ρ is 0 in every replicate
    whose best is 0.5; the gain there over the on-policy point 0.7 is its mean difference."""
    import random

    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    rnd = random.Random(0)
    level = {0.3: 0.5, 0.5: 0.8, 0.7: 0.3}
    pilots = []
    for rho, p in level.items():
        for seed in range(3):
            pilots.append({"status": "complete", "rho_target": rho, "seed": seed,
                           "evals": {"reward": [float(rnd.random() < p) for _ in range(50)]}, "flops_rho": rho})
    record = {"pilots": pilots}

    class P:                                   # the two fields the statistics read
        def __init__(self, d):
            self.rho_target, self.evals = d["rho_target"], d["evals"]
            self.flops = type("F", (), {"rho": d["flops_rho"]})()

    validation._memo(record, "pilots", lambda: [P(d) for d in pilots])
    means = validation.point_means(record)
    (r_lo, r_hi), (g_lo, g_hi) = validation.regret_gain_ci(record, 0.5, 0.7)
    gain = sum(means[0.5]) / 3 - sum(means[0.7]) / 3
    assert r_lo == 0.0 and r_hi < 0.05            # 0.5 is best in nearly every replicate
    assert g_lo < gain < g_hi and g_lo > 0.3      # a 0.5-wide gap, 150 prompts a point
    (r_lo, r_hi), (g_lo, g_hi) = validation.regret_gain_ci(record, 0.3, None)
    assert r_lo > 0.15 and g_lo != g_lo           # 0.3 trails by ~0.3; no on-policy point: nan


def test_the_candidate_low_side_rule_moves_only_the_lower_bound_one_grid_point_down():
    """candidate_range on verdicts built by hand (test doubles of race.core.records.TargetVerdict): a
    closed range drops its lower bound to the next measured grid point below and is read at the
    new centre; one open below, or already at the grid's lowest point, is unchanged."""
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    grid = {0.25: 0.253, 0.4: 0.404, 0.55: 0.533, 0.7: 0.695}
    closed = SimpleNamespace(bounds=(0.2775, 0.4522), open_side=None, recommended_rho=0.36485)
    lo, hi, read = validation.candidate_range(closed, grid)
    assert (lo, hi) == (0.253, 0.4522) and abs(read - (0.253 + 0.4522) / 2) < 1e-12
    at_bottom = SimpleNamespace(bounds=(0.2535, 0.40), open_side=None, recommended_rho=0.32675)
    assert validation.candidate_range(at_bottom, grid) == (0.2535, 0.40, 0.32675)   # within RHO_TOL of 0.253
    below = SimpleNamespace(bounds=(0.0, 0.59), open_side="below", recommended_rho=0.253)
    assert validation.candidate_range(below, grid) == (0.0, 0.59, 0.253)
    above = SimpleNamespace(bounds=(0.55, 1.0), open_side="above", recommended_rho=0.695)
    assert validation.candidate_range(above, grid) == (0.533, 1.0, 0.695)


def test_the_targets_table_says_met_or_missed_against_the_issue_goals():
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    h = {"n": 6, "same": 5, "same_ci": (0.44, 0.97), "scored": 5, "in_range": 4, "in_ci": (0.38, 0.96),
         "median": 0.31, "median_ci": (0.01, 3.87, 0.97), "beat": 3, "beat_ci": (0.23, 0.88), "beat_clear": 2}
    rows = validation.target_lines(h)
    assert rows[4].endswith("| missed |") and "5/6 = 0.83" in rows[4]       # 0.83 < 0.9
    assert rows[5].endswith("| met |") and "4/5 = 80%" in rows[5]           # exactly the goal
    assert rows[6].endswith("| met |") and "0.31 pooled SEs (97% 0.01 … 3.87)" in rows[6]
    assert validation.target_lines(None) == ["The issue's targets, on the held-out half: no held-out setting complete yet."]


def _round2_suite(tmp_path: Path, freeze: str = "null") -> Path:
    suite = tmp_path / "round2.yaml"
    suite.write_text("round: 2\nsealed: [full10, full30, full100]\nfreeze: " + freeze + "\n"
                     "seeds: {pilot: 3, full10: 3}\nsettings:\n  - name: default\n    base: default\n"
                     "    pilot_budget: 6e11\n    pilot_grid: [0.5, 0.62, 0.74, 0.85]\n"
                     "    full_grid: [0.42, 0.5, 0.62, 0.74, 0.85]\n    on_policy: 0.74\n")
    runs = tmp_path / "runs" / "default"
    runs.mkdir(parents=True, exist_ok=True)
    for kind in ("pilot", "full10"):
        (runs / f"{kind}.json.gz").write_bytes((ROOT / "research" / "validation" / "runs" / "default" / f"{kind}.json.gz").read_bytes())
    return suite


def test_round2_keeps_sealed_full_runs_out_of_every_table_until_frozen(tmp_path):
    """A sealed grid shows only its run count: changing every value in it changes no output; the
    open pilot grid is read. freeze records the commits once, refuses a second time, and unseals."""
    suite = _round2_suite(tmp_path)
    common = [sys.executable, str(ROUND2), "--suite", str(suite), "--runs", str(tmp_path / "runs")]
    first = subprocess.run(common + ["tables"], capture_output=True, text=True, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert "| default | 6e+11 | 12/12 runs (" in first.stdout and "15/15 runs (8c990d4), sealed" in first.stdout
    assert "search-heavy ρ ≤ 0.59, 0.94" in first.stdout        # the open pilot grid: round 1's verdict
    path = tmp_path / "runs" / "default" / "full10.json.gz"
    with gzip.open(path, "rt") as fh:
        rec = json.load(fh)
    for p in rec["pilots"]:                                    # every full-run value changed
        p["evals"] = {k: [1.0 - x for x in v] for k, v in p["evals"].items()}
    with gzip.open(path, "wt") as fh:
        json.dump(rec, fh)
    second = subprocess.run(common + ["tables"], capture_output=True, text=True, cwd=ROOT)
    assert second.stdout == first.stdout
    status = subprocess.run([sys.executable, str(SCRIPT), "--suite", str(suite), "--runs", str(tmp_path / "runs"), "status"],
                            capture_output=True, text=True, cwd=ROOT)
    assert "done: pilot, full10" in status.stdout
    bad = subprocess.run(common + ["freeze", "--rule", "HEAD", "--drift", "abc1234", "--probe", "abc1234"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode != 0 and "--rule 'HEAD' is not a commit" in bad.stderr
    ok = subprocess.run(common + ["freeze", "--rule", "abc1234", "--drift", "def5678", "--probe", "0123abc"],
                        capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    assert "freeze: {rule: 'abc1234', drift: 'def5678', probe: '0123abc', date: '" in suite.read_text()
    again = subprocess.run(common + ["freeze", "--rule", "abc1234", "--drift", "def5678", "--probe", "0123abc"],
                           capture_output=True, text=True, cwd=ROOT)
    assert again.returncode != 0 and "already frozen" in again.stderr
    frozen = subprocess.run(common + ["tables"], capture_output=True, text=True, cwd=ROOT)
    assert "Frozen on" in frozen.stdout and ", sealed" not in frozen.stdout
    # the scores written before the freeze read the unsealed grid: round 1's default at 10 × B
    assert "### Round 2: the scores" in frozen.stdout and "| default | 10×B | search-heavy → " in frozen.stdout
    assert "**10 × B** (1 setting; targets of issue 31 in brackets):" in frozen.stdout


def test_the_learned_rule_by_hand():
    """race.stats.instability.learned (round 2's replacement rule, the report's "nothing learned"): some
    point's mean gain over the base (paired by seed, checkpoint prompts) above both 2 seed SEs and 0.01."""
    from race.stats.instability import learned
    from race.core.records import Checkpoint, FlopBreakdown, PilotResult

    def pilot(rho, seed, base, final):
        cps = (Checkpoint(0.0, 0, FlopBreakdown(), {"reward": tuple(base)}),
               Checkpoint(1.0, 9, FlopBreakdown(1.0), {"reward": tuple(final)}))
        return PilotResult(rho_target=rho, seed=seed, flops=FlopBreakdown(1.0), evals={"reward": tuple(final)},
                           checkpoints=cps)

    # gains at 0.5: 0.25, 0.5, 0.25 → mean 1/3, SE 0.0833: learned
    grid = [pilot(0.5, 0, [0.0, 0.5], [0.5, 0.5]), pilot(0.5, 1, [0.0, 0.0], [0.5, 0.5]),
            pilot(0.5, 2, [0.5, 0.5], [1.0, 0.5]), pilot(0.8, 0, [0.5, 0.5], [0.5, 0.5])]
    ok, gain, se = learned(grid, "reward")
    assert ok and abs(gain - 1 / 3) < 1e-12 and abs(se - (0.0208333 ** 0.5) / 3 ** 0.5) < 1e-6
    # a gain of 0.005 with no spread is under the 0.01 floor: not learned
    tiny = [pilot(0.5, s, [0.0] * 200, [1.0] + [0.0] * 199) for s in range(3)]
    assert learned(tiny, "reward")[0] is False
    assert learned([pilot(0.5, 0, [], [])], "reward") is None


def test_a_grid_that_learned_nothing_is_advised_so_not_told_to_add_seeds():
    """The first round's `hard` pilot grid (reward 0.001–0.004 against a base of the same): the
    report's advice says nothing was learned; `default`'s grid keeps its regime's advice."""
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation

    from race.stats.regime import classify
    from race.stats.report import render_diagnosis

    hard = classify(validation.pilots_of(validation.load_run("hard", "pilot")), n_boot=100)
    text = render_diagnosis(hard)
    assert "advice: nothing was learned: no grid point beat the base policy" in text and "add seeds" not in text
    assert any(w.startswith("nothing learned: no grid point's held-out reward rose above") for w in hard.warnings)
    default = classify(validation.pilots_of(validation.load_run("default", "pilot")), n_boot=100)
    assert "advice: reward falls as ρ rises" in render_diagnosis(default)


def test_the_rate_tables_of_the_stability_doc_are_recomputed_from_the_committed_runs():
    script = ROOT / "research" / "scripts" / "stability.py"
    for extra in ([], ["--suite", str(ROOT / "research" / "validation" / "round2.yaml")]):
        out = subprocess.run([sys.executable, str(script), *extra, "rates", "--check", str(ROOT / "docs" / "stability.md")],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "up to date" in out.stdout


def test_a_settings_more_seeds_resumes_its_complete_grid_and_snapshots_it(tmp_path, monkeypatch):
    """round2.yaml's ``more_seeds``: a committed grid with fewer seeds is wanted again, its seeds per
    point are the setting's, and its storage's progress is snapshot as a partial (the complete record stays)."""
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation as V

    monkeypatch.setattr(V, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(V, "RUNS_OF", {})
    suite = {"seeds": {"full10": 5}, "settings": []}
    s = {"name": "x", "pilot_budget": 1e11, "full_grid": [0.4, 0.6], "more_seeds": {"full10": 7}}
    plain = {"name": "y", "pilot_budget": 1e11, "full_grid": [0.4, 0.6]}
    assert V.seeds_of(suite, "full10", s) == 7 and V.seeds_of(suite, "full10", plain) == 5
    assert not V.wants_more(suite, s, "full10")                     # nothing committed: the queue runs it anyway
    pilot = {"rho_target": 0.4, "seed": 0, "status": "complete"}
    for name in ("x", "y"):
        path = V.data_path(name, "full10")
        path.parent.mkdir(parents=True)
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            json.dump({"setting": name, "kind": "full10", "seeds": 5, "pilots": [pilot]}, fh)
    assert V.wants_more(suite, s, "full10") and not V.wants_more(suite, plain, "full10")
    store = tmp_path / "store" / "x-full10"
    store.mkdir(parents=True)
    (store / "results.json").write_text(json.dumps({"pilots": [pilot, {**pilot, "seed": 5},
                                                               {**pilot, "seed": 6, "status": "running"}]}))
    monkeypatch.setattr(V, "compact_pilot", lambda p: p)
    monkeypatch.setattr(V, "_commit", lambda pin: "abc")
    written = V.snapshot({**suite, "settings": [s, plain]}, tmp_path / "store", tmp_path)
    assert written == [V.data_path("x", "full10", partial=True)]
    with gzip.open(written[0], "rt", encoding="utf-8") as fh:
        part = json.load(fh)
    assert part["seeds"] == 7 and [p["seed"] for p in part["pilots"]] == [0, 5]
    assert V.data_path("x", "full10").is_file()


def test_the_third_round_is_sealed_and_budgeted_by_its_full_run():
    """Round 3 (research/validation/round3.yaml): sealed until its freeze, its tables are its own script's,
    its kinds spend the setting's full run F × their factor (C = F + P = 1.1 F for the baselines at
    F / P = 10), the prior runs at the suite's ρ and on-policy at the setting's point, and a longer
    ratio is planned only where the setting has its grid."""
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation as V

    suite_path = ROOT / "research" / "validation" / "round3.yaml"
    out = subprocess.run([sys.executable, str(SCRIPT), "--suite", str(suite_path), "tables"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 1 and "validation_round3.py" in out.stderr and out.stdout == ""
    suite = V.load_suite(suite_path)
    # frozen (research/scripts/validation_round3.py freeze) before any table read a sealed grid
    assert set(suite["freeze"]) == {"rule", "drift", "probe", "rate", "design", "date"}
    assert not any(V.sealed(suite, k) for k in V.kinds_of(suite))
    assert all(V.sealed({**suite, "freeze": None}, k) for k in V.kinds_of(suite))
    s = V.setting(suite, "clip-higher")
    import pytest

    assert V.budget_of(s, "full10", suite) == 6e12 and V.budget_of(s, "prior10", suite) == pytest.approx(6.6e12)
    assert V.grid_of(s, "prior10", suite) == [suite["prior_rho"]] == [0.46]
    assert V.grid_of(s, "onpolicy10", suite) == [0.7]
    assert V.planned(s, "full30", suite) and not V.planned(s, "full100", suite)
    noisy = V.grid_config(V.setting(suite, "noisy"), "full10", 5, suite=suite)
    assert noisy["reward"]["function"] == str(ROOT / "research/validation/round3/noisy_verifier.py") + ":score"


def test_the_third_rounds_pilot_design_is_computed_from_configs_and_sized_as_race_pilot_sizes():
    """research/scripts/validation_round3.py design: each setting's config as its user would give it (the base
    config's grid and seeds, the setting's overrides, F), through race.run.sizing.size_pilots, the function
    race pilot --design fit calls. With held-out evaluation counted as FLOPs per pilot, no setting fits 4
    pilots in 10 % of its F: RACE's run is the prior's (ρ 0.46) with the whole compute on all ten."""
    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation as V
    import validation_round3 as R3

    suite = V.load_suite(ROOT / "research" / "validation" / "round3.yaml")
    rows = R3.design_rows(suite)
    assert [r["setting"] for r in rows] == [s["name"] for s in suite["settings"]]
    assert all(r["pilots"] == [] and "run at the prior ρ 0.46" in r["why"] for r in rows)
    steps = R3.user_config(V.setting(suite, "steps-keep"), suite)
    assert steps.grid == (0.25, 0.4, 0.55, 0.7) and steps.seeds == 3 and steps.schedule.lower_rho_by == "keep"
    assert "none: the prior ρ 0.46" in R3.design_table(rows)


def test_the_third_rounds_tables_are_the_committed_data():
    """docs/validation.md's round-3 block is what research/scripts/validation_round3.py tables gives (frozen)."""
    out = subprocess.run([sys.executable, str(ROOT / "research" / "scripts" / "validation_round3.py"), "tables",
                          "--check", str(ROOT / "docs" / "validation.md")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_a_gain_at_equal_compute_is_paired_on_prompts_by_hand():
    """validation_round3.gain_ci: the difference of the two sides' means, and a CI that holds it."""
    import numpy as np

    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation_round3 as R3

    a = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    b = np.array([[0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    d, lo, hi = R3.gain_ci(a, b)
    assert d == pytest.approx(6 / 8 - 4 / 12) and lo <= d <= hi and lo > -1 and hi < 1
    grid = {0.3: (0.31, np.array([[1.0, 0.0], [0.0, 0.0]])), 0.5: (0.52, np.array([[1.0, 1.0], [1.0, 0.0]]))}
    # per-seed means 0.5, 0 and 1, 0.5: variance 0.125 each, pooled 0.125, over the best point's 2 seeds
    assert R3.pooled_se(grid) == pytest.approx((0.125 / 2) ** 0.5)


def test_where_pilots_would_have_paid_by_hand():
    """validation_round3.paid_points: the full-run points whose mean beats the prior at C by more than the
    pilots' cost in pooled SEs; share_cost: race.stats.design.pilot_value at 1 / (F / P), 0.50 SEs at 10."""
    import math

    import numpy as np

    sys.path.insert(0, str(ROOT / "research" / "scripts"))
    import validation_round3 as R3
    from race.stats.design import SE_PER_DOUBLING

    assert R3.share_cost(10) == pytest.approx(SE_PER_DOUBLING * math.log2(1 / 0.9))
    assert R3.share_cost(30) < R3.share_cost(10) and R3.share_cost(100) < R3.share_cost(30)
    prior = np.array([[0.5, 0.5], [0.5, 0.5]])                       # mean 0.5
    grid = {0.3: (0.31, np.array([[0.6, 0.6]])), 0.5: (0.52, np.array([[0.54, 0.54]])),
            0.7: (0.69, np.array([[0.4, 0.4]]))}
    # se 0.1, cost 0.5 SE: a point must beat 0.5 by more than 0.05 (0.6 does, 0.54 does not, 0.4 does not)
    assert R3.paid_points(grid, prior, 0.1, 0.5) == [0.31]
    assert R3.paid_points(grid, prior, 0.1, 0.3) == [0.31, 0.52]
    assert R3.paid_points(grid, prior, 0.1, 2.0) == []
    assert [s["name"] for s in R3.settings_at({"settings": [{"name": "a"}, {"name": "b", "long_grid": [0.3]}]}, 30)] \
        == ["b"]
