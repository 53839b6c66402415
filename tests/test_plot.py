"""race/run/plot.py: the figure shows what the diagnosis says (data read back from the artists)."""
from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from race.run.cli import main
from race.run.plot import PlotError, binned_curve, check_plot_path, checkpoint_curve, fit_curve, plot_results
from race.core.records import Regime, TargetVerdict
from race.stats.regime import classify
from race.stats.results import Results, load_results, save_results
from test_regime import FALLING, synthetic_results


def _results() -> Results:
    """A falling synthetic grid (3 seeds) whose pilots carry rising training curves."""
    pilots = []
    for p in synthetic_results(response=FALLING, n_seeds=3, reward_fraction=0.1, seed=3):
        steps = np.linspace(0.0, p.flops.total, 21)[1:]
        curve = tuple((float(f), float(0.3 + 0.2 * f / p.flops.total + 0.01 * p.seed % 3)) for f in steps)
        pilots.append(replace(p, curve=curve))
    diag = classify(pilots, meta={"model": "tiny", "task": "arith", "reward": "sparse"})
    return Results(pilots=tuple(pilots), diagnosis=diag)


def test_binned_curve_pools_runs_by_hand():
    runs = [[(1.0, 0.0), (2.0, 1.0), (3.0, 0.5), (4.0, 1.0)], [(1.0, 1.0), (4.0, 0.0)]]
    x, y = binned_curve(runs, n_bins=2)      # edges 0, 2, 4: {1, 1} | {2, 3, 4, 4}
    np.testing.assert_allclose(x, [1.0, 3.0])
    np.testing.assert_allclose(y, [0.5, (1.0 + 0.5 + 1.0 + 0.0) / 4])
    x, y = binned_curve([[(0.5, 1.0), (4.0, 0.0)]], n_bins=4)
    assert y[0] == 1.0 and y[3] == 0.0 and np.isnan(y[1]) and np.isnan(y[2])
    assert binned_curve([])[0].size == 0


def test_fit_curve_falls_back_to_the_best_aicc_fit_when_nothing_is_decisive():
    v = TargetVerdict("reward", Regime.INCONCLUSIVE, (0.4, 0.4), 0.3, 0.4, 0.5, 0.1, (-0.1, 0.3), None, (),
                      {"chosen": None, "best_by_aicc": "loglinear", "loglinear": {"coef": [0.5, 0.1]},
                       "rho_measured": [0.3, 0.4, 0.6]})
    name, decisive, x, y = fit_curve(v)
    assert name == "loglinear" and not decisive
    assert x[0] == pytest.approx(0.3) and x[-1] == pytest.approx(0.6)
    np.testing.assert_allclose(y, 0.5 + 0.1 * np.log(x))
    assert fit_curve(replace(v, fits={})) is None


def test_the_figure_draws_the_diagnosis(tmp_path):
    res = _results()
    v = res.diagnosis.primary
    assert v.regime is Regime.SEARCH_HEAVY
    fig = plot_results(res, str(tmp_path / "fig.png"))
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ax_r, ax_s, ax_c = fig.axes[:3]
    assert "search-heavy" in ax_r.get_title() and "tiny" in fig.get_suptitle()
    # error bars: the grid point means at their measured ρ
    means = [ln for ln in ax_r.get_lines() if ln.get_marker() == "o"]
    assert len(means) == 1
    np.testing.assert_allclose(means[0].get_xdata(), [p.rho_measured for p in v.points])
    np.testing.assert_allclose(means[0].get_ydata(), [p.reward_mean for p in v.points])
    # every pilot is a dot at (measured ρ, score)
    dots = ax_r.collections[0].get_offsets()
    assert len(dots) == len(res.pilots)
    np.testing.assert_allclose(sorted(dots[:, 1]), sorted(p.score("reward") for p in res.pilots))
    # the chosen fit, solid, evaluated from its stored coefficients
    fit = [ln for ln in ax_r.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 200]
    assert len(fit) == 1
    coef = v.fits[v.fits["chosen"]]["coef"]
    np.testing.assert_allclose(fit[0].get_ydata(), np.polynomial.polynomial.polyval(np.log(fit[0].get_xdata()), coef))
    # the recommended range: this grid's best is its lowest ρ, so the range is open below (ρ ≤ its
    # top) and shaded from the axis' left end to exactly its top
    assert v.open_side == "below" and v.best_rho == min(p.rho_target for p in v.points)
    patch = ax_r.patches[0]   # a Rectangle since matplotlib 3.9, a Polygon before
    span = ([patch.get_x(), patch.get_x() + patch.get_width()] if hasattr(patch, "get_width")
            else np.asarray(patch.get_xy())[:, 0])
    assert min(span) == pytest.approx(ax_r.get_xlim()[0], rel=1e-6)
    assert min(span) < min(p.rho_measured for p in v.points)
    assert max(span) == pytest.approx(v.rho_range[1], rel=1e-6)
    assert f"recommended ρ ≤ {v.rho_range[1]:.2f}" in [t.get_text() for t in ax_r.get_legend().get_texts()]
    # compute split: stacked shares per grid point, reward included (it is non-zero here)
    bars = {c.get_label(): [b.get_height() for b in c] for c in ax_s.containers}
    assert set(bars) == {"C_search", "C_learning", "C_reward"}
    np.testing.assert_allclose(bars["C_learning"], [100 * p.flops.shares()["learning"] for p in v.points])
    np.testing.assert_allclose(np.sum(list(bars.values()), axis=0), 100.0)
    # one training curve per grid point, pooled over its 3 seeds
    assert [ln.get_label() for ln in ax_c.get_lines()] == [f"ρ {p.rho_target:.2f} (3 seeds)" for p in v.points]
    y = ax_c.get_lines()[0].get_ydata()
    assert y[0] < y[-1]


def test_held_out_checkpoints_are_drawn_as_seed_means(tmp_path):
    from race.core.records import Checkpoint, FlopBreakdown

    def cps(scores, scale=1.0):
        return tuple(Checkpoint(i / 4, i, FlopBreakdown(scale * i * 1e9), {"reward": (s, s)}) for i, s in enumerate(scores))

    res = _results()
    a, b = [p for p in res.pilots if math.isclose(p.rho_target, res.pilots[0].rho_target)][:2]
    x, y = checkpoint_curve([replace(a, checkpoints=cps([0.3, 0.5, 0.6])),
                             replace(b, checkpoints=cps([0.3, 0.7, 0.8], 3.0)),
                             replace(b, checkpoints=cps([0.3, 0.9]))], "reward")     # odd one out: left out
    np.testing.assert_allclose(x, [0.0, 2e9, 4e9])
    np.testing.assert_allclose(y, [0.3, 0.6, 0.7])
    assert checkpoint_curve([a], "reward")[0].size == 0
    pilots = tuple(replace(p, checkpoints=cps([0.3, 0.4, 0.5])) for p in res.pilots)
    fig = plot_results(replace(res, pilots=pilots))
    ax_c = fig.axes[2]
    held = [ln for ln in ax_c.get_lines() if ln.get_marker() == "o"]
    assert len(held) == len(res.diagnosis.primary.points) and "held-out" in ax_c.get_title()
    np.testing.assert_allclose(held[0].get_ydata(), [0.3, 0.4, 0.5])


@pytest.mark.parametrize("suffix,magic", [(".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_pdf_and_svg(tmp_path, suffix, magic):
    save_results(str(tmp_path), _results())
    path = tmp_path / f"sub/fig{suffix}"
    plot_results(str(tmp_path), str(path))
    assert path.read_bytes()[:len(magic)] == magic


def test_bad_plot_requests_name_the_value(tmp_path):
    with pytest.raises(PlotError, match=r"'fig.jpg' has suffix '.jpg': expected one of .png, .pdf, .svg"):
        check_plot_path("fig.jpg")
    with pytest.raises(PlotError, match=r"target 'pass@9' is not in this diagnosis: expected one of reward"):
        plot_results(_results(), target="pass@9")


def test_cli_report_plot(tmp_path):
    save_results(str(tmp_path), _results())
    r = CliRunner().invoke(main, ["report", str(tmp_path), "--plot", str(tmp_path / "f.svg")])
    assert r.exit_code == 0, r.output
    assert "search-heavy" in r.output and (tmp_path / "f.svg").stat().st_size > 10_000
    r = CliRunner().invoke(main, ["report", str(tmp_path), "--plot", "f.jpg"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "Error: plot file 'f.jpg' has suffix '.jpg'" in r.output and "search-heavy" not in r.output


def test_cli_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    save_results(str(tmp_path), _results())
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)   # import fails as if not installed
    r = CliRunner().invoke(main, ["report", str(tmp_path), "--plot", str(tmp_path / "f.png")])
    assert r.exit_code == 2
    assert 'plots need matplotlib, which is not installed: pip install "race-rl[plot]"' in r.output
    assert not (tmp_path / "f.png").exists()


def test_cli_pilot_refuses_a_bad_plot_before_running_anything(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["pilot", "--out", str(out), "--plot", str(tmp_path / "fig.gif")])
    assert r.exit_code == 2 and "expected one of .png, .pdf, .svg" in r.output
    assert not out.exists()


def test_stored_diagnosis_and_refit_draw_the_same_verdict(tmp_path):
    res = _results()
    save_results(str(tmp_path), res)
    loaded = load_results(str(tmp_path))
    a = plot_results(loaded).axes[0].get_title()
    b = plot_results(loaded, refit=True).axes[0].get_title()
    assert a == b and math.isfinite(res.diagnosis.primary.confidence)


def test_a_range_at_f_adds_the_drift_panel(tmp_path):
    """With a full-run budget the figure gets a fifth panel: ρ*(C) at the pilots' checkpoint budgets,
    the ranges at B and at F and the drift between (race.stats.drift)."""
    from pathlib import Path

    from race.stats.forecast import with_forecast
    from race.run.plot import drift_points, plot_results
    from race.stats.results import load_results

    src = Path(__file__).resolve().parents[1] / "docs" / "runs" / "tiny-reasoner.results.json.gz"
    res = load_results(str(src))
    res = type(res)(**{**res.__dict__, "diagnosis": with_forecast(res, full_run_budget=5e13, n_boot=20)})
    pts = drift_points(res.pilots, float(res.config["budget"]), "reward")
    assert len(pts) == 8 and all(0 < r < 1 for _, r in pts) and pts[-1][0] == pytest.approx(1.0, rel=0.05)
    fig = plot_results(res, str(tmp_path / "f.png"))
    assert len(fig.axes) == 5 and fig.axes[4].get_title().startswith("ρ*(C): ")
    assert (tmp_path / "f.png").stat().st_size > 10_000
