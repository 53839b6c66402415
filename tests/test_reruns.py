"""Reruns of a grid with other seeds (issue 54): ``first_seed`` (race.config.configfile) and the reruns study
(research/scripts/reruns.py: records, agreement, reliability table)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from race.config import presets
from race.run.api import build_config
from race.config.configfile import ConfigError, default_settings
from race.run.adaptive import adaptive_needed, informative_seeds, successive_halving# ---------------------------------------------------------------- first_seed

def test_first_seed_names_the_seeds_and_reads_as_before_at_zero():
    cfg = build_config(dict(presets.DEFAULT))
    assert cfg.first_seed == 0 and list(cfg.seed_ids) == [0, 1, 2]
    assert "first_seed" not in cfg.to_dict() and "first_seed" not in default_settings()   # stored studies unchanged
    other = build_config({**presets.DEFAULT, "first_seed": 6})
    assert list(other.seed_ids) == [6, 7, 8] and other.to_dict()["first_seed"] == 6
    assert build_config(other.to_dict()) == other


@pytest.mark.parametrize("value", [-1, True, 1.5, "two"])
def test_first_seed_must_be_a_whole_number_at_least_zero(value):
    with pytest.raises(ConfigError, match="first_seed"):
        build_config({**presets.DEFAULT, "first_seed": value})


def test_adaptive_designs_offset_their_seeds():
    """A rule numbers its rungs' seeds 0…; with first_seed f it runs f + k, fed the scores of f + k."""
    grid = [0.3, 0.5, 0.7, 0.9]
    for rule, policy in ((successive_halving, "halving"), (informative_seeds, "informative")):
        base = {(r, 0): v for r, v in zip(grid, (0.1, 0.4, 0.3, 0.2))}
        want, final = rule(grid, 3, base)
        got, final5 = adaptive_needed(policy, grid, 3, {(r, s + 5): v for (r, s), v in base.items()}, first_seed=5)
        assert got == [(r, s + 5) for r, s in want] and final5 == final
        assert adaptive_needed(policy, grid, 3, base) == (want, final)       # first_seed 0: as before


def test_study_keys_and_trials_use_the_offset_seeds(tmp_path):
    from race.run.store import Store
    from race.run.store.study import StudyInfo

    cfg = build_config({**presets.DEFAULT, "name": "fs", "first_seed": 3, "seeds": 2, "grid": [0.5, 0.62, 0.74]})
    info = StudyInfo(cfg.to_dict(), cfg.to_dict(), {}, {}, {}, None, 0.0)
    assert info.keys() == [(r, s) for r in (0.5, 0.62, 0.74) for s in (3, 4)]
    old = StudyInfo(presets.DEFAULT, presets.DEFAULT, {}, {}, {}, None, 0.0)     # stored before first_seed
    assert old.keys() == [(r, s) for r in presets.DEFAULT["grid"] for s in (0, 1, 2)]
    store = Store(f"sqlite:///{tmp_path / 'race.db'}", "fs", heartbeat=1)
    plan = {"schedules": [{"rho_target": r} for r in cfg.grid]}
    assert store.create(config=cfg.to_dict(), run_config=cfg.to_dict(), plan=plan,
                        classify={"primary_target": "reward", "n_boot": 10, "seed": 0}, meta={}, adaptive=None)
    store.enqueue((0.62, 4))
    claim = store.claim()
    assert claim.key == (0.62, 4) and claim.trial.params == {"rho": 0.62, "seed": 4}


TINY = {**presets.DEFAULT, "budget": 1.2e10, "grid": [0.5, 0.62, 0.74], "eval": {"prompts": 16, "samples": 1}}


def _pilot_cli(cfg: dict, out: Path) -> dict:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    r = subprocess.run([sys.executable, "-m", "race", "pilot", str(out / "config.yaml"), "--out", str(out / "run"),
                        "--quiet", "--format", "json", "--workers", "1"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / "run" / "results.json").read_text())


def test_a_rerun_seed_is_the_same_pilot_as_that_seed_of_a_grid_from_zero(tmp_path):
    """Seeds 0 and 1 in one grid (a lockstep group) and seed 1 alone (first_seed 1): seed 1's
    held-out scores are the same, bit for bit — a pilot is a function of its seed, not of where the
    grid's seeds start."""
    both = _pilot_cli({**TINY, "name": "from0", "seeds": 2}, tmp_path / "a")
    one = _pilot_cli({**TINY, "name": "from1", "seeds": 1, "first_seed": 1}, tmp_path / "b")
    assert sorted((p["rho_target"], p["seed"]) for p in one["pilots"]) == [(0.5, 1), (0.62, 1), (0.74, 1)]
    by_key = {(p["rho_target"], p["seed"]): p for p in both["pilots"]}
    for p in one["pilots"]:
        twin = by_key[(p["rho_target"], 1)]
        assert p["evals"] == twin["evals"] and p["flops"] == twin["flops"]
    assert one["config"]["first_seed"] == 1 and "first_seed" not in both["config"]


# ---------------------------------------------------------------- the reruns study (research/scripts/reruns.py)

def _reruns():
    sys.path.insert(0, str(Path(ROOT) / "research" / "scripts"))
    import reruns

    return reruns


def _fake_reruns(out: Path, n: int = 4):
    """n reruns of a falling synthetic grid, written as research/reruns records would be."""
    import gzip

    from test_regime import synthetic_results

    reruns = _reruns()
    for k in range(n):
        pilots = synthetic_results(response=lambda r: -0.3 * (r - 0.6), n_seeds=3, seed_sd=0.02, n_prompts=200,
                                   grid=(0.5, 0.62, 0.74, 0.85), seed=50 + k)
        pilots = [p.to_dict() | {"seed": 3 * (k + 1) + p.seed - 1000} for p in pilots]
        diag = reruns._classify_dict(pilots)
        name = f"default-s{3 * (k + 1)}"
        (out / f"{name}.json").write_text(json.dumps({"name": name, "setting": "default", "first_seed": 3 * (k + 1),
                                                      "seeds": 3, **reruns.verdict_fields(diag),
                                                      "points": reruns.point_means(pilots)}))
        with gzip.open(out / f"{name}.pilots.json.gz", "wt") as fh:
            json.dump(pilots, fh)


def test_reruns_table_reliability_and_pairing_read_committed_records(tmp_path, monkeypatch):
    reruns = _reruns()
    monkeypatch.setattr(reruns, "OUT", tmp_path)
    _fake_reruns(tmp_path)
    recs = reruns.committed_records()
    assert len(recs) == 6 and sum(bool(r.get("committed_run")) for r in recs) == 2     # + the two committed runs
    text = reruns.table(recs)
    assert "## default: 6 runs (4 reruns + 2 committed)" in text and "search-heavy" in text
    rows, bins = reruns.reliability(recs)
    assert len(rows) == 6 and sum(b["n"] for b in bins) == 6 and all(0 <= r["agreement"] <= 1 for r in rows)
    lines = "\n".join(reruns.pairing("default"))
    assert "paired (as run)" in lines and "unpaired" in lines and "all pairs | 72 |" in lines


def test_reliability_bins_hold_at_least_five_verdicts():
    reruns = _reruns()
    rows = [{"confidence": c / 23, "agreement": 1.0} for c in range(23)]
    bins = reruns.bins_of(rows, "confidence")
    assert [b["n"] for b in bins] == [5, 5, 5, 8] and bins[0]["stated"] == pytest.approx(2 / 23)
