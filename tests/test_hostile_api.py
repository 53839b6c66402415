"""The Python API under hostile arguments and edited results files (a review of session 36): each is a
one-line ``race.RaceError`` before any compute, never a KeyError / TypeError / AttributeError from inside."""
import copy
import gzip
import json
import os
import re

import pytest

import race
from conftest import ROOT

RUN = os.path.join(ROOT, "docs", "runs", "default.results.json.gz")


@pytest.fixture(scope="module")
def stored():
    return json.load(gzip.open(RUN))


@pytest.fixture(scope="module")
def pilots():
    return list(race.load_results(RUN).pilots)


def test_every_error_class_a_user_meets_is_a_race_error():
    from race.core.records import RecordError
    from race.run.plot import PlotError
    from race.stats.classify_input import ClassifyError
    from race.tasks.datasets import TaskError
    from race.tasks.rewards.base import RewardError
    from race.tasks.rewards.prm import PRMError

    for cls in (RecordError, PlotError, ClassifyError, TaskError, RewardError, PRMError, race.ConfigError):
        assert issubclass(cls, race.RaceError), cls
    with pytest.raises(race.RaceError, match=r"^Diagnosis\.primary_target: Field required"):
        race.Diagnosis.from_dict({})
    assert "RaceError" in race.__all__ and "ConfigError" in race.__all__


def _edited(stored, tmp_path, edit):
    d = copy.deepcopy(stored)
    edit(d)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    return str(path)


@pytest.mark.parametrize("name, edit, message", [
    ("no verdict for the primary target", lambda d: d["diagnosis"].__setitem__("primary_target", "nope"),
     "primary_target 'nope' has no verdict: expected one of ['best@4', 'pass@1', 'reward', 'worst@4']"),
    ("failed is a number", lambda d: d.__setitem__("failed", 5), "failed: Input should be a valid list, got 5"),
    ("an unknown classify setting", lambda d: d.__setitem__("classify", {"bogus": 1}),
     "classify has the unknown setting 'bogus'"),
])
def test_an_edited_results_file_is_refused_in_one_line(stored, tmp_path, name, edit, message):
    path = _edited(stored, tmp_path, edit)
    with pytest.raises(race.RaceError) as err:
        race.load_results(path)
    assert message in str(err.value) and "\n" not in str(err.value), name


def test_a_budget_halving_record_that_is_not_a_mapping_is_no_mark(stored, tmp_path):
    path = _edited(stored, tmp_path, lambda d: d["pilots"][0].setdefault("extra", {}).__setitem__("budget_halving", [1]))
    assert len(race.load_results(path).pilots) == 12


def test_integers_past_any_number_race_writes_are_refused_in_results_and_configs(stored, tmp_path):
    text = json.dumps(stored).replace('"schema_version": 1', '"schema_version": 1, "x": ' + "9" * 5000, 1)
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(race.RaceError, match="holds an integer of 5,000 digits"):
        race.load_results(str(tmp_path / "r.json"))
    (tmp_path / "c.yaml").write_text("model: race/tiny-arith\nbudget: " + "9" * 5000 + "\n")
    with pytest.raises(race.ConfigError, match="holds an integer of more than 4,300 digits"):
        race.load_config(str(tmp_path / "c.yaml"))


@pytest.mark.parametrize("kw, message", [
    ({"results": None}, "results None must be a list of race.PilotResult records"),
    ({"as_dicts": True}, "results[0] {'rho_target': 0.5"),
    ({"n_boot": True}, "n_boot True must be a whole number ≥ 1 and ≤ 100000"),
    ({"n_boot": 10 ** 12}, "n_boot 1000000000000 must be a whole number"),
    ({"seed": -1}, "seed -1 must be a whole number ≥ 0"),
    ({"meta": 5}, "meta 5 must be a mapping"),
    ({"targets": "reward"}, "targets 'reward' must be a list of target names"),
    ({"reward_share_threshold": float("nan")}, "reward_share_threshold nan must be a finite number > 0 and ≤ 1"),
    ({"confidence_level": 0}, "confidence_level 0 must be a finite number > 0 and < 1"),
    ({"rerun_confidence": "yes"}, "rerun_confidence 'yes' must be True or False"),
    ({"results": []}, "no complete results among 0"),
])
def test_classify_checks_its_arguments_before_any_fit(pilots, kw, message):
    kw = dict(kw)
    results = kw.pop("results", pilots)
    if kw.pop("as_dicts", False):
        results = [p.to_dict() for p in pilots]
    with pytest.raises(race.RaceError) as err:
        race.classify(results, **kw)
    assert message in str(err.value)


@pytest.mark.parametrize("kw, message", [
    ({"budget": "x"}, "budget 'x' is not a FLOP count"),
    ({"budget": float("nan")}, "budget nan must be a positive finite FLOP count"),
    ({"grid": "abc"}, "grid value 'abc' is not a number"),
    ({"reward": {"kind": "x"}}, "reward {'kind': 'x'} must be a race.config.configfile.RewardSettings"),
    ({"lora": None}, "lora None must be a race.config.configfile.LoRASettings"),
    ({"task": 5}, "task 5 must be a built-in task name or a dataset path"),
])
def test_a_grid_config_built_in_python_is_typed(kw, message):
    with pytest.raises(race.ConfigError) as err:
        race.GridConfig(model="race/tiny-arith", **{"budget": 1e10, **kw})
    assert message in str(err.value)


def test_a_grid_config_reads_strings_as_a_file_would_and_refuses_unknown_overrides():
    c = race.GridConfig(model="race/tiny-arith", budget="2e11", grid=[0.7, 0.3, 0.5])
    assert c.budget == 2e11 and c.grid == (0.7, 0.3, 0.5)
    with pytest.raises(race.ConfigError, match="'bogus' is not a config field: expected one of model, budget"):
        c.with_overrides(bogus=1)


@pytest.mark.parametrize("args, kw, message", [
    (None, {}, "config None must be a race.GridConfig"),
    ({}, {}, "config {} must be a race.GridConfig"),
    ("ok", {"prompt_len": float("nan")}, "prompt_len nan must be a finite number > 0"),
    ("ok", {"completion_len": float("inf")}, "completion_len inf must be a finite number > 0"),
    ("ok", {"arch": "llama"}, "arch 'llama' must be a race.flops.formulas.ArchSpec"),
])
def test_plan_grid_checks_its_arguments(args, kw, message):
    config = race.GridConfig(model="race/tiny-arith", budget=1e12) if args == "ok" else args
    with pytest.raises(race.ConfigError) as err:
        race.plan_grid(config, **kw)
    assert message in str(err.value)


def test_diagnose_refuses_an_unknown_model_and_a_budget_below_one_rollout_before_making_any_folder(tmp_path):
    out = tmp_path / "left" / "over"
    with pytest.raises(race.ConfigError, match="unknown model 'no/such'"):
        race.diagnose(model="no/such", budget=1e10, quiet=True, out_dir=str(out))
    with pytest.raises(race.ConfigError, match=r"budget 1 FLOPs is less than one rollout of one token \(1.48e\+06"):
        race.diagnose(budget=1, quiet=True, out_dir=str(out))
    assert os.listdir(tmp_path) == []     # the checks before calibration refused both (that line is the floor's)


def test_load_config_and_load_results_take_paths_only_and_say_what_a_path_is(tmp_path):
    for bad in (None, {}, 5):
        with pytest.raises(race.ConfigError, match="must be a file path"):
            race.load_config(bad)
        with pytest.raises(race.RaceError, match="must be a file or folder path"):
            race.load_results(bad)
    with pytest.raises(race.ConfigError, match="is not a regular file"):
        race.load_config(str(tmp_path))
    (tmp_path / "nul.yaml").write_bytes(b"\0\0\0\0")
    (tmp_path / "key.yaml").write_text("? [1, 2]\n: 3\n")
    for name, message in (("nul.yaml", "is not valid YAML: unacceptable character #x0000"),
                          ("key.yaml", "has a key that is a list or a mapping")):
        with pytest.raises(race.ConfigError) as err:
            race.load_config(str(tmp_path / name))
        assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("reward, message", [
    (lambda p, c, r: 0.0, "a callable cannot cross into pilot processes"),
    (5, "reward 5 must be a name (sparse"), (["sparse"], "reward ['sparse'] must be a name"),
])
def test_diagnose_names_a_reward_it_cannot_take(reward, message):
    with pytest.raises(race.ConfigError) as err:
        race.diagnose(reward=reward, budget=1e10, quiet=True)
    assert message in str(err.value)


@pytest.mark.parametrize("args, kw, message", [
    ((None,), {}, "results 'None' must be a race Results"),
    (("R", 5), {}, "plot file '5' must be a file path"),
    (("R",), {"refit": "yes"}, "refit 'yes' must be True or False"),
    (("R",), {"target": "nope"}, "target 'nope' is not in this diagnosis"),
])
def test_plot_results_checks_its_arguments(args, kw, message):
    args = tuple(race.load_results(RUN) if a == "R" else a for a in args)
    with pytest.raises(race.RaceError) as err:
        race.plot_results(*args, **kw)
    assert message in str(err.value)


def test_run_models_and_run_probe_check_their_arguments_before_any_work(tmp_path):
    from race.run.api import run_models, run_probe

    one = race.GridConfig(model="race/tiny-arith", budget=1e10)
    two = race.GridConfig(model="race/tiny-arith", models=("race/tiny-arith", "race/tiny-reasoner"), budget=1e10)
    out = str(tmp_path / "m")
    for config, kw, message in ((None, {}, "config None must be a race.GridConfig naming models"),
                                (one, {}, "config names one policy ('race/tiny-arith')"),
                                (two, {"retries": "2"}, "retries 2: expected a whole number from 0 to 100"),
                                (two, {"storage": 5}, "storage '5': expected a storage URL")):
        with pytest.raises(race.RaceError) as err:
            run_models(config, out_dir=out, quiet=True, **kw)
        assert message in str(err.value)
    assert os.listdir(tmp_path) == []
    results = race.load_results(RUN)
    for kw, message in (({"force": "yes"}, "force 'yes' must be True or False"),
                        ({"progress": 5}, "progress 5 must be a function"), ({"out": 5}, "out 5 must be a folder or a .json path")):
        with pytest.raises(race.RaceError, match=message):
            run_probe(results, full_run_budget=6e12, **kw)


@pytest.mark.parametrize("kw, message", [({"emit_dir": 5}, "emit_dir 5 must be a non-empty string"),
                                         ({"emit_dir": ""}, "emit_dir '' must be a non-empty string"),
                                         ({"force": "yes"}, "force 'yes' must be True or False")])
def test_recipe_checks_emit_dir_and_force(kw, message):
    with pytest.raises(race.RaceError) as err:
        race.recipe(RUN, trainer="trl", full_run_budget=1e14, **kw)
    assert message in str(err.value)


@pytest.mark.parametrize("call, message", [
    (lambda w: w.check_means([(0, 0.5), (1, 10 ** 400)], prompts=50), "step 1: score 0 is '1000"),
    (lambda w: w.check_means([(0, 0.5), (1, 0.2)], prompts=10 ** 400), "must be a whole number from 2 to 1e+12"),
    (lambda w: w.check_scores([(0, [1, 0, 1]), (1, [10 ** 400, 0, 1])]), "expected a finite number"),
])
def test_the_watch_refuses_integers_past_a_float_in_one_line(call, message):
    from race.fullrun import watch
    with pytest.raises(watch.WatchError, match=re.escape(message)):
        call(watch)


@pytest.mark.parametrize("change, message", [
    ({"evals": None}, r"results\[0\]\.evals None must be a mapping"),
    ({"extra": None}, r"results\[0\]\.extra None must be a mapping"),
    ({"flops": None}, r"results\[0\]\.flops None must be a race\.core\.records\.FlopBreakdown"),
    ({"seed": 10**30}, r"results\[0\]\.seed 1000000000000000000000000000000 must be a whole number ≥ 0 and ≤ 2147483647"),
    ({"curve": "x"}, r"results\[0\]\.curve 'x' must be a list of \(FLOPs, reward\) pairs"),
    ({"flops": "learning0"}, r"results\[0\]\.flops has no learning FLOPs \(ρ 0\)"),
    ({"evals": "nan"}, r"results\[0\]\.evals\['reward'\]\[0\] nan must be a finite number"),
])
def test_classify_checks_each_pilot_record_before_any_fit(pilots, change, message):
    """Records built in Python (dataclasses.replace) reach classify unchecked by any file's schema: each field
    classify reads is checked first, one ClassifyError line naming it (a review of session 39)."""
    import dataclasses

    from race.core.records import FlopBreakdown

    first = pilots[0]
    if change.get("flops") == "learning0":
        change = {"flops": FlopBreakdown(1e12, 0.0, 0.0)}
    if change.get("evals") == "nan":
        change = {"evals": {**first.evals, "reward": (float("nan"),) * len(first.evals["reward"])}}
    with pytest.raises(race.RaceError, match=message):
        race.classify([dataclasses.replace(first, **change)] + pilots[1:], rerun_confidence=False)


@pytest.mark.parametrize("bad, message", [
    (float("nan"), r"results\[0\]\.evals\['reward'\]\[3\] nan must be a finite number"),
    (1e13, r"results\[0\]\.evals\['reward'\]\[3\] 10000000000000\.0 must be a finite number ≥ -1e\+12 and ≤ 1e\+12"),
    (True, r"results\[0\]\.evals\['reward'\]\[3\] True must be a finite number"),
    ("0.5", r"results\[0\]\.evals\['reward'\]\[3\] '0\.5' must be a finite number"),
])
def test_classify_names_one_bad_score_among_plain_ones(pilots, bad, message):
    """Plain scores pass in one sweep (race.stats.classify_input._plain_scores); one bad score among them is still
    named by its index."""
    import dataclasses

    first = pilots[0]
    scores = list(first.evals["reward"])
    scores[3] = bad
    with pytest.raises(race.RaceError, match=message):
        race.classify([dataclasses.replace(first, evals={**first.evals, "reward": tuple(scores)})] + pilots[1:],
                      rerun_confidence=False)


def test_a_record_names_a_string_or_boolean_among_plain_scores(pilots):
    """A list of plain numbers skips the coerced-number walk (race.core.validation.coerced_number); a string or a
    boolean inside it is still found and named."""
    from race.core.records import PilotResult

    d = pilots[0].to_dict()
    for value, kind in (("0.5", "a string"), (True, "a boolean")):
        scores = list(d["evals"]["reward"])
        scores[3] = value
        with pytest.raises(race.RaceError, match=rf"^PilotResult\.evals\.reward\.3 .* is {kind}: expected a number$"):
            PilotResult.from_dict({**d, "evals": {**d["evals"], "reward": scores}})


def test_records_refuse_numbers_given_as_strings_or_booleans(pilots):
    from race.core.records import FlopBreakdown, PilotResult

    d = pilots[0].to_dict()
    assert PilotResult.from_dict(d) == pilots[0]
    for key, value, kind in (("seed", True, "a boolean"), ("seed", "3", "a string"), ("rho_target", "0.5", "a string")):
        with pytest.raises(race.RaceError, match=rf"^PilotResult\.{key} .* is {kind}: expected a number$"):
            PilotResult.from_dict({**d, key: value})
    with pytest.raises(race.RaceError, match=r"FlopBreakdown\.search True is a boolean"):
        FlopBreakdown.from_dict({"search": True})
    with pytest.raises(race.RaceError, match=r"primary_target 'reward' has no verdict"):
        race.Diagnosis(primary_target="reward", verdicts={})


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["pilots"][0].update(seed=10**30), r"has seed 1000000000000000000000000000000: expected a whole number"),
    (lambda r: r["pilots"].append(copy.deepcopy(r["pilots"][0])), r"seed 0 is recorded twice"),
    (lambda r: r["pilots"][0]["evals"]["reward"].__setitem__(0, float("nan")), r"evals\.reward\[0\] is not a finite"),
    (lambda r: r["pilots"][0]["evals"]["reward"].__setitem__(0, 1e308), r"evals\.reward\[0\] is past ±1e\+12"),
    (lambda r: r["diagnosis"]["verdicts"]["reward"].update(slope_ci=[float("nan"), 1e308]),
     r"diagnosis\.verdicts\.reward\.slope_ci\[0\] is not a finite number"),
    (lambda r: r["diagnosis"]["verdicts"]["reward"]["points"][0].update(n_seeds=-3), r"with n_seeds -3: expected"),
])
def test_load_results_refuses_what_classify_and_the_report_cannot_use(tmp_path, stored, edit, message):
    """A results file is untrusted: a seed past a generator's range, a pilot twice, a non-finite score or diagnosis
    number (the JSON report would print NaN), a point of no seeds: one ResultsError line each."""
    with pytest.raises(race.RaceError, match=message):
        race.load_results(_edited(stored, tmp_path, edit))


def test_a_corrupt_gzip_is_one_line(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbagegarbage")
    with pytest.raises(race.RaceError, match=r"is not a JSON text file \(nor gzip-compressed JSON\): error: "):
        race.load_results(str(path))


def test_plot_models_and_joint_views_check_their_arguments(tmp_path):
    """A review of session 39: plot_models passed its arguments on unchecked (TypeError, AttributeError, ValueError
    from inside)."""
    results = race.load_results(RUN)
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "models.json").write_text(json.dumps({"parts": {"a": "../../etc"}}))
    for args, kw, message in (((None,), {}, r"parts None must be \(label, race Results\) pairs"),
                              (([results, results],), {}, r"must be \(label, race Results\) pairs"),
                              (([("a", results)],), {}, r"a joint view needs at least 2 policies' grids, got 1"),
                              (([("a", results), ("b", results)],), {"target": ["reward"]},
                               r"target \['reward'\] must be a target name"),
                              ((str(tmp_path / "nowhere"),), {}, r"is not a RACE grid over models: FileNotFoundError"),
                              ((str(tmp_path / "grid"),), {}, r"part 'a' names '../../etc': expected a folder beside")):
        with pytest.raises(race.RaceError, match=message):
            race.plot_models(*args, **kw)
    with pytest.raises(race.RaceError, match=r"target \['reward'\] must be a target name"):
        race.plot_results(results, target=["reward"])


def test_run_models_refuses_an_out_dir_that_is_a_file(tmp_path):
    cfg = race.GridConfig(model="race/tiny-arith-s", models=("race/tiny-arith-s", "race/tiny-arith"), budget=2e10)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(race.RaceError, match=r"out_dir .* is not a folder"):
        race.run_models(cfg, out_dir=str(tmp_path / "afile"))


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "1+1", "answer": ' + "9" * 5000 + "}", "holds an integer of 5,000 digits"),
    ('{"prompt": ' + "[" * 100000 + "]" * 100000 + ', "answer": 1}', "nests JSON too deeply"),
])
def test_a_dataset_line_a_parser_cannot_take_is_one_line(tmp_path, line, message):
    from race.tasks.datasets import load_jsonl

    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(race.RaceError, match=rf"d\.jsonl line 1 {message}"):
        load_jsonl(str(path))


def test_integers_past_a_float_are_one_line_in_the_api(tmp_path):
    results = race.load_results(RUN)
    with pytest.raises(race.RaceError, match=r"^ρ 1000.* is not a number in \(0, 1\)"):
        race.recipe(results, trainer="trl", full_run_budget=1e15, rho=10**400)
    with pytest.raises(race.RaceError, match=r"^adaptive share 1000.* is outside \(0, 1\]"):
        race.diagnose(out_dir=str(tmp_path / "d"), adaptive_share=10**400)
    assert not (tmp_path / "d").exists()
