"""Rule-based rewards on hand-made completions."""
import math

import pytest

from race.tasks.rewards import (REWARDS, RewardBatch, RewardError, dense, final_answer, get_reward,
                          score_completions, sparse, structured)


@pytest.mark.parametrize("completion, expected", [
    ("46</s><pad><pad>", ("46", True)),
    (" 46 </s>47</s>", ("46", True)),
    ("46<|im_end|>", ("46", True)),
    ("46<|endoftext|><|im_end|>", ("46", True)),
    ("4646", ("4646", False)),
    ("</s>", ("", True)),
    ("", ("", False)),
])
def test_final_answer(completion, expected):
    assert final_answer(completion) == expected


@pytest.mark.parametrize("completion, score", [
    ("46</s>", 1.0), ("46", 1.0), (" 46\n</s>", 1.0), ("46</s>99", 1.0),
    ("47</s>", 0.0), ("046</s>", 0.0), ("46.0</s>", 0.0), ("4646", 0.0), ("</s>", 0.0), ("", 0.0),
])
def test_sparse(completion, score):
    assert sparse("12+34=", completion, "46") == score


@pytest.mark.parametrize("completion, score", [
    ("46</s>", 1.0),      # correct and terminated
    ("46", 0.8),          # correct, ran out of tokens
    ("47</s>", 0.2),      # well-formed but wrong
    ("-3</s>", 0.2),      # negative integers are well-formed
    ("4x</s>", 0.0), ("</s>", 0.0), ("47", 0.0), ("4 6</s>", 0.0),
])
def test_structured(completion, score):
    assert structured("12+34=", completion, "46") == pytest.approx(score)


def test_structured_non_numeric_reference():
    assert structured("capital of France?", "Paris</s>", "Paris") == pytest.approx(1.0)
    assert structured("capital of France?", "Lyon</s>", "Paris") == pytest.approx(0.2)
    assert structured("capital of France?", "Lyon\nor Paris</s>", "Paris") == 0.0


@pytest.mark.parametrize("completion, score", [
    ("146</s>", 1.0), ("147</s>", 2 / 3), ("46</s>", 2 / 3), ("1146</s>", 3 / 4),
    ("641</s>", 1 / 3), ("</s>", 0.0), ("999</s>", 0.0), ("146", 1.0), ("146146", 3 / 6),
])
def test_dense(completion, score):
    assert dense("100+46=", completion, "146") == pytest.approx(score)


def test_dense_is_one_exactly_when_sparse_is_one():
    for completion in ("146</s>", "14</s>", "1460</s>", "146", "0146</s>", "", "abc"):
        assert (dense("", completion, "146") == 1.0) == (sparse("", completion, "146") == 1.0)


def test_rewards_lie_in_unit_interval():
    for fn in REWARDS.values():
        for completion in ("", "</s>", "9</s>", "12345678</s>", "x", "46</s>"):
            assert 0.0 <= fn("12+34=", completion, "46") <= 1.0


def test_get_reward_names_strings_callables():
    assert get_reward("sparse") is sparse and get_reward("dense") is dense
    assert get_reward("race.tasks.rewards.rules:structured") is structured
    assert get_reward("math:isfinite") is math.isfinite

    def mine(p, c, r):
        return 0.5

    assert get_reward(mine) is mine


@pytest.mark.parametrize("name, match", [
    ("sparce", "unknown: expected one of sparse, structured, dense"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("race.tasks.rewards.rules:nothing", "has no attribute 'nothing'"),
    ("race.tasks.rewards.rules:EOS_MARKERS", "is not callable"),
    (3, "must be a name"),
])
def test_get_reward_errors(name, match):
    with pytest.raises(RewardError, match=match):
        get_reward(name)


def test_score_completions_counts_but_survives_faulty_rewards():
    def flaky(prompt, completion, reference):
        if completion == "boom":
            raise RuntimeError("kaboom")
        if completion == "nan":
            return float("nan")
        if completion == "inf":
            return math.inf
        if completion == "str":
            return "not a number"
        return 0.75

    batch = score_completions(flaky, ["p"] * 5, ["ok", "boom", "nan", "inf", "str"], ["r"] * 5)
    assert isinstance(batch, RewardBatch)
    assert batch.scores == [0.75, 0.0, 0.0, 0.0, 0.0]
    assert batch.errors == 4 and batch.first_error == "RuntimeError: kaboom"
    assert batch.flops == 0.0 and batch.cpu_seconds >= 0.0


def test_score_completions_by_name():
    batch = score_completions("sparse", ["1+1=", "2+2=", "3+3="], ["2</s>", "5</s>", "6"], ["2", "4", "6"])
    assert batch.scores == [1.0, 0.0, 1.0] and batch.errors == 0 and batch.first_error is None
    assert batch.mean == pytest.approx(2 / 3) and batch.flops == 0.0


def test_score_completions_length_mismatch():
    with pytest.raises(RewardError, match=r"prompts \(2\), completions \(1\) and references \(2\)"):
        score_completions("sparse", ["a", "b"], ["1"], ["1", "2"])


def _user_reward(folder, name="myreward_e2e", body="def score(p, c, r):\n    return 0.25\n"):
    (folder / f"{name}.py").write_text(body)
    return name


def test_a_module_in_the_current_directory_is_found_as_a_user_expects(tmp_path, monkeypatch):
    """`race` is a console script: the current directory is not on sys.path, yet `myreward:score`
    next to the user's config must work (and does in every pilot process, which shares the cwd)."""
    import sys

    name = _user_reward(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)
    assert get_reward(f"{name}:score")("1+1=", "2", "2") == 0.25
    sys.modules.pop(name, None)


def test_a_reward_file_path(tmp_path):
    _user_reward(tmp_path, "file_reward", "def score(p, c, r):\n    return 0.75\n")
    assert get_reward(f"{tmp_path}/file_reward.py:score")("", "", "") == 0.75
    with pytest.raises(RewardError, match=r"file '.*missing.py' does not exist"):
        get_reward(f"{tmp_path}/missing.py:score")
    _user_reward(tmp_path, "broken_reward", "import no_such_dependency_xyz\n")
    with pytest.raises(RewardError, match="importing .*broken_reward.py' failed .ModuleNotFoundError"):
        get_reward(f"{tmp_path}/broken_reward.py:score")


def test_a_config_finds_its_reward_beside_it_from_any_directory(tmp_path, monkeypatch):
    from race.config.configfile import load_config

    cfgdir = tmp_path / "configs"
    cfgdir.mkdir()
    _user_reward(cfgdir, "beside_reward")
    (cfgdir / "a.yaml").write_text("model: race/tiny-arith\nbudget: 1e10\nreward: {kind: custom, function: beside_reward:score}\n")
    (cfgdir / "b.yaml").write_text("model: race/tiny-arith\nbudget: 1e10\nreward: {kind: custom, function: ./beside_reward.py:score}\n")
    monkeypatch.chdir(tmp_path)                     # not the config's folder
    for f in ("a.yaml", "b.yaml"):
        fn = load_config(str(cfgdir / f)).reward.function
        assert fn == f"{cfgdir / 'beside_reward.py'}:score"
        assert get_reward(fn)("", "", "") == 0.25
    # from the config's own folder, where the module is importable too (a script run there: sys.path[0]),
    # it is the same file: the same path, so `race pilot` and race.diagnose there resume one study
    monkeypatch.chdir(cfgdir)
    monkeypatch.syspath_prepend(str(cfgdir))
    assert load_config("a.yaml").reward.function == f"{cfgdir / 'beside_reward.py'}:score"
    # an importable module keeps its name
    (cfgdir / "c.yaml").write_text("model: race/tiny-arith\nbudget: 1e10\nreward: {kind: custom, function: math:isfinite}\n")
    assert load_config(str(cfgdir / "c.yaml")).reward.function == "math:isfinite"
    # and so does one importable from elsewhere, even with a file of that name beside the config
    (cfgdir / "json.py").write_text("def loads(*a):\n    return 0.0\n")
    (cfgdir / "d.yaml").write_text("model: race/tiny-arith\nbudget: 1e10\nreward: {kind: custom, function: json:loads}\n")
    monkeypatch.syspath_prepend(str(tmp_path))       # the stdlib's json is found first
    import sys
    sys.path.remove(str(cfgdir))
    assert load_config(str(cfgdir / "d.yaml")).reward.function == "json:loads"


def test_calibration_warns_when_the_reward_never_varies():
    from race.config.configfile import config_from_dict
    from race.engine.calibration import Calibration, reward_check
    from race.tasks import Problem

    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e10})          # sparse reward
    problems = [Problem("1+2=", "3", 0), Problem("4+4=", "8", 1)]
    flat = reward_check(cfg, problems, [["4</s>", "5</s>"], ["9</s>", "7</s>"]])
    assert flat["constant"] and flat["samples"] == 4 and flat["mean"] == 0.0
    assert flat["example"] == {"prompt": "1+2=", "completion": "4</s>", "reference": "3", "reward": 0.0}
    line = Calibration(4, 2, 0.0, 4, 0.1, reward_check=flat).reward_warning()
    assert "gave 0 to all 4 calibration samples" in line and "'1+2=' → completion '4</s>', reference '3'" in line
    varied = reward_check(cfg, problems, [["3</s>", "5</s>"], ["9</s>", "7</s>"]])
    assert not varied["constant"] and varied["mean"] == 0.25
    assert Calibration(4, 2, 0.25, 4, 0.1, reward_check=varied).reward_warning() is None
    prm = config_from_dict({"model": "race/tiny-arith", "budget": 1e10, "reward": {"kind": "prm", "model": "x"}})
    assert reward_check(prm, problems, [["3"], ["8"]]) is None       # a PRM loads in the pilots only


def test_two_reward_files_with_one_name_are_two_modules(tmp_path):
    for folder, value in (("a", "0.1"), ("b", "0.9")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "reward.py").write_text(f"def score(p, c, r):\n    return {value}\n")
    assert get_reward(f"{tmp_path}/a/reward.py:score")("", "", "") == 0.1
    assert get_reward(f"{tmp_path}/b/reward.py:score")("", "", "") == 0.9
