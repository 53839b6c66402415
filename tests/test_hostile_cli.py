"""The CLI under hostile input (a review of session 36): each case is one ``Error:`` line and exit 2, before
any compute, and nothing is written where the command refused."""
import copy
import gzip
import json
import os

import pytest
from click.testing import CliRunner

from conftest import ROOT
from race.run.cli import main

RUN = os.path.join(ROOT, "docs", "runs", "default.results.json.gz")


def _one_line(r):
    lines = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output[-800:]
    return lines[0]


def test_a_plot_into_a_place_that_cannot_hold_it_is_refused_before_the_grid(tmp_path):
    (tmp_path / "afile").write_text("")
    plot = str(tmp_path / "afile" / "x.png")
    line = _one_line(CliRunner().invoke(main, ["report", RUN, "--plot", plot]))
    assert "cannot be written" in line and "is not a folder" in line
    line = _one_line(CliRunner().invoke(main, ["pilot", "--budget", "1e10", "--plot", plot, "--out",
                                               str(tmp_path / "run")]))
    assert "cannot be written" in line and not (tmp_path / "run").exists()


@pytest.mark.parametrize("config, message", [
    ({"num_attention_heads": 0}, "'num_attention_heads' is 0: expected at least 1"),
    ({"hidden_size": float("inf")}, "'hidden_size' is inf: expected an integer"),
    ({"hidden_size": 1e300}, "expected a size from 0 to 1,099,511,627,776"),
    ({"num_key_value_heads": 0}, "'num_key_value_heads' is 0: expected at least 1"),
    ({"head_dim": 0}, "head_dim must be an integer >= 1, got 0"),
])
def test_a_model_config_json_that_breaks_the_arithmetic_is_one_line(tmp_path, config, message):
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps({**base, **config}).replace("Infinity", "1e400"))
    assert message in _one_line(CliRunner().invoke(main, ["flops", "--model", str(tmp_path)]))


def test_lengths_past_any_context_are_refused_not_printed_as_inf():
    r = CliRunner().invoke(main, ["flops", "--model", "race/tiny-arith", "--prompt-len", "1e300",
                                  "--completion-len", "1e300"])
    assert "prompt_len must be a number of tokens from 0 to 1e+09, got 1e+300" in _one_line(r)


@pytest.mark.parametrize("storage", ["sqlite:///{}/new.db", "journal:{}/new.log"])
def test_a_worker_on_a_storage_file_that_is_not_there_creates_none(tmp_path, storage):
    r = CliRunner().invoke(main, ["worker", "--storage", storage.format(tmp_path), "--study", "s", "--wait", "0"])
    assert "does not exist: no study to join" in _one_line(r) and os.listdir(tmp_path) == []


def test_an_openrlhf_yaml_recipe_is_refused_before_anything_is_emitted(tmp_path):
    r = CliRunner().invoke(main, ["recipe", RUN, "--for", "openrlhf", "--full-run", "1e14", "--format", "yaml",
                                  "--emit", str(tmp_path / "e")])
    assert "takes command-line flags only" in _one_line(r) and not (tmp_path / "e").exists()


@pytest.mark.parametrize("value", [-1, True, "x"])
def test_stored_classify_settings_that_are_not_a_mapping_are_read_as_absent(tmp_path, value):
    d = json.load(gzip.open(RUN))
    d = copy.deepcopy(d)
    d["diagnosis"]["meta"]["classify"] = value
    (tmp_path / "r.json").write_text(json.dumps(d))
    r = CliRunner().invoke(main, ["report", str(tmp_path / "r.json"), "--full-run", "6e12"])
    assert r.exit_code == 0 and "range at F" in r.output, r.output[-800:]


@pytest.mark.parametrize("args, message", [
    (["--storage", ""], "--storage '' is empty: give a value, or leave the option out"),
    (["--study", " "], "--study ' ' is empty"), (["--plot="], "argument '--plot=' is empty"),
    (["--share", "0.1"], "share 0.1 sizes pilots from the full run: give a design too"),
])
def test_a_pilot_option_given_empty_or_without_its_partner_is_refused_not_ignored(tmp_path, args, message):
    r = CliRunner().invoke(main, ["pilot", "--budget", "1e10", "--out", str(tmp_path / "run"), *args])
    assert message in _one_line(r) and not (tmp_path / "run").exists()


def test_json_with_another_format_is_refused_not_silently_json(tmp_path):
    cfg = os.path.join(ROOT, "pilots", "tiny-cpu.yaml")
    line = _one_line(CliRunner().invoke(main, ["plan", cfg, "--json", "--format", "md"]))
    assert "--json means --format json, but --format md was given too" in line
    line = _one_line(CliRunner().invoke(main, ["pilot", "--budget", "1e10", "--json", "--format", "latex", "--out",
                                               str(tmp_path / "run")]))
    assert "--format latex was given too" in line and not (tmp_path / "run").exists()
    r = CliRunner().invoke(main, ["plan", cfg, "--json", "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.output)
