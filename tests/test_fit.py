"""race.stats.fit: fits checked by hand, the paired bootstrap's structure, determinism and speed."""
from __future__ import annotations

import math

import numpy as np
import pytest

from race.stats import fit

RHO = np.array([0.3, 0.45, 0.6, 0.72, 0.85])
X = np.log(RHO)


def _grid(scores_by_point, *, rho=RHO, seeds=None):
    """scores_by_point: list over points of (n_seeds, n_prompts) arrays."""
    t, s, r, y = [], [], [], []
    for rho_p, block in zip(rho, scores_by_point):
        for i, row in enumerate(np.atleast_2d(block)):
            t.append(rho_p), s.append(i if seeds is None else seeds[i]), r.append(rho_p), y.append(row)
    return fit.grid_scores(rho_targets=t, pilot_seeds=s, pilot_rho=r, scores=y)


# ----------------------------------------------------------------------------- fits

def test_loglinear_recovers_an_exact_line():
    f = fit.fit_loglinear(rho=RHO, y=0.3 + 0.1 * X)
    np.testing.assert_allclose(f.coef, [0.3, 0.1], atol=1e-12)
    assert f.rss == pytest.approx(0.0, abs=1e-20) and f.k == 2 and f.n == 5


def test_constant_is_the_mean_with_its_rss():
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    f = fit.fit_constant(rho=RHO, y=y)
    assert f.coef == pytest.approx([3.0])
    assert f.rss == pytest.approx(10.0)                      # 4 + 1 + 0 + 1 + 4
    assert f.rmse == pytest.approx(math.sqrt(2.0))
    assert f.aic == pytest.approx(5 * math.log(2.0) + 2)
    assert f.aicc == pytest.approx(5 * math.log(2.0) + 2 + 2 * 1 * 2 / 3)


def test_quadratic_vertex_and_aicc_undefined_when_saturated():
    y = 1.0 - 2.0 * (X - math.log(0.55)) ** 2
    f = fit.fit_quadratic(rho=RHO, y=y)
    assert f.coef[2] == pytest.approx(-2.0)
    arg, concave, interior = fit.quadratic_argmax(coef=f.coef, rho_min=0.3, rho_max=0.85)
    assert float(arg) == pytest.approx(0.55) and concave and interior
    three = fit.fit_quadratic(rho=RHO[:3], y=y[:3])
    assert three.aicc is None and three.rss == pytest.approx(0.0, abs=1e-20)


def test_predict_and_stacked_fits_match_single_fits():
    rng = np.random.default_rng(0)
    ys = rng.normal(size=(7, 5))
    stacked = fit.fit_quadratic(rho=RHO, y=ys)
    for i in range(7):
        one = fit.fit_quadratic(rho=RHO, y=ys[i])
        np.testing.assert_allclose(stacked.coef[i], one.coef, atol=1e-12)
        assert stacked.rss[i] == pytest.approx(one.rss)
    np.testing.assert_allclose(stacked.predict(rho=RHO), stacked.coef @ np.vander(X, 3, increasing=True).T)
    assert set(fit.compare_fits(rho=RHO, y=ys[0])) == {"constant", "loglinear", "quadratic"}


@pytest.mark.parametrize("coef, expected_rho, concave, interior", [
    ((0.0, -2 * -1.0 * math.log(0.55), -1.0), 0.55, True, True),   # vertex inside
    ((0.0, -2 * -1.0 * math.log(0.10), -1.0), 0.30, True, False),   # vertex below the grid: clamp
    ((0.0, -2 * -1.0 * math.log(2.00), -1.0), 0.85, True, False),   # vertex above the grid: clamp
    ((0.0, 0.0, 1.0), 0.30, False, False),                          # convex: the higher end (|log 0.3| larger)
    ((0.0, 0.5, 0.0), 0.85, False, False),                          # a rising line
    ((0.0, -0.5, 0.0), 0.30, False, False),                         # a falling line
])
def test_quadratic_argmax_is_clamped_and_flagged(coef, expected_rho, concave, interior):
    arg, c, i = fit.quadratic_argmax(coef=np.array(coef), rho_min=0.3, rho_max=0.85)
    assert float(arg) == pytest.approx(expected_rho) and bool(c) is concave and bool(i) is interior


def test_percentile_ci_and_t_quantile():
    assert fit.percentile_ci(samples=np.arange(101.0), confidence_level=0.9) == pytest.approx((5.0, 95.0))
    for df, exact in [(1, 6.3138), (2, 2.9200), (4, 2.1318), (5, 2.0150), (10, 1.8125), (30, 1.6973)]:
        assert fit.t_quantile(q=0.95, df=df) == pytest.approx(exact, abs=0.01)


def test_fit_errors():
    with pytest.raises(ValueError, match="needs ≥ 3 distinct ρ, got 2"):
        fit.fit_quadratic(rho=[0.3, 0.3, 0.6], y=[1.0, 2.0, 3.0])


# ----------------------------------------------------------------------------- grid data

def test_grid_scores_sorts_canonically_and_summarises():
    scores = [[[1.0, 0.0], [0.0, 0.0]], [[1.0, 1.0]], [[0.5, 0.5], [0.5, 0.5]]]
    g = _grid(scores, rho=RHO[:3], seeds=[7, 3])
    np.testing.assert_array_equal(g.pilot_seeds, [3, 7, 7, 3, 7])       # (ρ, seed) order
    np.testing.assert_array_equal(g.n_seeds, [2, 1, 2])
    np.testing.assert_allclose(g.point_means, [0.25, 1.0, 0.5])
    # pilot means 0.5, 0.0 around 0.25 and 0.5, 0.5: pooled SD = √(2·0.25² / 2)
    assert g.seed_sd() == pytest.approx(0.25)
    perm = [4, 0, 3, 1, 2]
    shuffled = fit.grid_scores(rho_targets=g.pilot_rho[perm], pilot_seeds=g.pilot_seeds[perm],
                               pilot_rho=g.pilot_rho[perm], scores=g.scores[perm])
    np.testing.assert_array_equal(shuffled.scores, g.scores)


def test_grid_scores_errors():
    with pytest.raises(ValueError, match=r"duplicate pilot \(rho_target=0.3, seed=1\)"):
        fit.grid_scores(rho_targets=[0.3, 0.3], pilot_seeds=[1, 1], pilot_rho=[0.3, 0.3], scores=[[1.0], [0.0]])
    with pytest.raises(ValueError, match="NaN"):
        fit.grid_scores(rho_targets=[0.3], pilot_seeds=[1], pilot_rho=[0.3], scores=[[float("nan")]])
    with pytest.raises(ValueError, match=r"scores must have shape \(n_pilots=2"):
        fit.grid_scores(rho_targets=[0.3, 0.4], pilot_seeds=[1, 1], pilot_rho=[0.3, 0.4], scores=[[1.0]])


# ----------------------------------------------------------------------------- bootstrap

def _paired_grid(slope=0.05, n_prompts=200, n_seeds=2, seed_shift=0.0):
    """Per-prompt scores = a shared prompt difficulty + slope·log ρ (+ ±seed_shift per seed)."""
    base = np.random.default_rng(1).uniform(0.0, 0.6, size=n_prompts)
    blocks = [np.stack([base + slope * x + seed_shift * (2 * (s % 2) - 1) for s in range(n_seeds)]) for x in X]
    return _grid(blocks)


def test_prompt_resampling_is_paired():
    # Prompt difficulty is shared by every pilot, so it cancels: every replicate has the true slope.
    boot = fit.bootstrap_response(grid=_paired_grid(), n_boot=300, seed=0)
    np.testing.assert_allclose(boot.slope, 0.05, atol=1e-12)
    assert boot.point_means.std(axis=0).min() > 0.005                 # but the level moves
    assert boot.quadratic[:, 2] == pytest.approx(np.zeros(300), abs=1e-9)


@pytest.mark.parametrize("mode", ["within", "pooled"])
def test_two_seed_resampling_has_the_textbook_variance(mode):
    # Two seeds at ±d: s² = 2d², so Var(point mean) = s²/n = d². A plain resample would give d²/2.
    d = 0.02
    g = _paired_grid(slope=0.0, n_prompts=50, seed_shift=d)
    boot = fit.bootstrap_response(grid=g, n_boot=20_000, seed=3, seed_resampling=mode)
    contrast = boot.point_means[:, 0] - boot.point_means.mean(axis=1)   # removes the prompt part
    # Var(m_0 − mean) = (1 − 2/5 + 5/25)·d² = 0.8·d² when the 5 points are independent
    assert contrast.var() == pytest.approx(0.8 * d ** 2, rel=0.05)
    wide = fit.bootstrap_response(grid=g, n_boot=20_000, seed=3, seed_resampling=mode, seed_scale=1.5)
    wide_contrast = wide.point_means[:, 0] - wide.point_means.mean(axis=1)
    assert wide_contrast.std() == pytest.approx(1.5 * contrast.std(), rel=0.05)


def test_single_seed_point_borrows_pooled_seed_noise():
    g = _paired_grid(slope=0.0, n_prompts=50, seed_shift=0.02)
    keep = ~((g.point_index == 2) & (g.pilot_seeds == 1))
    g1 = fit.grid_scores(rho_targets=g.pilot_rho[keep], pilot_seeds=g.pilot_seeds[keep],
                         pilot_rho=g.pilot_rho[keep], scores=g.scores[keep])
    pooled = fit.bootstrap_point_means(grid=g1, n_boot=4000, seed=0)
    within = fit.bootstrap_point_means(grid=g1, n_boot=4000, seed=0, seed_resampling="within")
    spread = lambda m: (m[:, 2] - m.mean(axis=1)).std()               # noqa: E731
    assert spread(pooled) > 0.015 and spread(within) < 0.01
    with pytest.raises(ValueError, match="seed_resampling 'both' is unknown"):
        fit.bootstrap_point_means(grid=g1, n_boot=10, seed_resampling="both")


def test_bootstrap_is_deterministic_and_order_free():
    rng = np.random.default_rng(5)
    t = np.repeat(RHO, 3)
    s = np.tile([11, 12, 13], 5)
    y = rng.binomial(4, 0.4, size=(15, 120)) / 4
    a = fit.bootstrap_response(grid=fit.grid_scores(rho_targets=t, pilot_seeds=s, pilot_rho=t, scores=y),
                               n_boot=200, seed=9)
    perm = rng.permutation(15)
    b = fit.bootstrap_response(grid=fit.grid_scores(rho_targets=t[perm], pilot_seeds=s[perm],
                                                    pilot_rho=t[perm], scores=y[perm]), n_boot=200, seed=9)
    c = fit.bootstrap_response(grid=fit.grid_scores(rho_targets=t, pilot_seeds=s, pilot_rho=t, scores=y),
                               n_boot=200, seed=10)
    for name in ("point_means", "loglinear", "quadratic", "argmax_rho", "concave", "interior"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.slope, c.slope)
    inside = (a.argmax_rho >= 0.3 - 1e-12) & (a.argmax_rho <= 0.85 + 1e-12)
    assert inside.all() and not np.any(a.interior & ~a.concave)


