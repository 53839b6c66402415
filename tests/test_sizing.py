"""Pilots sized from the full run (race.run.sizing, issue 49 item 1): what race plan states is what race
pilot runs, within the share, held-out evaluation counted; a design with no pilots is refused before
calibration; the design's pilots are the ones that run."""
import json

import pytest
import yaml
from click.testing import CliRunner

from race.config.rules import AS_WRITTEN, PILOT_DESIGNS
from race.core.errors import RaceError
from race.flops.grid import eval_flops, plan_grid, policy_arch
from race.run.api import build_config
from race.run.cli import main
from race.run.sizing import SizingError, size_pilots
from race.stats import pilotdesign as PD
from race.stats.pilotdesign import DESIGNS


def test_the_config_names_the_designs_of_race_stats():
    assert PILOT_DESIGNS == (AS_WRITTEN, *DESIGNS)


def test_grid_runs_the_config_as_written_and_fit_sizes_it_within_the_share():
    cfg = build_config(None)                                  # the embedded grid: 4 ρ × 3 seeds
    same, none = size_pilots(cfg, full_run=6e12)              # the config's own design: grid
    assert same is cfg and none is None
    sized, d = size_pilots(cfg, full_run=6e12, design="fit", share=0.1)
    # 12 pilots with the config's evaluation (500 final prompts, 8 checkpoints of 100: 1300 prompts, 3.36e10 FLOPs)
    # get 5e10 − 3.36e10, under 10 steps; with 4 checkpoint evaluations (900 prompts) the whole grid fits, before any
    # pilot is dropped
    E = d["eval"]["as_configured"]
    assert E == pytest.approx(3.355e10, rel=1e-3)
    assert d["pilots"] == [[r, k] for r in (0.5, 0.62, 0.74, 0.85) for k in range(3)]
    assert d["eval"]["checkpoints"] == [0.0929, 0.1682, 0.552] and d["eval"]["checkpoint_prompts"] == 100
    assert d["eval_flops"] == pytest.approx(E * 900 / 1300)
    assert sized.grid == (0.5, 0.62, 0.74, 0.85) and sized.seeds == 3 and sized.budget == pytest.approx(d["budget"])
    assert d["budget"] == pytest.approx(0.1 * 6e12 / 12 - d["eval_flops"])          # evaluation comes off each slice
    assert d["spent"] == pytest.approx(0.1 * 6e12)
    # the sized config runs the thinned evaluation: what race.flops.grid counts for it is what the design counted
    assert (sized.eval.checkpoints, sized.eval.checkpoint_prompts, sized.eval.prompts) == ((0.0929, 0.1682, 0.552),
                                                                                          100, 500)
    planned = plan_grid(sized)
    assert eval_flops(sized, policy_arch(sized), planned.prompt_len, planned.completion_len) == pytest.approx(
        d["eval_flops"])
    # the sized grid reads as written: sizing it again changes nothing, and its stored config is a plain one
    assert (sized.pilot_design, sized.full_run_budget) == (AS_WRITTEN, 6e12) and "pilot_design" not in sized.to_dict()
    assert size_pilots(sized, full_run=6e12) == (sized, None)
    from_config, d3 = size_pilots(build_config(None).with_overrides(pilot_design="fit", pilot_share=0.1), full_run=6e12)
    assert d3 == d and from_config == sized                  # a config's own pilot_design sizes the same way
    # 20 %: the grid fits with the config's evaluation, which stays as it is
    sized, d = size_pilots(cfg, full_run=6e12, design="fit", share=0.2)
    assert d["eval"] is None and sized.eval == cfg.eval and d["eval_flops"] == pytest.approx(E)
    assert d["budget"] == pytest.approx(0.2 * 6e12 / 12 - E)


def _sparse_eval():
    """tiny-steps-sparse's evaluation a pilot as configured: 500 final prompts and 8 checkpoints of 100."""
    cfg = build_config("pilots/tiny-steps-sparse.yaml")
    planned = plan_grid(cfg)
    return cfg, eval_flops(cfg, policy_arch(cfg), planned.prompt_len, planned.completion_len)


@pytest.mark.parametrize("F, share, pilots, cuts, ev_prompts", [
    # 20 %: 4 pilots (3 points, one twice) with 3 checkpoint evaluations (800 prompts): 3e11 − 1.128e11 ≥ 1.87e11
    (6e12, 0.2, [[0.4, 0], [0.55, 0], [0.7, 0], [0.4, 1]], [0.1682, 0.552], 800),
    # 30 %: 5 pilots (one seed per point, a second at 0.4) with 4 (900 prompts): 3.6e11 − 1.269e11 = 2.33e11; with the
    # config's 1300 prompts they got 1.77e11 and 0.25 was dropped
    (6e12, 0.3, [[0.25, 0], [0.4, 0], [0.55, 0], [0.7, 0], [0.4, 1]], [0.0929, 0.1682, 0.552], 900),
    (6e13, 0.1, [[r, k] for r in (0.25, 0.4, 0.55, 0.7) for k in range(3)], None, 1300),     # fits as configured
])
def test_fit_thins_the_checkpoints_before_it_drops_pilots(F, share, pilots, cuts, ev_prompts):
    cfg, E = _sparse_eval()
    assert E == pytest.approx(1.833e11, rel=1e-3)
    sized, d = size_pilots(cfg, full_run=F, design="fit", share=share)
    assert d["pilots"] == pilots
    assert d["eval_flops"] == pytest.approx(E * ev_prompts / 1300)
    assert d["budget"] == pytest.approx(share * F / len(pilots) - E * ev_prompts / 1300) and d["budget"] >= 1.87e11
    if cuts is None:
        assert d["eval"] is None and sized.eval == cfg.eval
    else:
        assert d["eval"]["checkpoints"] == cuts and sized.eval.checkpoints == tuple(cuts)
        assert sized.eval.prompts == 500 and sized.eval.checkpoint_prompts == 100   # the final pass kept whole
        assert f"thinned to {len(cuts) + 1} checkpoint evaluations" in PD.DesignPlan.from_dict(d).line()


@pytest.mark.parametrize("config, F, share, thin, configured", [
    ("pilots/tiny-steps-sparse.yaml", 6e12, 0.1, "1.13e+11", "1.83e+11"),    # 1.5e11 a pilot, less 1.13e11: < 1.87e11
    ("pilots/tiny-reasoner.yaml", 1e13, 0.1, "2.62e+11", "5.24e+11"),
    ("pilots/tiny-reasoner.yaml", 1e13, 0.3, "2.62e+11", "5.24e+11"),        # 7.5e11 − 2.62e11 < 5.74e11
])
def test_fit_refuses_when_even_thinned_evaluation_does_not_fit(config, F, share, thin, configured):
    with pytest.raises(SizingError, match="no pilots") as e:
        size_pilots(build_config(config), full_run=F, design="fit", share=share)
    assert (f"plus {thin} of held-out evaluation each (thinned to 3 checkpoint evaluations; {configured} as "
            "configured)") in str(e.value) and "\n" not in str(e.value)


def test_race_plan_states_what_race_pilot_runs(tmp_path):
    out = CliRunner().invoke(main, ["plan", "--help"])
    assert out.exit_code == 0
    cfg_path = tmp_path / "c.yaml"
    raw = build_config(None).to_dict()
    raw["lengths"] = {"prompt": raw.pop("prompt_len"), "completion": raw.pop("completion_len")}
    cfg_path.write_text(yaml.safe_dump(json.loads(json.dumps(raw))))
    planned = json.loads(CliRunner().invoke(main, ["plan", str(cfg_path), "--full-run", "6e12", "--json"]).output)
    _, d = size_pilots(build_config(str(cfg_path)), full_run=6e12, design="fit", share=0.1)
    assert planned["full_run"]["design"]["pilots"] == d["pilots"]
    assert planned["full_run"]["design"]["budget"] == pytest.approx(d["budget"])
    # --design grid, which race pilot takes: the config as written against F, no share sizing
    grid = CliRunner().invoke(main, ["plan", str(cfg_path), "--full-run", "6e12", "--design", "grid"])
    assert grid.exit_code == 0, grid.output
    assert "design grid: the config as written, whatever the share" in grid.output
    assert "this grid: 12 pilots × 6e+11" in grid.output
    as_json = json.loads(CliRunner().invoke(main, ["plan", str(cfg_path), "--full-run", "6e12", "--design", "grid",
                                                   "--json"]).output)
    assert as_json["full_run"]["design"] == {"name": "grid"} and as_json["full_run"]["within_share"] is None


@pytest.mark.parametrize("kw, match", [
    (dict(full_run=6e11, design="fit", share=0.1), "no pilots"),                 # nothing fits: the prior
    (dict(full_run=None, design="fit"), "give --full-run F"),
    (dict(full_run=6e12, design="halvin"), "pilot design .halvin. is unknown"),
    (dict(full_run=6e12, share=0.2), "give a design too"),
    (dict(full_run=6e12, design="fit", share=1.5), "share"),
])
def test_a_design_that_cannot_run_is_one_line(kw, match):
    with pytest.raises(RaceError, match=match) as e:
        size_pilots(build_config(None), **kw)
    assert "\n" not in str(e.value)


def test_the_prior_design_names_what_to_run_instead():
    with pytest.raises(SizingError, match="run at the prior ρ 0.46"):
        size_pilots(build_config(None), full_run=6e12, design="prior")


def test_race_pilot_refuses_before_any_compute(tmp_path):
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["pilot", "--full-run", "6e11", "--design", "fit", "--out", str(out), "--quiet"])
    assert r.exit_code == 2 and "no pilots" in r.output and "Traceback" not in r.output
    assert not out.exists()                                   # refused before a folder or storage is made
    r = CliRunner().invoke(main, ["pilot", "--full-run", "6e12", "--design", "fit", "--adaptive", "--out",
                                  str(out), "--quiet"])
    assert r.exit_code == 2 and "does not combine" in r.output and not out.exists()


def test_race_pilot_runs_the_designs_pilots_and_records_it(tmp_path):
    """A real grid: 12 pilots of the fit design within 10 % of F = 6e12, with its held-out evaluation thinned to 4
    checkpoint evaluations (about 30 s on 2 quiet cores), with --profile."""
    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["pilot", "--full-run", "6e12", "--design", "fit", "--out", str(out), "--quiet",
                                  "--format", "json", "--profile"])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    # --profile: where the wall time went, kept in results.json (issue 53 item 3); the parts are the pool's
    prof = res["profile"]
    assert prof["slots"] >= 1 and prof["total_seconds"] > 0 and prof["counted_flops"] == pytest.approx(
        sum(p["flops"]["total"] for p in res["pilots"]), rel=1e-9)
    assert sum(prof["slot_seconds"].values()) == pytest.approx(prof["slots"] * prof["pool_seconds"], rel=0.02)
    _, d = size_pilots(build_config(None), full_run=6e12, design="fit", share=0.1)
    ran = sorted((p["rho_target"], p["seed"]) for p in res["pilots"])
    assert ran == sorted((r, k) for r, k in d["pilots"])
    assert res["design"]["design"] == "fit" and res["design"]["budget"] == pytest.approx(d["budget"])
    assert res["config"]["budget"] == pytest.approx(d["budget"]) and res["config"]["full_run_budget"] == 6e12
    # what it thinned: in the design's record and in the config the pilots ran, whose checkpoints are those
    assert res["design"]["eval"] == d["eval"] and d["eval"]["checkpoints"] == [0.0929, 0.1682, 0.552]
    assert res["config"]["eval"]["checkpoints"] == d["eval"]["checkpoints"]
    # (a step that crosses two fractions evaluates once, race.config.checkpoints)
    fired = [{round(c["fraction"], 4) for c in p["checkpoints"]} for p in res["pilots"]]
    assert all({0.0, 1.0} <= f <= {0.0, 0.0929, 0.1682, 0.552, 1.0} for f in fired), fired
    # each pilot spends the design's budget, to one of its steps (race.flops.grid: whole steps; 11 at ρ 0.85)
    off = [(abs(p["flops"]["total"] - d["budget"]), p["schedule"]["flops_per_step"]["total"]) for p in res["pilots"]]
    assert all(o <= step for o, step in off), off


def test_race_plan_reads_the_configs_own_design_and_share(tmp_path):
    """A config that sizes its own pilots (race init's pilot_design / pilot_share): race plan --full-run F
    states what race pilot will run, at the config's share, not the default's."""
    raw = build_config(None).to_dict()
    raw["lengths"] = {"prompt": raw.pop("prompt_len"), "completion": raw.pop("completion_len")}
    raw.update(pilot_design="fit", pilot_share=0.3)
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text(yaml.safe_dump(json.loads(json.dumps(raw))))
    planned = json.loads(CliRunner().invoke(main, ["plan", str(cfg_path), "--full-run", "3e12", "--json"]).output)
    _, d = size_pilots(build_config(str(cfg_path)), full_run=3e12)
    assert planned["full_run"]["design"]["share"] == 0.3 == d["share"]
    assert planned["full_run"]["design"]["pilots"] == d["pilots"]


def test_a_sized_grid_whose_evaluation_runs_longer_than_expected_warns_after_calibration():
    """race.run.sizing.overrun_line, the coordinator's share_warning: the design counted held-out evaluation at
    the config's expected lengths (5.9 and 3.5 tokens); at round 1's `hard` calibrated lengths (8.0 and 4.59)
    the evaluation costs more and the pilots spend over their share. Training stays at B: only the evaluation
    is rescaled, by the ratio race.flops.grid.eval_flops gives."""
    from race.run.sizing import overrun_line
    from race.run.study import study_meta

    cfg = build_config(None)
    for design in ("fit", "halving"):
        sized, d = size_pilots(cfg, full_run=6e12, design=design, share=0.1)
        planned, arch = plan_grid(sized), policy_arch(sized)
        assert overrun_line(d, sized, planned.prompt_len, planned.completion_len) is None     # as planned: the share
        assert overrun_line(d, sized, 4.0, 2.0) is None                                       # shorter: under it
        ratio = eval_flops(sized, arch, 8.0, 4.59375) / eval_flops(sized, arch, planned.prompt_len, planned.completion_len)
        training = d["halving"]["training"] if design == "halving" else 12 * d["budget"]
        spend = training + (d["spent"] - training) * ratio
        assert ratio > 1.3 and spend > 0.1 * 6e12 * 1.01
        line = overrun_line(d, sized, 8.0, 4.59375)
        assert f"{ratio:.2f} × its estimate" in line and f"about {spend / 6e12:.1%} of F, over the 10% share" in line
    assert overrun_line(None, sized, 8.0, 4.59375) is None and overrun_line({}, sized, 8.0, 4.59375) is None

    class Cal:                                   # what study_meta reads of a calibration
        prompt_len, completion_len, pass_rate, healthy = 8.0, 4.59375, 0.2, None

        def data_warning(self):
            return None

        def reward_warning(self):
            return None

    meta = study_meta(cfg, sized, plan_grid(sized), Cal(), backend="hf", design=d)
    assert meta["share_warning"] == overrun_line(d, sized, 8.0, 4.59375)
    assert "share_warning" not in study_meta(cfg, sized, plan_grid(sized), Cal(), backend="hf", design=None)
