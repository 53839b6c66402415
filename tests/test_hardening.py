"""Hardening round 4 (issue 50), one test per class of failure: writes that stay in their folder
(a real planted symlink), ``--emit`` that never replaces a user's files without ``--force``, one
writer per results file (two real processes), honest probe coverage and refusals before compute,
the API's argument checks (with a ``hypothesis`` property test over its numbers), and a watch whose
checker cannot take the run down."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from race.core.errors import RaceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json")


def _race(*args, cwd):
    return subprocess.run([sys.executable, "-m", "race", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=600)


# ------------------------------------------------------------------ 1. writes that stay where they are told

def test_a_planted_symlink_is_never_written_through(tmp_path):
    """race recipe --emit DIR --force, with race_reward.py planted as a link to a file elsewhere and
    data/ as a link to a folder elsewhere: refused in one line, and nothing outside DIR changes."""
    from race.core.safeio import UnsafeWrite, write_inside

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    emit = tmp_path / "emit"
    emit.mkdir()
    os.symlink(victim, emit / "race_reward.py")
    r = _race("recipe", RESULTS, "--for", "trl", "--full-run", "6e12", "--emit", str(emit), "--force", cwd=tmp_path)
    assert r.returncode == 2 and "symbolic link" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert victim.read_text() == "precious\n" and os.path.islink(emit / "race_reward.py")

    emit2 = tmp_path / "emit2"
    emit2.mkdir()
    os.symlink(outside, emit2 / "data")
    r = _race("recipe", RESULTS, "--for", "trl", "--full-run", "6e12", "--emit", str(emit2), "--force", cwd=tmp_path)
    assert r.returncode == 2 and "outside the folder" in r.stderr, r.stderr
    assert os.listdir(outside) == []
    # the helper itself: '..' out of the folder, a link at the final component, a folder in the way
    with pytest.raises(UnsafeWrite, match="outside the folder"):
        write_inside(str(emit2), "../escape.txt", "x")
    with pytest.raises(UnsafeWrite, match="symbolic link"):
        write_inside(str(emit), "race_reward.py", "x")
    with pytest.raises(UnsafeWrite, match="not a regular file"):
        write_inside(str(tmp_path), "elsewhere", "x")
    assert not (tmp_path / "escape.txt").exists() and victim.read_text() == "precious\n"
    # and a normal write is whole, with no temporary file left behind
    path = write_inside(str(tmp_path / "new" / "deep"), "a/b.txt", "hello")
    assert open(path).read() == "hello" and os.listdir(os.path.dirname(path)) == ["b.txt"]


def test_results_files_are_written_through_the_helper_and_refuse_a_link(tmp_path):
    from race.stats.results import ResultsError, load_results, save_results
    from race.core.safeio import UnsafeWrite

    res = load_results(RESULTS)
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    os.symlink(victim, tmp_path / "results.json")
    with pytest.raises((UnsafeWrite, ResultsError), match="symbolic link"):
        save_results(str(tmp_path), res)
    assert victim.read_text() == "{}"


# ------------------------------------------------------------------ lost work: --emit into a folder in use

def test_emit_refuses_a_non_empty_folder_and_force_replaces_only_races_files(tmp_path):
    emit = tmp_path / "emit"
    emit.mkdir()
    (emit / "notes.txt").write_text("mine\n")
    (emit / "race_reward.py").write_text("# my edits\n")
    r = _race("recipe", RESULTS, "--for", "trl", "--full-run", "6e12", "--emit", str(emit), cwd=tmp_path)
    assert r.returncode == 2 and "is not empty" in r.stderr and "--force" in r.stderr, r.stderr
    assert (emit / "race_reward.py").read_text() == "# my edits\n" and sorted(os.listdir(emit)) == [
        "notes.txt", "race_reward.py"]
    r = _race("recipe", RESULTS, "--for", "trl", "--full-run", "6e12", "--emit", str(emit), "--force", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "replaced RACE's own race_reward.py (--force)" in r.stderr
    assert (emit / "notes.txt").read_text() == "mine\n"
    assert "RACE's reward for this recipe" in (emit / "race_reward.py").read_text()
    assert (emit / "data" / "train.jsonl").is_file() and (emit / "recipe.json").is_file()
    # a new or empty folder needs no --force; --force without --emit is refused
    assert _race("recipe", RESULTS, "--for", "trl", "--full-run", "6e12", "--emit", str(tmp_path / "fresh"),
                 cwd=tmp_path).returncode == 0
    r = _race("recipe", RESULTS, "--for", "trl", "--full-run", "6e12", "--force", cwd=tmp_path)
    assert r.returncode == 2 and "--force replaces files of --emit DIR" in r.stderr


# ------------------------------------------------------------------ 2. one writer per results file

_FAKE_PROBE = r"""
import sys, time
import race.engine.pilot
from race.stats.results import load_results

res = load_results(sys.argv[1])
pilot = next(p for p in res.pilots if p.status == "complete")

def fake(config, schedule, seed, device="cpu", progress=None, **kw):
    time.sleep(2.0)                 # both probes "run" at once, then store
    return pilot

race.engine.pilot.run_pilot = fake
from race.run.api import run_probe

run_probe(sys.argv[1], full_run_budget=float(sys.argv[2]), lr=float(sys.argv[3]), out=sys.argv[1])
print("ok")
"""


def test_two_probes_on_one_folder_both_keep_their_record(tmp_path):
    """Two real processes store a probe record in one results.json at the same time (the pilot
    replaced by a stored one, so only the storing is real): both records are there afterwards."""
    shutil.copy(RESULTS, tmp_path / "results.json")
    F = 2 * json.loads((tmp_path / "results.json").read_text())["config"]["budget"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [subprocess.Popen([sys.executable, "-c", _FAKE_PROBE, str(tmp_path / "results.json"), str(F), lr],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for lr in ("3e-4", "2e-4")]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    stored = json.loads((tmp_path / "results.json").read_text())
    assert sorted(p["learning_rate"] for p in stored["probes"]) == [2e-4, 3e-4]


def test_a_second_writer_waits_then_is_refused_in_one_line(tmp_path):
    from race.core.safeio import Busy, locked

    path = str(tmp_path / "results.json")
    with locked(path):
        t0 = time.monotonic()
        with pytest.raises(Busy, match=rf"being written by process {os.getpid()}.*nothing was written"):
            with locked(path, wait=0.3):
                pass
        assert time.monotonic() - t0 >= 0.3
    with locked(path, wait=0.3):        # released when the first block ends
        pass


def test_duplicated_keys_in_a_results_file_are_refused(tmp_path):
    from race.stats.results import ResultsError, load_results

    text = open(RESULTS).read()
    bad = text.replace('"schema_version": 1,', '"schema_version": 1, "schema_version": 1,', 1)
    assert bad != text
    (tmp_path / "results.json").write_text(bad)
    with pytest.raises(ResultsError, match="repeats the key 'schema_version'"):
        load_results(str(tmp_path))


# ------------------------------------------------------------------ 3. honest coverage, refusals before compute

def test_probe_refusals_come_before_any_compute_and_name_what_is_wrong(tmp_path):
    from race.fullrun.probe import MIN_COVER, check_full_run, plan_probe
    from race.stats.results import load_results

    res = load_results(RESULTS)
    B = float(res.config["budget"])
    with pytest.raises(RaceError, match="past the 1000 × RACE extrapolates to"):
        plan_probe(res, 1e30 * B)
    with pytest.raises(RaceError, match="is not above the pilot budget"):
        check_full_run(B, B)
    with pytest.raises(RaceError, match=rf"under the {MIN_COVER:.0%} it needs"):
        plan_probe(res, 900 * B)
    # the CLI: race probe at an absurd F exits 2 in one line and writes nothing
    shutil.copy(RESULTS, tmp_path / "results.json")
    before = (tmp_path / "results.json").read_bytes()
    r = _race("probe", str(tmp_path), "--full-run", f"{1e30 * B:g}", cwd=tmp_path)
    assert r.returncode == 2 and "past the 1000 ×" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "results.json").read_bytes() == before
    # race pilot --probe --full-run F ≤ B is refused before the grid runs (no runs/ folder appears)
    t0 = time.monotonic()
    r = _race("pilot", "--probe", "--full-run", "1e3", "--out", str(tmp_path / "grid"), cwd=tmp_path)
    assert r.returncode == 2 and "is not above the pilot budget" in r.stderr, r.stderr
    assert not (tmp_path / "grid").exists() and time.monotonic() - t0 < 60


def test_a_tampered_probe_record_names_the_file_and_the_field(tmp_path):
    from race.stats.instability import stability_at
    from race.stats.results import ResultsError, load_results

    doc = json.loads(open(RESULTS).read())
    doc["probes"] = [{"full_run_budget": 1e13, "status": "held", "learning_rate": 1e-3, "steps": 10,
                      "curve": [{"mean": 0.3}]}]
    doc["probes"][0]["covers"] = "all"
    (tmp_path / "results.json").write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"results.json.*probes\[0\] field 'covers' is 'all'"):
        load_results(str(tmp_path))
    with pytest.raises(RaceError, match="field 'learning_rate' is missing"):
        stability_at(None, full_run_budget=1e13, pilot_budget=1e12, probe={"status": "held", "steps": 3})


def test_a_probe_that_ran_short_of_its_plan_says_so_and_vouches_for_nothing_more():
    from race.stats.instability import stability_at

    rec = {"status": "held", "learning_rate": 1e-3, "steps": 300, "covers": 0.3, "planned_covers": 1.0,
           "curve": [{"mean": 0.3}, {"mean": 0.4}]}
    line = stability_at(None, full_run_budget=3e13, pilot_budget=1e12, probe=rec)
    assert line["status"] == "not tested" and "stopped before the share it planned, 100%" in line["line"]
    assert "stable" not in line["line"]


# ------------------------------------------------------------------ 4. one validation layer for the API

def test_the_api_refuses_bad_arguments_with_a_race_error_naming_them(tmp_path):
    from race.config.configfile import LearningRate
    from race.stats.drift import DriftError, range_at, shrink
    from race.stats.forecast import ForecastError, forecast
    from race.stats.rate import RateError, apply_rate, configured_lr, full_run_rate
    from race.core.records import Regime
    from race.fullrun.watch import Watch, WatchError, check_means, check_scores, verl_history

    cases = [
        (lambda: range_at((0.6, 0.3), 0.5, pilot_budget=1e12, full_run_budget=1e13), DriftError, "is inverted"),
        (lambda: range_at((0.3, 0.6), float("nan"), pilot_budget=1e12, full_run_budget=1e13), DriftError,
         "recommended_rho nan"),
        (lambda: range_at((0.3, 0.6), 0.5, pilot_budget=1e12, full_run_budget=1e13, drift_se=-1), DriftError,
         "drift_se -1"),
        (lambda: range_at("0.3-0.6", 0.5, pilot_budget=1e12, full_run_budget=1e13), DriftError, "a pair"),
        (lambda: range_at((0.3, 0.6), 0.9, pilot_budget=1e12, full_run_budget=1e13), DriftError,
         "recommended_rho 0.9 is outside rho_range [0.3, 0.6]"),
        (lambda: shrink(0.1, 0.1, spread=0), DriftError, "spread 0 must be a finite number > 0"),
        (lambda: full_run_rate(LearningRate(), status="stable", factor=10, full_lr=float("nan")), RateError,
         "full_lr nan"),
        (lambda: full_run_rate(LearningRate(), status="stable", factor=10, full_lr=-1e-3), RateError, "full_lr -0.001"),
        (lambda: full_run_rate(LearningRate(), status="fine", factor=10, full_lr=1e-3), RateError, "status 'fine'"),
        (lambda: configured_lr({"learning_rate": {"fixed": "false"}}), RateError,
         "learning_rate.fixed 'false' must be True or False"),
        (lambda: apply_rate(LearningRate(), {"scale": 3.0, "schedule": "cosine", "warmup": 0.05}), RateError,
         "rate['scale'] 3.0"),
        (lambda: Watch(total_steps="100"), WatchError, "total_steps '100'"),
        (lambda: Watch(total_steps=100).due(-1), WatchError, "step -1"),
        (lambda: Watch(total_steps=100, checkpoints=[0.5, 2]), WatchError, "checkpoints[1] 2"),
        (lambda: check_scores([(0, [0.5]), ("x", [0.5])]), WatchError, "history[1] step 'x'"),
        (lambda: check_means([(0, 0.5)], prompts=True), WatchError, "prompts True"),
        (lambda: verl_history(str(tmp_path / "none")), WatchError, "is not a folder"),
        (lambda: forecast([], target="reward", full_run_budget=float("inf"), pilot_regime=Regime.BALANCED,
                          pilot_best_rho=0.5), ForecastError, "full_run_budget inf"),
        (lambda: forecast([], target="reward", full_run_budget=1e13, pilot_regime=Regime.BALANCED,
                          pilot_best_rho=0.5, force="no"), ForecastError, "force 'no'"),
    ]
    for call, error, text in cases:
        with pytest.raises(error) as info:
            call()
        assert text in str(info.value) and "\n" not in str(info.value), (text, str(info.value))
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "0.jsonl").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(WatchError, match="not a UTF-8 JSON-lines file"):
        verl_history(str(tmp_path / "dump"))
    (tmp_path / "dump" / "0.jsonl").write_text('{"input": "a", "score": 1, "score": 0}\n')
    with pytest.raises(WatchError, match="repeats the key 'score'"):
        verl_history(str(tmp_path / "dump"))


def test_property_the_api_numbers_give_an_answer_or_a_race_error():
    """Over any floats (NaN, ±inf, negative, huge, inverted ranges) range_at, shrink, full_run_rate,
    forecast and model_value return a well-formed answer or raise the module's RaceError, nothing else."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from race.config.configfile import LearningRate
    from race.stats.drift import DriftError, range_at, shrink
    from race.stats.rate import RateError, full_run_rate
    from race.core.records import Regime
    from race.stats.curvefit import model_value
    from race.stats.forecast import ForecastError, forecast

    anything = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10 ** 6, 10 ** 6),
                         st.booleans(), st.text(max_size=5), st.none())

    @settings(max_examples=300, deadline=None)
    @given(lo=anything, hi=anything, rec=anything, b=anything, f=anything, d=anything, se=anything)
    def ranges(lo, hi, rec, b, f, d, se):
        try:
            r = range_at((lo, hi), rec, pilot_budget=b, full_run_budget=f, drift=d, drift_se=se)
        except DriftError as e:
            assert "\n" not in str(e)
            return
        assert 0.01 <= r.rho_range[0] <= r.rho_range[1] <= 0.99
        assert r.rho_range[0] <= r.recommended_rho <= r.rho_range[1] and math.isfinite(r.shift)
        assert lo <= hi and 1.0 <= r.factor and lo - 1e-6 <= rec <= hi + 1e-6

    @settings(max_examples=200, deadline=None)
    @given(d=anything, s=anything, p=anything, sp=anything)
    def shrunk(d, s, p, sp):
        try:
            est, err = shrink(d, s, p, sp)
        except DriftError:
            return
        assert math.isfinite(est) and math.isfinite(err) and err > 0

    @settings(max_examples=200, deadline=None)
    @given(factor=anything, full_lr=anything, plr=anything)
    def rates(factor, full_lr, plr):
        try:
            rate = full_run_rate(LearningRate(), status="at risk", factor=factor, full_lr=full_lr,
                                 probe={"status": "held", "learning_rate": plr})
        except RateError:
            return
        assert 0 < rate["scale"] <= 1 and rate["schedule"] in ("constant", "cosine")

    @settings(max_examples=200, deadline=None)
    @given(f=anything, rho=anything, n=anything, level=anything, share=anything, seed=anything)
    def forecasts(f, rho, n, level, share, seed):
        try:
            fc = forecast([], target="reward", full_run_budget=f, pilot_regime=Regime.BALANCED, pilot_best_rho=rho,
                          n_boot=n, seed=seed, confidence_level=level, reward_share_threshold=share)
        except ForecastError as e:
            assert "\n" not in str(e)
            return
        assert fc.status == "refused" and fc.full_run_budget > 0 and 0 < fc.settings["confidence_level"] < 1

    @settings(max_examples=200, deadline=None)
    @given(a=anything, c_mid=anything, b=anything, r0=anything, c=anything)
    def values(a, c_mid, b, r0, c):
        try:
            v = model_value("sigmoid", {"A": a, "c_mid": c_mid, "B": b}, r0, c)
        except ForecastError as e:
            assert "\n" not in str(e)
            return
        assert c_mid > 0 and c > 0 and v.shape == () and math.isfinite(float(v))

    ranges()
    shrunk()
    rates()
    forecasts()
    values()


# ------------------------------------------------------------------ 5. a watch that cannot take the run down

class _Enc(dict):
    def to(self, device):
        return self


class _Tok:
    padding_side, pad_token_id = "right", 0

    def __call__(self, chunk, return_tensors=None, padding=None):
        import torch

        return _Enc(input_ids=torch.zeros((len(chunk), 2), dtype=torch.long))

    def batch_decode(self, out, skip_special_tokens=True):
        return ["7"] * out.shape[0]


class _Model:
    training, device = True, "cpu"

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def generate(self, input_ids=None, **kw):
        import torch

        return torch.zeros((input_ids.shape[0], 3), dtype=torch.long)

    def named_parameters(self):
        return iter(())


def _train(cb, steps=4):
    """The hooks a trainer calls, in order, on a stand-in model: what reaches the trainer."""
    from types import SimpleNamespace

    state, control = SimpleNamespace(max_steps=steps, global_step=0), SimpleNamespace(should_training_stop=False)
    kw = dict(model=_Model(), processing_class=_Tok())
    cb.on_train_begin(None, state, control, **kw)
    for s in range(1, steps + 1):
        state.global_step = s
        cb.on_step_end(None, state, control, **kw)
    cb.on_train_end(None, state, control, **kw)
    return control


def test_a_checker_that_raises_hangs_or_talks_nonsense_never_stops_the_training():
    from race.fullrun.watch import WatchError, trl_callback

    hang = threading.Event()

    def raises(prompts, completions, **kw):
        raise ValueError("boom")

    def hangs(prompts, completions, **kw):
        hang.wait(30)
        return [1.0] * len(prompts)

    def nonsense(prompts, completions, **kw):
        return ["a lot"] * len(prompts)

    for checker, said in ((raises, "ValueError: boom"), (hangs, "did not return within 0.5 s"),
                          (nonsense, "expected a finite number")):
        lines = []
        t0 = time.monotonic()
        control = _train(trl_callback(["1+1=", "2+5="], checker, timeout=0.5, log=lines.append))
        assert time.monotonic() - t0 < 10 and not control.should_training_stop
        assert len(lines) == 1 and said in lines[0] and "training goes on" in lines[0], lines
    hang.set()
    # the user can ask for the run to stop, or for the error itself
    lines = []
    assert _train(trl_callback(["1+1="], raises, on_error="stop", log=lines.append)).should_training_stop
    assert "the run is stopped" in lines[0]
    with pytest.raises(WatchError, match="ValueError: boom"):
        _train(trl_callback(["1+1="], raises, on_error="raise", log=lines.append))
    # and a checker that works still watches
    good = trl_callback(["1+1="], lambda prompts, completions, **kw: [1.0] * len(prompts), log=lines.append)
    _train(good)
    assert len(good.watch.history) >= 2
    with pytest.raises(WatchError, match="on_error 'ignore' must be one of"):
        trl_callback(["1+1="], raises, on_error="ignore")
    with pytest.raises(WatchError, match="stop 'false' must be True or False"):
        trl_callback(["1+1="], raises, stop="false")
