"""Held-out checkpoints during a pilot: fractions, config, storage, the instability rule, reports,
and a real pilot that is bit-identical with and without them."""
import json
import math
import random

import pytest

from race.config.checkpoints import CHECKPOINT_FIRST, checkpoint_fractions, checkpoint_seed
from race.stats.instability import DROP_SE, MIN_DROP, find_instability, stability
from race.config.configfile import ConfigError, config_from_dict
from race.core.records import Checkpoint, Diagnosis, FlopBreakdown, PilotResult


def test_fractions_are_log_spaced_from_a_64th_to_the_end():
    f = checkpoint_fractions(8)
    assert len(f) == 7 and f[0] == pytest.approx(CHECKPOINT_FIRST)      # + the end (1) = 8 fractions
    ratios = [b / a for a, b in zip(f, f[1:])]
    assert ratios == pytest.approx([64 ** (1 / 7)] * 6)                    # 1.81× apart
    assert f[-1] == pytest.approx(64 ** (-1 / 7)) and f[-1] < 1
    assert checkpoint_fractions(2) == pytest.approx((1 / 64,))
    assert checkpoint_fractions(1) == () and checkpoint_fractions(0) == ()
    assert checkpoint_fractions((0.5, 0.1, 1.0)) == (0.1, 0.5)             # the end is implied
    assert checkpoint_seed(0, 1) != checkpoint_seed(0, 2) != checkpoint_seed(1, 1)
    assert checkpoint_seed(3, 4) == checkpoint_seed(3, 4) < 2 ** 63


def _cfg(**ev):
    return config_from_dict({"model": "m", "budget": 1e12, "eval": {"prompts": 200, **ev}})


def test_checkpoint_settings_and_their_errors():
    import yaml

    assert _cfg().eval.checkpoints == 8 and _cfg().eval.checkpoint_prompts is None
    raw = yaml.safe_load("model: m\nbudget: 1e12\neval: {checkpoints: [1e-2, 0.1, 0.5, 1]}\n")
    assert config_from_dict(raw).eval.checkpoints == (0.01, 0.1, 0.5, 1.0)   # YAML's "1e-2" string read as a number
    assert _cfg(checkpoints=0).eval.checkpoints == 0
    for ev, msg in [({"checkpoints": True}, "eval.checkpoints True must be a count"),
                    ({"checkpoints": -1}, "eval.checkpoints -1 must be a count from 0"),
                    ({"checkpoints": 65}, "eval.checkpoints 65"),
                    ({"checkpoints": 2.5}, "eval.checkpoints 2.5"),
                    ({"checkpoints": []}, r"eval.checkpoints \[\] must list 1 to 64"),
                    ({"checkpoints": [0.0, 0.5]}, "eval.checkpoints value 0.0 is not a budget fraction"),
                    ({"checkpoints": [0.5, 1.5]}, "value 1.5"),
                    ({"checkpoints": [0.5, "x"]}, "eval.checkpoints value 'x' is not a number"),
                    ({"checkpoints": [0.5, 0.5]}, "repeats a fraction"),
                    ({"checkpoint_prompts": 0}, "eval.checkpoint_prompts 0 must be a positive integer"),
                    ({"checkpoint_prompts": 300}, r"eval.checkpoint_prompts \(300\) must be ≤ eval.prompts \(200\)")]:
        with pytest.raises(ConfigError, match=msg) as e:
            _cfg(**ev)
        assert "\n" not in str(e.value)


def _cp(fraction, step, scores, target="reward"):
    return Checkpoint(fraction, step, FlopBreakdown(1e9 * fraction, 1e9 * fraction), {target: tuple(scores)},
                      FlopBreakdown(1e7), 0.5)


def _curve(means, k=100, noise=None, seed=0):
    """Checkpoints with ``means`` (9: base, 7 fractions, end): prompt i scores mean ± 0.25 alternately."""
    fr = (0.0,) + checkpoint_fractions(8) + (1.0,)
    return [_cp(f, i * 10, [m + (0.25 if j % 2 else -0.25) for j in range(k)]) for i, (f, m) in enumerate(zip(fr, means))]


def test_a_fall_back_to_the_base_is_flagged_with_its_numbers():
    # the 10× grid's collapsed run: base 0.33, best 0.75, then 0.5 (keeps 40 % of the gain), 0.365 at the end
    cps = _curve([0.33, 0.4, 0.5, 0.6, 0.7, 0.75, 0.72, 0.5, 0.365])
    hit = find_instability(cps, "reward")
    assert hit is not None
    assert hit["fraction"] == pytest.approx(checkpoint_fractions(8)[6]) and hit["step"] == 70
    assert (hit["value"], hit["best"], hit["base"], hit["final"]) == pytest.approx((0.5, 0.75, 0.33, 0.365))
    assert hit["best_fraction"] == pytest.approx(checkpoint_fractions(8)[4])
    # paired differences are all 0.25 (same prompt offsets): SE 0, the drop is resolved
    assert hit["drop_se"] == pytest.approx(0.0, abs=1e-12)


def test_what_is_not_a_fall():
    rising = [0.33, 0.4, 0.5, 0.6, 0.7, 0.75, 0.72, 0.7, 0.73]
    assert find_instability(_curve(rising), "reward") is None               # a dip that keeps most of the gain
    kept = [0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.7, 0.55, 0.6]                 # 0.55 keeps 56 % of the gain
    assert find_instability(_curve(kept), "reward") is None
    tiny = [0.30, 0.33, 0.33, 0.33, 0.33, 0.33, 0.33, 0.33, 0.33 - MIN_DROP / 2]   # lost the gain, small drop
    assert find_instability(_curve(tiny), "reward") is None                # below the absolute drop
    assert find_instability(_curve(rising)[:1], "reward") is None          # one checkpoint: nothing to compare
    # a large drop that the prompts do not resolve: half the prompts fall by 0.8, half rise by 0.1
    base = _cp(0.0, 0, [0.3] * 10)
    best = _cp(0.5, 5, [0.9] * 10)
    noisy = _cp(1.0, 9, [0.1 if i % 2 else 1.0 for i in range(10)])   # drop 0.35, SE 0.45 / √10 = 0.15
    assert find_instability([base, best, noisy], "reward") is None
    resolved = _cp(1.0, 9, [0.2 if i % 2 else 0.4 for i in range(10)])
    assert find_instability([base, best, resolved], "reward")["value"] == pytest.approx(0.3)


def _simulated(rng, means, k, samples=4):
    """Checkpoints of one pilot: fixed prompt difficulties, each score the mean of ``samples`` draws."""
    offsets = [rng.gauss(0, 0.25) for _ in range(k)]
    fr = (0.0,) + checkpoint_fractions(8) + (1.0,)
    return [_cp(f, i, [sum(rng.random() < min(1.0, max(0.0, m + o)) for _ in range(samples)) / samples
                       for o in offsets]) for i, (f, m) in enumerate(zip(fr, means))]


def test_noise_rarely_flags_and_a_collapse_always_does():
    """The constants' measurement (module docstring): flat curves on 100 prompts × 4 samples are
    flagged in ≤ 3 % of 200 simulated pilots, rising-then-flat ones never, the collapse always."""
    rng = random.Random(0)
    flat = [sum(find_instability(_simulated(rng, [m] * 9, 100), "reward") is not None for _ in range(100))
            for m in (0.3, 0.5)]
    assert sum(flat) <= 6, flat
    saturating = [0.3, 0.45, 0.55, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
    assert not any(find_instability(_simulated(rng, saturating, 100), "reward") for _ in range(50))
    collapse = [0.33, 0.4, 0.5, 0.6, 0.7, 0.75, 0.72, 0.5, 0.365]
    assert all(find_instability(_simulated(rng, collapse, 100), "reward") for _ in range(50))
    assert DROP_SE > 2


def _pilot(rho, seed, means, evals_mean=0.5):
    cps = tuple(_curve(means)) if means else ()
    return PilotResult(rho, seed, FlopBreakdown(1e9 * (1 - rho), 1e9 * rho), {"reward": (evals_mean,) * 100},
                       checkpoints=cps, extra={"eval_flops": {"final": 2e7, "checkpoints": 8e7}} if means else {})


STABLE = [0.33, 0.4, 0.5, 0.6, 0.7, 0.75, 0.72, 0.7, 0.73]
COLLAPSE = [0.33, 0.4, 0.5, 0.6, 0.7, 0.75, 0.72, 0.5, 0.365]


def test_stability_counts_unstable_pilots_per_point_and_old_pilots_have_none():
    pilots = [_pilot(r, s, COLLAPSE if (r, s) == (0.74, 1) else STABLE) for r in (0.5, 0.74) for s in range(3)]
    st = stability(pilots, "reward")
    assert [(p.rho_target, p.pilots, p.unstable) for p in st.points] == [(0.5, 3, 0), (0.74, 3, 1)]
    assert st.points[1].share == pytest.approx(1 / 3) and st.points[0].checkpoints == 9 and st.points[0].prompts == 100
    assert st.points[0].eval_flops == pytest.approx(1e8)
    (u,) = st.unstable
    assert (u.rho_target, u.seed, u.target) == (0.74, 1, "reward") and u.final == pytest.approx(0.365)
    assert stability([_pilot(0.5, 0, None)], "reward") is None          # results from before checkpoints


def test_pilot_results_with_checkpoints_round_trip_and_old_ones_still_load():
    p = _pilot(0.74, 1, COLLAPSE)
    d = json.loads(json.dumps(p.to_dict()))
    assert PilotResult.from_dict(d) == p
    del d["checkpoints"]                                                   # a results.json of an older RACE
    assert PilotResult.from_dict(d).checkpoints == ()
    from race.run.store import pilot_attrs, pilot_from_attrs

    attrs = json.loads(json.dumps(pilot_attrs(p)))
    assert pilot_from_attrs(attrs) == p and len(attrs["checkpoints"]) < 30_000
    del attrs["checkpoints"]                                               # a trial of an older RACE
    assert pilot_from_attrs(attrs).checkpoints == ()


def _grid():
    return [_pilot(r, s, COLLAPSE if (r, s) == (0.74, 1) else STABLE, evals_mean=0.6 - 0.1 * r + 0.01 * s)
            for r in (0.5, 0.62, 0.74) for s in range(2)]


def test_a_grid_where_half_the_pilots_fell_back_is_named_unstable():
    """UNSTABLE_GRID_SHARE: 3 of 6 pilots fallen → an "unstable grid" warning with the count and the
    fix; 2 of 6 (or one, as in _grid) → no such warning but the softer "pilots fell back" one (the
    validation study: 2 of 12 fallen pilots came before 15 of 15 collapsed full runs); none → neither."""
    from race.stats.instability import UNSTABLE_GRID_SHARE, unstable_grid
    from race.stats.regime import classify

    assert UNSTABLE_GRID_SHARE == 0.5

    def grid(fallen):
        return [_pilot(r, s, COLLAPSE if (r, s) in fallen else STABLE, evals_mean=0.6 - 0.1 * r + 0.01 * s)
                for r in (0.5, 0.62, 0.74) for s in range(2)]

    half = classify(grid({(0.5, 0), (0.62, 1), (0.74, 1)}), n_boot=50)
    (w,) = [w for w in half.warnings if w.startswith("unstable grid")]
    assert "3 of 6 pilots fell back" in w and "lower the learning rate" in w and unstable_grid(half.stability)
    assert not any(w.startswith("pilots fell back") for w in half.warnings)     # one warning, the stronger
    third = classify(grid({(0.5, 0), (0.74, 1)}), n_boot=50)
    assert not any(w.startswith("unstable grid") for w in third.warnings) and not unstable_grid(third.stability)
    (w,) = [w for w in third.warnings if w.startswith("pilots fell back")]     # fewer than half, but some
    assert w.startswith("pilots fell back: 2 of 6 ") and "can collapse" in w
    none = classify(grid(set()), n_boot=50)
    assert not any(w.startswith(("pilots fell back", "unstable grid")) for w in none.warnings)
    assert not unstable_grid(None)                                        # no checkpoints, no verdict on it


@pytest.mark.parametrize("fmt", ["text", "md", "latex", "json"])
def test_every_report_format_flags_the_unstable_pilot(fmt):
    from race.stats.regime import classify
    from race.stats.report import render_diagnosis

    diag = classify(_grid(), n_boot=50)
    assert diag.stability is not None and [(u.rho_target, u.seed) for u in diag.stability.unstable] == [(0.74, 1)]
    out = render_diagnosis(diag, fmt)
    if fmt == "json":
        st = json.loads(out)["stability"]
        assert st["unstable"][0]["rho_target"] == 0.74 and st["unstable"][0]["seed"] == 1
        assert [p["share"] for p in st["points"]] == [0.0, 0.0, 0.5]
        assert Diagnosis.from_dict(json.loads(out)) == diag
        return
    out = out.replace(r"$\rho$", "ρ").replace(r"\%", "%")
    assert "ρ=0.74 seed 1: reward fell to 0.500 at 55.2% of the budget" in out
    assert "0.365 at the end" in out and "1 (50.0%)" in out and "0 (0.0%)" in out
    assert "not in C_total" in out.replace(r"C\_total", "C_total")


def test_stored_results_without_checkpoints_report_as_before(tmp_path):
    """An older results file (no checkpoints, no stability) renders without the section, refit too."""
    from race.stats.regime import classify
    from race.stats.report import render_diagnosis
    from race.stats.results import Results, diagnose_results, load_results, save_results

    old = [PilotResult(p.rho_target, p.seed, p.flops, p.evals) for p in _grid()]
    save_results(str(tmp_path), Results(pilots=tuple(old), diagnosis=classify(old, n_boot=50)))
    raw = json.loads((tmp_path / "results.json").read_text())
    for p in raw["pilots"]:
        del p["checkpoints"]
    del raw["diagnosis"]["stability"]
    (tmp_path / "results.json").write_text(json.dumps(raw))
    res = load_results(str(tmp_path))
    for diag in (diagnose_results(res), diagnose_results(res, refit=True)):
        assert diag.stability is None and "held-out checkpoints" not in render_diagnosis(diag)


def test_a_study_from_before_a_setting_existed_resumes_at_its_default(tmp_path):
    """A study config without eval.checkpoints (older RACE) is the default; another value is refused."""
    from race.config import presets
    from race.run.api import build_config
    from race.run.store import Store, StoreError

    cfg = build_config({**presets.DEFAULT, "name": "old", "grid": [0.5, 0.6, 0.7], "seeds": 1})
    old = cfg.to_dict()
    for k in ("checkpoints", "checkpoint_prompts"):
        del old["eval"][k]
    store = Store(f"sqlite:///{tmp_path / 'race.db'}", "old")
    assert store.create(config=old, run_config=old, plan={}, classify={}, meta={}, adaptive=None)
    store.check_compatible(cfg.to_dict())
    other = build_config({**presets.DEFAULT, "name": "old", "grid": [0.5, 0.6, 0.7], "seeds": 1,
                          "eval": {**presets.DEFAULT["eval"], "checkpoints": 4}})
    with pytest.raises(StoreError, match="eval.checkpoints is 8 there, 4 here"):
        store.check_compatible(other.to_dict())


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean", "hf-peft"])
def test_a_pilot_is_bit_identical_with_and_without_checkpoints(fast_path, torch_one_thread):
    """Same pilot, checkpoints off and on (8, on 40 prompts): the same FLOPs, curve, final
    evaluations and steps, bit for bit; the checkpoints fire when the FLOPs first reach their
    fraction, start with the base policy, end with the final evaluation, and cost apart."""
    from race.config import presets
    from race.run.api import build_config
    from race.flops.grid import plan_grid
    from race.engine.pilot import run_pilot

    raw = {**presets.DEFAULT, "budget": 1.2e10, "seeds": 1, "grpo": {**presets.DEFAULT["grpo"], "fast_path": fast_path}}
    off = build_config({**raw, "eval": {"prompts": 60, "samples": 2, "checkpoints": 0}})
    on = build_config({**raw, "eval": {"prompts": 60, "samples": 2, "checkpoints": 8, "checkpoint_prompts": 40}})
    schedule = plan_grid(off, prompt_len=5.9, completion_len=3.5).schedules[2]      # on-policy, ~8 steps
    a, b = run_pilot(off, schedule, seed=1), run_pilot(on, schedule, seed=1)
    assert (a.flops, a.curve, a.evals, a.extra["steps"]) == (b.flops, b.curve, b.evals, b.extra["steps"])
    assert a.checkpoints == () and "checkpoints" not in a.wall_seconds and a.extra["steps"] >= 6
    cps = b.checkpoints
    assert cps[0].fraction == 0.0 and cps[0].step == 0 and cps[0].flops.total == 0.0
    assert cps[-1].fraction == 1.0 and cps[-1].flops == b.flops and cps[-1].step == b.extra["steps"]
    assert cps[-1].evals == {t: v[:40] for t, v in b.evals.items()} and cps[-1].eval_flops.total == 0.0
    spent = [0.0] + [f for f, _ in b.curve]
    for c in cps[1:-1]:
        assert spent[c.step] >= c.fraction * on.budget > spent[c.step - 1]     # fired when first reached
        assert set(c.evals) == set(b.evals) and all(len(v) == 40 for v in c.evals.values())
        assert c.eval_flops.search > 0 and c.eval_flops.learning == 0 and c.seconds > 0
    assert [c.step for c in cps] == sorted({c.step for c in cps})                 # one evaluation per step at most
    assert b.extra["eval_flops"]["checkpoints"] == pytest.approx(sum(c.eval_flops.total for c in cps))
    assert b.extra["eval_flops"]["final"] == pytest.approx(a.extra["eval_flops"]["final"])
    assert b.extra["eval_flops"]["final"] > cps[0].eval_flops.total            # 60 prompts against 40
    assert b.wall_seconds["checkpoints"] == pytest.approx(sum(c.seconds for c in cps))
    assert not math.isnan(cps[0].score("reward"))


def test_the_stability_line_at_f_by_status():
    from race.stats.instability import LONG_RUN, stability_at
    from race.core.records import Stability, StabilityPoint

    pts = tuple(StabilityPoint(rho_target=r, pilots=3, unstable=0, checkpoints=9, prompts=100, eval_flops=1.0)
                for r in (0.5, 0.7))
    held = Stability(target="reward", rule={}, points=pts, unstable=())
    short = stability_at(held, full_run_budget=5e12, pilot_budget=1e12)
    assert short == {"status": "stable", "line": "stability at F (5 × B): stable: none of 6 pilots fell back, and "
                                                 f"the full run is under {LONG_RUN:g} × a pilot's length"}
    long = stability_at(held, full_run_budget=3e13, pilot_budget=1e12)
    assert long["status"] == "not tested" and "the full run is 30 × a pilot's length" in long["line"]
    assert stability_at(None, full_run_budget=1e12, pilot_budget=1e12)["status"] == "not tested"
    assert "no pilot has run yet" in stability_at(None, full_run_budget=1e13, pilot_budget=1e12, ran=False)["line"]
