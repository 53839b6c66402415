"""research/scripts/replay.py (issues 48 and 49): the no-pilot prior on a tiny synthetic case, the
checkpoint reads the designs use, the pass-rate bar, and docs/pilot.md's replay tables are what the
committed data of rounds 1-2 give."""
from __future__ import annotations

import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "research" / "scripts" / "replay.py"
sys.path.insert(0, str(ROOT / "research" / "scripts"))

import replay as R  # noqa: E402


def _run(rho_target: float, seed: int, rho: float, score: float, ckpts=((0.0, 0.1), (0.5, None), (1.0, None))) -> dict:
    """A compact pilot dict: ``score`` on every prompt at the end, checkpoints at the given fractions
    (a None score: the end's)."""
    flops = {"search": (1 - rho) * 100.0, "learning": rho * 100.0, "reward": 0.0}
    cps = [{"fraction": f, "step": int(10 * f), "flops": {k: v * f for k, v in flops.items()},
            "evals": {"reward": [score if s is None else s] * 4, "pass@1": [score if s is None else s] * 4}}
           for f, s in ckpts]
    return {"rho_target": rho_target, "seed": seed, "rho": rho, "flops": flops,
            "evals": {"reward": [score] * 4}, "schedule": None, "curve": [[50.0, score], [100.0, score]],
            "wall_seconds": {}, "status": "complete", "extra": {}, "checkpoints": cps}


def test_the_prior_is_the_median_best_rho_of_the_other_settings(monkeypatch):
    """Three settings, each with a 10 x B grid of two points: best measured ρ 0.30, 0.50, 0.70.
    Leaving one out, the prior is the median of the other two (their mean)."""
    import validation as V

    def grid(name: str, best: float, other: float) -> dict:
        pilots = [_run(t, s, t + 0.01, (0.8 if t == best else 0.6) + 0.01 * s) for t in (best, other) for s in (0, 1)]
        return {"setting": name, "round": 1, "kind": "full10", "factor": 10, "B": 1.0, "F": 10.0, "s": {"name": name},
                "pilot": None, "full": {"pilots": pilots}, "on_policy": None, "constant": True, "scored": True}

    fake = (grid("a", 0.30, 0.60), grid("b", 0.50, 0.20), grid("c", 0.70, 0.40))
    monkeypatch.setattr(R, "grids", lambda: fake)
    from race.core.records import PilotResult

    monkeypatch.setattr(V, "pilots_of", lambda rec: [PilotResult.from_dict({**p, "schedule": _schedule(p)})
                                                     for p in rec["pilots"]])
    R.response.cache_clear()
    try:
        assert [round(R.response(i).best_rho, 6) for i in range(3)] == [0.31, 0.51, 0.71]
        assert R.prior_rho("a") == pytest.approx((0.51 + 0.71) / 2)
        assert R.prior_rho("b") == pytest.approx((0.31 + 0.71) / 2)
        assert R.prior_rho("c") == pytest.approx((0.31 + 0.51) / 2)
        # the regret at the prior, in pooled SEs: best 0.8 (+0.005 seed mean), read at the prior by interpolation
        rr = R.response(0)
        sd = statistics.stdev([0.8, 0.81])            # the same seed spread at every point
        expect = (0.805 - rr.at(R.prior_rho("a"))) / (sd / math.sqrt(2))
        assert rr.regret(R.prior_rho("a")) == pytest.approx(expect)
    finally:
        R.response.cache_clear()


def _schedule(p: dict) -> dict:
    return {"rho_target": p["rho_target"], "prompts_per_step": 8, "n_gen": 8, "n_train": 8, "mu": 1, "steps": 10,
            "learning_rate": 1e-3, "lora_rank": 8,
            "flops_per_step": {"search": 1.0, "learning": 1.0, "reward": 0.0},
            "flops": {"search": 1.0, "learning": 1.0, "reward": 0.0}}


def test_a_truncated_pilot_stands_where_its_checkpoint_was():
    p = _run(0.5, 0, 0.5, 0.9, ckpts=((0.0, 0.1), (0.3, 0.4), (0.6, 0.7), (1.0, None)))
    p["schedule"] = _schedule(p)
    t = R.truncated(p, 0.3)
    assert t.evals["reward"] == (0.4,) * 4 and t.flops.total == pytest.approx(30.0)
    assert [c.fraction for c in t.checkpoints] == [0.0, 1.0]          # rescaled to the shorter budget
    # no checkpoint at 0.5: the pilot stood at its latest one before (0.3)
    assert R.truncated(p, 0.5).evals["reward"] == (0.4,) * 4
    # the log-FLOP interpolation the equal-compute read uses sits between the two checkpoints
    from race.core.records import PilotResult

    mid = R._interp_fraction(PilotResult.from_dict(p), 0.45)
    assert 0.4 < mid[0] < 0.7


def test_the_pass_rate_bar():
    """The replay uses race.stats.design's rule: half the groups of g carry a reward that varies."""
    assert R.p_star(8) == pytest.approx(0.083, abs=1e-3)
    assert R.p_star(4) > R.p_star(8) > R.p_star(16) > 0.04


def test_the_docs_replay_tables_are_recomputed_from_the_committed_data():
    out = subprocess.run([sys.executable, str(SCRIPT), "tables", "--check", str(ROOT / "docs" / "pilot.md")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr


def test_the_prior_starts_tau_is_the_committed_data():
    """race.stats.design.POPULATION_RHO_TAU (the prior's weight in a verdict's prior start) and its companions are
    the 21 grids' observed SD of the full-run best ρ, net of their mean sampling variance (replay.population_tau)."""
    from race.stats import design as D

    n, med, sd, tau = R.population_tau()
    assert n == D.POPULATION_GRIDS and round(med, 2) == D.POPULATION_RHO and round(sd, 3) == D.POPULATION_RHO_SD
    assert round(tau, 3) == D.POPULATION_RHO_TAU and tau < sd


def test_the_replays_prior_start_is_the_verdicts_rule():
    """The design "prior start + flat grid" scores race.stats.design.prior_start on the flat grid's pilots and range
    at F: by hand on `default` 10 × B, w = τ² / (τ² + σ²) with σ² = seed variance + the move's variance."""
    from race.stats.design import move_sd, seed_var_of_best

    i = next(k for k, g in enumerate(R.grids()) if g["setting"] == "default" and g["kind"] == "full10")
    at_f = R.design_at(i, R.FLAT)["at_f"]
    prior, _, tau = R.prior_model("default")
    sigma2 = seed_var_of_best(R.evidence("default", R.FLAT)["pilots"]) + move_sd(at_f) ** 2
    w = tau ** 2 / (tau ** 2 + sigma2)
    d = R.design_at(i, "prior start + flat grid")
    assert d["w"] == pytest.approx(w) and d["rho"] == pytest.approx(prior + w * (at_f["recommended_rho"] - prior))
    assert 0.6 < w < 0.9 and round(d["rho"], 2) == 0.45
