"""The budget-drift model (race.stats.drift): the joint surface recovers a known drift, claims none on a
flat surface, the range at F moves, widens past the validated factor and is refused past the
largest; the frozen population figures are what the first round's data give."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from race.stats import drift as D

ROOT = Path(__file__).resolve().parents[1]


def _surface(d_true: float, k: float, *, seed: int = 0, sd: float = 0.02, seeds: int = 3):
    rng = np.random.default_rng(seed)
    obs = []
    for i, x in enumerate(np.linspace(-1.8, 1.0, 8)):          # B/64 … 10 × B
        alpha = 0.3 + 0.1 * x
        for rho in (0.3, 0.42, 0.5, 0.62, 0.74, 0.85):
            y = [alpha - k * (rho - (0.55 + d_true * x)) ** 2 + rng.normal(0, sd) for _ in range(seeds)]
            obs.append(D.Observation(level=i, x=float(x), rho=rho, y=float(np.mean(y)), se=sd / math.sqrt(seeds)))
    return obs


@pytest.mark.parametrize("d_true", [-0.12, 0.0, 0.06])
def test_a_known_drift_is_recovered_within_its_ci(d_true):
    """Over 30 noisy surfaces the ±2 SE interval covers the true drift ≥ 85 % of the time (95 %
    expected; 100 surfaces measured 0.95 / 0.98 / 1.00), and the estimate is unbiased to 0.01."""
    fits = [D.fit_joint(_surface(d_true, k=1.5, seed=s)) for s in range(30)]
    cover = sum(abs(f.d - d_true) <= 2 * f.d_se for f in fits) / len(fits)
    assert cover >= 0.85 and abs(np.mean([f.d for f in fits]) - d_true) < 0.01
    assert all(f.d_se < 0.03 and f.levels == 8 for f in fits)
    assert np.mean([f.c0 for f in fits]) == pytest.approx(0.55, abs=0.01)


def test_a_flat_surface_claims_no_drift_and_shrinks_to_the_population():
    fit = D.fit_joint(_surface(-0.2, k=0.0, seed=3))
    assert abs(fit.d) < 2 * fit.d_se                         # not told apart from no drift
    d, se = D.shrink(fit.d, fit.d_se)
    assert abs(d - D.POPULATION_DRIFT) < abs(fit.d - D.POPULATION_DRIFT) or abs(fit.d - D.POPULATION_DRIFT) < 0.01
    assert D.shrink(float("nan"), math.inf) == (D.POPULATION_DRIFT, D.POPULATION_SPREAD)
    one_budget = [o for o in _surface(-0.1, k=1.5) if o.level == 0]
    assert D.fit_joint(one_budget).d_se == math.inf        # one budget level identifies no drift


def test_shrinkage_is_the_precision_weighted_mean_by_hand():
    d, se = D.shrink(-0.30, 0.10, d_pop=-0.05, spread=0.05)   # weights 100 and 400
    assert d == pytest.approx((100 * -0.30 + 400 * -0.05) / 500) and se == pytest.approx(math.sqrt(1 / 500))


def test_the_range_at_f_moves_widens_past_the_validated_factor_and_is_refused_past_the_largest():
    r = D.range_at((0.5, 0.6), 0.55, pilot_budget=1e12, full_run_budget=1e13, drift=-0.1, drift_se=0.02)
    assert r.shift == pytest.approx(-0.1) and r.validated
    half = D.Z90 * 0.02
    assert r.rho_range == pytest.approx((0.4 - half, 0.5 + half)) and r.recommended_rho == pytest.approx(0.45)
    assert "validated up to 30 × B" in r.line() and "[0.50, 0.60]" in r.line()
    past = D.range_at((0.5, 0.6), 0.55, pilot_budget=1e12, full_run_budget=3e14, drift=-0.1, drift_se=0.02)
    dv, dx = math.log10(30), math.log10(300)
    assert not past.validated and past.shift_ci[1] - past.shift == pytest.approx(D.Z90 * 0.02 * (dv + 2 * (dx - dv)))
    assert "PAST the validated 30 × B" in past.line()
    with pytest.raises(D.DriftError, match=r"F = 2e\+15 FLOPs is 2e\+03 × the pilot budget, past the 1000 ×"):
        D.range_at((0.5, 0.6), 0.55, pilot_budget=1e12, full_run_budget=2e15)
    with pytest.raises(D.DriftError, match="smaller than a pilot"):
        D.range_at((0.5, 0.6), 0.55, pilot_budget=1e12, full_run_budget=1e11)
    edge = D.range_at((0.05, 0.1), 0.07, pilot_budget=1.0, full_run_budget=30.0, drift=-0.2, drift_se=0.1)
    assert edge.rho_range[0] == 0.01 and 0.01 <= edge.recommended_rho <= edge.rho_range[1]


def test_the_population_figures_are_what_both_rounds_data_give():
    suites = [x for f in ("suite.yaml", "round2.yaml") for x in ("--suite", str(ROOT / "research" / "validation" / f))]
    out = subprocess.run([sys.executable, str(ROOT / "research" / "scripts" / "drift.py"), "population", *suites],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert (f"d = {D.POPULATION_DRIFT:+.3f} (SE" in last and f"τ = {D.POPULATION_SPREAD:.3f}" in last
            and f"{D.POPULATION_SETTINGS} settings" in last), last


def test_a_recipe_from_results_runs_at_the_range_at_f_and_says_so():
    from race.fullrun.recipes import recipe

    src = str(ROOT / "docs" / "runs" / "tiny-steps-sparse.results.json")
    at_b = recipe(src, trainer="trl", full_run_budget=3e11)           # 1 × B: nothing moves
    at_f = recipe(src, trainer="trl", full_run_budget=9e12)           # 30 × B
    assert at_f.rho < at_b.rho
    assert at_f.notes[0].startswith(f"ρ={at_f.rho:g} is the recommended ρ of the range at F: range at F = 9e+12")
    far = recipe(src, trainer="trl", full_run_budget=1e16)
    assert "is the recommended ρ of the range at B" in far.notes[0] and "no range at F: F = 1e+16" in far.notes[0]
    given = recipe(src, trainer="trl", full_run_budget=9e12, rho=0.5)
    assert not any("recommended ρ of the range" in n for n in given.notes)


def test_the_drift_docs_tables_are_recomputed_from_the_committed_data():
    out = subprocess.run([sys.executable, str(ROOT / "research" / "scripts" / "drift.py"), "tables", "--check",
                          str(ROOT / "docs" / "drift.md")], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr


def test_the_drift_docs_tables_over_both_rounds_are_recomputed_from_the_committed_data():
    """docs/drift.md's after-unsealing block: both validation rounds read as one set of settings."""
    out = subprocess.run([sys.executable, str(ROOT / "research" / "scripts" / "drift.py"), "tables", "--check",
                          str(ROOT / "docs" / "drift.md"), "--suite", "research/validation/suite.yaml",
                          "--suite", "research/validation/round2.yaml"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
