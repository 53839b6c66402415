"""research/scripts/drift_saturating.py, lc_stop.py and eval_share.py (issue 49, items 6, 4 and 1): the shapes and the curve
fits on numbers worked by hand, one figure recomputed by hand from a committed record, and the tables of
docs/drift.md and docs/pilot.md are what the committed data of rounds 1-2 give."""
from __future__ import annotations

import gzip
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "research" / "scripts"
sys.path.insert(0, str(SCRIPTS))

import drift_saturating as DS  # noqa: E402
import lc_stop as LC  # noqa: E402
import replay as R  # noqa: E402


def test_the_shapes_move_nothing_at_b_and_the_logistic_by_hand():
    assert DS.shape_g("linear", (-0.05,), 0.0) == 0.0
    assert DS.shape_g("linear", (-0.05,), math.log10(30)) == pytest.approx(-0.05 * 1.4771212547)
    # Δ = -0.4, midpoint x0 = 1, width w = 0.5: at x = 1, Δ (1/2 - 1/(1 + e^2))
    assert DS.shape_g("logistic (free)", (-0.4, 1.0, 0.5), 0.0) == pytest.approx(0.0)
    assert DS.shape_g("logistic (free)", (-0.4, 1.0, 0.5), 1.0) == pytest.approx(-0.4 * (0.5 - 1 / (1 + math.e ** 2)))
    # far past the midpoint the move levels off at its ceiling, less the part before B
    assert DS.shape_g("logistic (free)", (-0.4, 1.0, 0.5), 50.0) == pytest.approx(-0.4 * (1 - 1 / (1 + math.e ** 2)))


def test_the_curve_models_recover_curves_of_their_own_form():
    ts = [1 / 64, 0.0283, 0.0513, 0.0929, 0.168]
    loglin = [(t, 0.5 + 0.02 * math.log(t)) for t in ts]
    assert LC.extrapolate(loglin, "log-linear") == pytest.approx(0.5, abs=1e-9)
    power = [(t, 0.8 - 0.1 * t ** (-0.3)) for t in ts]
    assert LC.extrapolate(power, "power law") == pytest.approx(0.7, abs=1e-3)
    assert LC.extrapolate(power, "no extrapolation") == power[-1][1]
    # two checkpoints: the power law falls back on the log-linear fit
    assert LC.extrapolate(loglin[:2], "power law") == pytest.approx(0.5, abs=1e-9)


def test_a_point_stops_only_when_the_best_beats_it_by_z_ses(monkeypatch):
    fake = {0.5: (0.60, 0.01, 3), 0.6: (0.58, 0.01, 3), 0.7: (0.50, 0.01, 3), 0.8: (0.40, math.inf, 3)}
    monkeypatch.setattr(LC, "predictions", lambda name, model, frac: fake)
    LC.stopped.cache_clear()
    try:
        # 2 SEs of a difference: 2 * sqrt(2) * 0.01 = 0.028; 0.60 - 0.58 = 0.02 < 0.028; 0.10 > 0.028
        assert LC.stopped("x", "log-linear", 0.3, 2.0) == frozenset({0.7})
        assert LC.stopped("x", "log-linear", 0.3, 1.0) == frozenset({0.6, 0.7})   # 0.02 > 0.014
    finally:
        LC.stopped.cache_clear()


def test_a_prediction_recomputed_by_hand_from_the_committed_record():
    """default's pilot grid, no extrapolation at 0.17 B: the mean over each point's seeds of the
    checkpoint prompts' mean reward at fraction 0.168238, read straight from the gzip JSON."""
    rec = json.loads(gzip.open(ROOT / "research" / "validation" / "runs" / "default" / "pilot.json.gz").read())
    by: dict[float, list[float]] = {}
    for p in rec["pilots"]:
        if p.get("status") != "complete":
            continue
        c = next(c for c in p["checkpoints"] if abs(c["fraction"] - 0.168238) < 1e-5)
        by.setdefault(p["rho_target"], []).append(statistics.fmean(c["evals"]["reward"]))
    got = LC.predictions("default", "no extrapolation", 0.168238)
    assert sorted(got) == sorted(by)
    for t, v in by.items():
        assert got[t][0] == pytest.approx(statistics.fmean(v), abs=1e-12)
        assert got[t][1] == pytest.approx(statistics.stdev(v) / math.sqrt(len(v)), abs=1e-12)


@pytest.mark.parametrize("script, doc", [("drift_saturating.py", "drift.md"), ("lc_stop.py", "pilot.md"),
                                         ("eval_share.py", "pilot.md")])
def test_the_docs_tables_are_recomputed_from_the_committed_data(script, doc):
    out = subprocess.run([sys.executable, str(SCRIPTS / script), "tables", "--check", str(ROOT / "docs" / doc)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_a_cheaper_read_keeps_the_first_prompts_and_the_chosen_checkpoints():
    """eval_share.cut: the final evaluation's first k prompts of every target; checkpoints all, the
    thinned three plus the one at 1, or none; and the evaluation shares by hand."""
    import eval_share as ES

    p = R.truncated(R.raw_pilots("default")[0], 1.0)
    c = ES.cut(p, 100, "thin")
    assert all(c.evals[t] == tuple(p.evals[t][:100]) for t in p.evals)
    assert [round(x.fraction, 3) for x in c.checkpoints] == [0.0, 0.168, 0.552, 1.0]
    assert ES.cut(p, 500, "none").checkpoints == () and ES.cut(p, 500, "all").checkpoints == p.checkpoints
    assert ES.eval_cost(500, "all") == 1.0
    assert ES.eval_cost(500, "thin") == pytest.approx(800 / 1300)
    assert ES.eval_cost(100, "none") == pytest.approx(100 / 1300)
