"""Bad, hostile and stuck input: a table of cases across the CLI, YAML configs, dataset rows,
rewards, storage URLs and damaged results files.

Refusals before compute: exit 2, exactly one ``Error:`` line on stderr, no traceback, nothing
written (no output folder, no storage). Failures at run time (a reward that hangs or exits
mid-pilot): that pilot fails with a one-line reason within its time limit, the command ends
with exit 2 and one line, and the finished pilots are unchanged when the same command runs
again.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from race.run.cli import main

ROOT = Path(__file__).resolve().parents[1]
BASE = "model: race/tiny-arith\nbudget: 2e10\ngrid: [0.5, 0.62, 0.74]\nseeds: 1\n"

REWARDS = '''
import os, sys, time
def hang(p, c, r):
    time.sleep(3600)
def leave(p, c, r):
    sys.exit(0)
def boom(p, c, r):
    raise RuntimeError("boom on purpose")
def text(p, c, r):
    return "not a number"
def fine(p, c, r):
    return 1.0 if c.split("</s>")[0].strip() == r else 0.0
'''

# (id, config YAML appended to BASE or replacing it, extra CLI args, text the error line must hold)
CONFIGS = [
    ("nan-temperature", "grpo: {temperature: .nan}\n", (), "grpo.temperature nan"),
    ("negative-top-p", "grpo: {top_p: -0.5}\n", (), "grpo.top_p -0.5"),
    ("alpha-not-number", "lora: {alpha: x}\n", (), "lora.alpha 'x'"),
    ("name-not-string", "name: 123\n", (), "name 123"),
    ("name-escapes", "name: ../escape\n", (), "name '../escape'"),
    ("model-missing", "!model: ./nope\n", (), "nope"),
    ("grid-scalar", "!grid: 0.5\n", (), "grid 0.5"),
    ("grid-two-points", "!grid: [0.5, 0.6]\n", (), "a verdict needs at least 3"),
    ("grid-one-point", "!grid: [0.5]\n", (), "a verdict needs at least 3"),
    ("grid-out-of-range", "!grid: [0.5, 1.2, 0.7]\n", (), "ρ=1.2 is outside"),
    ("lengths-scalar", "lengths: 5\n", (), "lengths 5"),
    ("task-number", "task: 42\n", (), "task 42"),
    ("beta-not-number", "grpo: {beta: 1e-3x}\n", (), "grpo.beta '1e-3x'"),
    ("eval-temperature-negative", "eval: {temperature: -1}\n", (), "eval.temperature -1"),
    ("eval-temperature-zero", "eval: {temperature: 0}\n", (), "eval.temperature 0"),
    ("prefix-shared-string", "schedule: {prefix_shared: 'no'}\n", (), "schedule.prefix_shared 'no'"),
    ("fixed-maybe", "learning_rate: {fixed: maybe}\n", (), "learning_rate.fixed 'maybe'"),
    ("trust-remote-code-quoted", "reward: {kind: prm, model: race/tiny-prm-s, trust_remote_code: 'false'}\n", (),
     "reward.trust_remote_code 'false'"),
    ("judge-trust-quoted", "eval: {judge_trust_remote_code: 'off'}\n", (), "eval.judge_trust_remote_code 'off'"),
    ("approximate-quoted", "allow_approximate_flops: 'yes'\n", (), "allow_approximate_flops 'yes'"),
    ("seeds-bool", "!seeds: true\n", (), "seeds True"),
    ("seeds-zero", "!seeds: 0\n", (), "seeds 0"),
    ("rank-fraction", "lora: {rank: 2.5}\n", (), "lora.rank 2.5"),
    ("targets-number", "lora: {targets: 5}\n", (), "lora.targets 5"),
    ("targets-unknown", "lora: {targets: [c_attn]}\n", (), "'c_attn' is not a module"),
    ("eval-prompts-beyond-builtin", "eval: {prompts: 100000}\n", (), "100000"),
    ("rank-too-big-for-memory", "lora: {rank: 1000000}\n", (), "lora.rank 1000000"),
    ("unknown-key", "bogus: 1\n", (), "'bogus' is not a known setting"),
    ("unknown-section-key", "grpo: {bogus: 1}\n", (), "grpo.bogus is not a known setting"),
    ("reward-not-mapping", "reward: sparse\n", (), "reward must be a mapping"),
    ("budget-bool", "!budget: true\n", (), "budget True"),
    ("budget-negative", "!budget: -1\n", (), "budget"),
    ("custom-without-function", "reward: {kind: custom}\n", (), "needs reward.function"),
    ("custom-unimportable", "reward: {kind: custom, function: 'no_such_module_x:fn'}\n", (), "no_such_module_x"),
    ("custom-not-callable", "reward: {kind: custom, function: 'rewards.py:NOPE'}\n", (), "NOPE"),
    ("reward-timeout-zero", "reward: {kind: custom, function: 'rewards.py:fine', timeout: 0}\n", (), "reward.timeout 0"),
    ("mix-without-weights", "reward: {kind: mix}\n", (), "reward.kind 'mix' needs reward.mix"),
    ("mix-with-other-kind", "reward: {kind: math, mix: {math: 1}}\n", (), "reward.mix is given but reward.kind is 'math'"),
    ("mix-unknown-component", "reward: {kind: mix, mix: {math: 0.9, magic: 0.1}}\n", (),
     "reward.mix component 'magic' is unknown"),
    ("mix-negative-weight", "reward: {kind: mix, mix: {math: 0.9, format: -0.1}}\n", (), "reward.mix weight -0.1 of 'format'"),
    ("mix-zero-weight", "reward: {kind: mix, mix: {math: 0}}\n", (), "reward.mix weight 0.0 of 'math'"),
    ("mix-text-weight", "reward: {kind: mix, mix: {math: lots}}\n", (), "reward.mix.math 'lots'"),
    ("mix-bool-weight", "reward: {kind: mix, mix: {math: true}}\n", (), "reward.mix weight True of 'math'"),
    ("mix-nan-weight", "reward: {kind: mix, mix: {math: .nan}}\n", (), "reward.mix.math nan"),
    ("mix-empty", "reward: {kind: mix, mix: {}}\n", (), "reward.mix {} is not valid"),
    ("mix-a-list", "reward: {kind: mix, mix: [math, format]}\n", (), "reward.mix list is not valid"),
    ("mix-a-prm", "reward: {kind: mix, mix: {prm: 1}}\n", (), "reward.mix component 'prm' is unknown"),
    ("check-timeout-zero", "reward: {kind: math, check_timeout: 0}\n", (), "reward.check_timeout 0"),
    ("checkpoint-fraction", "eval: {checkpoints: [0.5, 2]}\n", (), "eval.checkpoints value 2"),
    ("unsupported-architecture", "!model: ./falconish\n", (), "'falcon' is not in RACE's architecture table"),
    ("prm-unsupported", "reward: {kind: prm, model: ./falconish}\n", (), "reward model type 'falcon'"),
    ("empty-file", "!", (), "is empty"),
    ("malformed-yaml", "!model: [1\n", (), "not valid YAML"),
    ("config-a-list", "!- 1\n- 2\n", (), "must be a mapping"),
    ("vllm-sleep-unknown", "vllm_sleep: sometimes\n", (), "vllm_sleep 'sometimes'"),
    ("backend-unknown", "backend: tpu\n", (), "backend 'tpu'"),
    # datasets
    ("dataset-prompt-list", "task: ./rows_list.jsonl\n", (), "field 'prompt' is a list"),
    ("dataset-conflicting-answers", "task: ./rows_conflict.jsonl\n", (), "one prompt, one reference answer"),
    ("dataset-null-answer", "task: ./rows_null.jsonl\n", (), "field 'answer' is null"),
    ("dataset-bool-answer", "task: ./rows_bool.jsonl\n", (), "field 'answer' is a bool"),
    ("dataset-bad-json", "task: ./rows_badjson.jsonl\n", (), "invalid JSON"),
    ("dataset-missing-field", "task: ./rows_missing.jsonl\n", (), "field 'answer' is missing"),
    ("dataset-empty", "task: ./rows_empty.jsonl\n", (), "is empty"),
    ("dataset-absent", "task: ./absent.jsonl\n", (), "does not exist"),
    ("dataset-newline-tiny-policy", "task: ./rows_newline.jsonl\neval: {prompts: 5}\n", (),
     "(train row 6): its prompt holds the token '\\n', which 'race/tiny-arith' has no embedding for (23 rows)"),
    ("dataset-gsm8k-without-hashes", "task: ./rows_gsm8k_plain.jsonl\n", (), "field 'prompt' is missing or, for a GSM8K row, an 'answer' ending '#### N'"),
    ("dataset-gsm8k-empty-answer", "task: ./rows_gsm8k_empty.jsonl\n", (), "nothing after its last '####'"),
    ("dataset-math-no-boxed", "task: ./rows_math_unboxed.jsonl\n", (), "has no \\boxed{...} final answer"),
    ("dataset-not-utf8", "task: ./rows_latin1.jsonl\n", (), "rows_latin1.jsonl line 2: not UTF-8 text (byte 0xe9"),
    ("dataset-parquet-not-parquet", "task: ./rows_fake.parquet\n", (), "rows_fake.parquet' is not a readable Parquet"),
    ("dataset-fifo", "task: ./rows_fifo.jsonl\n", (), "rows_fifo.jsonl' is a FIFO (named pipe), not a regular file"),
    ("dataset-device", "task: /dev/zero\n", (), "'/dev/zero' is a character device, not a regular file"),
    ("dataset-over-the-cap", "task: ./rows_huge.jsonl\n", (),            # a sparse 1.1 GiB file: never read
     "is 1.07 GiB, over RACE's limit of 1 GiB (every row is held in memory): pilots use a few thousand problems, "
     "so give a random subsample"),
    # names and values past any sensible length
    ("model-name-too-long-for-a-path", "!model: " + "q" * 300 + "\n", (),
     "… (252 more characters) cannot be looked up as a path (File name too long): expected a Hugging Face id"),
    ("model-name-past-path-max", "!model: " + "q" * 5000 + "\n", (),
     "(5,000 characters) is not valid: expected at most 4096 characters: no system opens a path that long"),
    # storage URLs
    ("storage-two-ats", "", ("--storage", "postgresql://race:pa@ss@127.0.0.1:1/race"), "percent-encode"),
    ("storage-not-a-url", "", ("--storage", "foo://x"), "not an optuna storage URL"),
    ("storage-postgres-scheme", "", ("--storage", "postgres://race@127.0.0.1:1/race"), "postgresql://"),
    ("storage-unreachable", "", ("--storage", "postgresql://race:s%2Fcr%40t@127.0.0.1:1/race"), "unreachable"),
    ("storage-journal-over-the-cap", "", ("--storage", "journal:./huge.log"),    # a sparse 5 GiB journal
     "is 5.00 GiB, over RACE's limit of 1 GiB (optuna replays the whole file into memory)"),
    # CLI flags
    ("flag-grid-range", "", ("--grid", "0.3,1.4,0.5"), "ρ=1.4 is outside"),
    ("flag-budget-negative", "", ("--budget", "-3e12"), "budget '-3e12'"),
    ("flag-unknown", "", ("--bogus",), "No such option"),
    ("flag-device-name", "", ("--device", "gpu0"), "device 'gpu0'"),
    ("flag-device-cuda", "", ("--device", "cuda"), "needs a CUDA GPU"),
    ("flag-adaptive-share", "", ("--adaptive-share", "1.5"), "adaptive share 1.5"),
    ("flag-plot-suffix", "", ("--plot", "fig.txt"), "fig.txt"),
    ("flag-format", "", ("--format", "xml"), "xml"),
    ("flag-seeds-zero", "", ("--seeds", "0"), "--seeds"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewards.py").write_text(REWARDS)
    rows = {"rows_list": [{"prompt": ["1+1="], "answer": "2"}],
            "rows_conflict": [{"prompt": "1+1=", "answer": "2"}, {"prompt": "1+1=", "answer": "3"}],
            "rows_null": [{"prompt": "1+1=", "answer": None}],
            "rows_bool": [{"prompt": "1+1=", "answer": True}],
            "rows_missing": [{"prompt": "1+1="}],
            "rows_gsm8k_plain": [{"question": "What is 1+1?", "answer": "2"}],
            "rows_gsm8k_empty": [{"question": "What is 1+1?", "answer": "1+1=2\n####  "}],
            "rows_math_unboxed": [{"problem": "What is 1+1?", "solution": "It is 2."}]}
    rows["rows_newline"] = [{"prompt": f"{i}+1=" + ("\n" if i == 5 else ""), "answer": str(i + 1)} for i in range(60)]
    for name, content in rows.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in content))
    (tmp_path / "rows_badjson.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n{oops\n')
    (tmp_path / "rows_empty.jsonl").write_text("\n")
    (tmp_path / "rows_latin1.jsonl").write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "3"}\n')
    (tmp_path / "rows_fake.parquet").write_text("prompt,answer\n1+1=,2\n")
    os.mkfifo(tmp_path / "rows_fifo.jsonl")
    for name, size in (("rows_huge.jsonl", 1100 << 20), ("huge.log", 5 << 30)):    # sparse: no disk, no time
        with open(tmp_path / name, "wb") as fh:
            fh.truncate(size)
    (tmp_path / "falconish").mkdir()
    (tmp_path / "falconish" / "config.json").write_text(json.dumps({
        "model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
        "num_hidden_layers": 2, "vocab_size": 101}))
    return tmp_path


def _config_text(spec: str) -> str:
    if spec.startswith("!"):            # replaces the matching base line, or the whole config
        body = spec[1:]
        key = body.split(":", 1)[0] if ":" in body and not body.startswith("-") else None
        if key and key + ":" in BASE:
            return "".join(line + "\n" for line in BASE.splitlines() if not line.startswith(key + ":")) + body
        return body
    return BASE + spec


def _one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("case, spec, args, message", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_refused_before_compute_in_one_line_with_nothing_written(workdir, case, spec, args, message):
    (workdir / "grid.yaml").write_text(_config_text(spec))
    before = sorted(p.name for p in workdir.iterdir())
    result = CliRunner().invoke(main, ["pilot", "grid.yaml", "--out", "run", *args])     # not --quiet: still one line
    assert result.exit_code == 2, (result.exit_code, result.output)
    line = _one_error_line(result)
    assert message in line, line
    assert sorted(p.name for p in workdir.iterdir()) == before       # no run/, no race.db, nothing


DAMAGED = [
    ("results-not-json", "{not json", "not valid JSON"),
    ("results-a-list", "[1, 2]", "results"),
    ("results-no-pilots", json.dumps({"schema_version": 1, "kind": "results"}), "results"),
]


@pytest.mark.parametrize("case, content, message", DAMAGED, ids=[c[0] for c in DAMAGED])
@pytest.mark.parametrize("command", ["report", "compare"])
def test_damaged_results_files_are_one_line(workdir, case, content, message, command):
    (workdir / "results.json").write_text(content)
    (workdir / "other.json").write_text(content)
    result = CliRunner().invoke(main, [command, "results.json"] + (["other.json"] if command == "compare" else []))
    assert result.exit_code == 2, result.output
    assert message.lower() in _one_error_line(result).lower()


def test_a_missing_results_path_is_one_line(workdir):
    result = CliRunner().invoke(main, ["report", "nowhere/results.json"])
    assert result.exit_code == 2 and "nowhere" in _one_error_line(result)


# ---------------------------------------------------------------- rewards at run time

def _race(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "race", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout)


def test_a_reward_that_hangs_in_calibration_is_one_line_and_leaves_nothing(workdir):
    (workdir / "grid.yaml").write_text(BASE + "reward: {kind: custom, function: 'rewards.py:hang', timeout: 2}\n")
    t0 = time.monotonic()
    out = _race("pilot", "grid.yaml", "--out", "run", "--quiet", cwd=workdir)
    assert out.returncode == 2 and time.monotonic() - t0 < 60
    line = [x for x in out.stderr.splitlines() if x.strip()][-1]
    assert line.startswith("Error: ") and "did not return within 2 s" in line and "rewards.py:hang" in line
    assert not (workdir / "run").exists() and "Traceback" not in out.stderr


def test_a_model_that_cannot_be_loaded_is_one_line_naming_it(workdir):
    """A hub id that is not cached where the hub is out of reach (HF_HUB_OFFLINE=1 stands in for no
    network): from_pretrained's OSError becomes one line naming the model and how to give it, exit 2."""
    (workdir / "grid.yaml").write_text("model: Qwen/Qwen2.5-0.5B-Instruct\nbudget: 1e14\ngrid: [0.5, 0.62, 0.74]\nseeds: 1\n")
    out = subprocess.run([sys.executable, "-m", "race", "pilot", "grid.yaml", "--out", "run", "--quiet"], cwd=workdir,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                              "HF_HOME": str(workdir / "hf")})             # an empty cache
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("Error: model 'Qwen/Qwen2.5-0.5B-Instruct' could not be loaded (") and \
        "hf download Qwen/Qwen2.5-0.5B-Instruct" in lines[0], lines[0]
    assert not (workdir / "run").exists()


def test_a_reward_model_that_cannot_be_loaded_is_one_config_error(tmp_path):
    code = ("from race.core.errors import ConfigError\nfrom race.tasks.rewards.prm import ProcessRewardModel\n"
            "try:\n    ProcessRewardModel('Qwen/Qwen2.5-Math-PRM-7B')\nexcept ConfigError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert out.returncode == 0 and out.stdout.startswith("reward model 'Qwen/Qwen2.5-Math-PRM-7B' could not be loaded ("), \
        (out.stdout, out.stderr)


MARKED = '''
import os, sys, tempfile, time
MARKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "marker")

def _in_a_pilot():
    """Pilots are forked by a fork server; calibration runs in the race pilot process itself."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
        return b"forkserver" in fh.read()

def _taken():
    if not _in_a_pilot():
        return False
    try:
        os.rename(MARKER, MARKER + ".taken")     # one process wins
        return True
    except OSError:
        return False

_mine = None
def reward(p, c, r):
    global _mine
    if _mine is None:
        _mine = _taken()
    if _mine:
        {action}
    return 1.0 if c.split("</s>")[0].strip() == r else 0.0
'''


@pytest.mark.parametrize("action, reason", [("time.sleep(3600)", "did not return within 3 s"),
                                            ("sys.exit(0)", "raised SystemExit(0)")], ids=["hangs", "exits"])
def test_a_reward_that_fails_mid_grid_fails_its_pilot_alone(workdir, action, reason):
    """One pilot's reward hangs (or exits): that pilot fails with the reason, the others finish,
    the command ends with exit 2 and one line; re-run, only the failed pilot runs again."""
    (workdir / "marked.py").write_text(MARKED.replace("{action}", action))
    (workdir / "grid.yaml").write_text(BASE + "reward: {kind: custom, function: 'marked.py:reward', timeout: 3}\n"
                                       "eval: {prompts: 40, checkpoints: 0}\n")   # what is tested is the reward
    (workdir / "marker").write_text("")
    out = _race("pilot", "grid.yaml", "--out", "run", "--quiet", "--retries", "0", cwd=workdir, timeout=900)
    lines = [x for x in out.stderr.splitlines() if x.strip()]
    assert out.returncode == 2, out.stderr[-2000:]
    assert lines[-1].startswith("Error: 1 pilot(s) failed") and reason in lines[-1], lines[-1]
    first = json.loads((workdir / "run" / "results.json").read_text())
    done = {(p["rho_target"], p["seed"]): p for p in first["pilots"] if p["status"] == "complete"}
    assert len(done) == 2
    out = _race("pilot", "grid.yaml", "--out", "run", "--quiet", cwd=workdir, timeout=900)   # marker taken: all fine
    assert out.returncode == 0, out.stderr[-2000:]
    again = json.loads((workdir / "run" / "results.json").read_text())
    for p in again["pilots"]:
        key = (p["rho_target"], p["seed"])
        if key in done:
            assert p["evals"] == done[key]["evals"] and p["flops"] == done[key]["flops"]
    assert all(p["status"] == "complete" for p in again["pilots"]) and again["diagnosis"]


def test_a_reward_that_raises_or_returns_text_is_reported_with_its_first_error(workdir):
    """Failing on every calibration sample stops before any pilot budget, naming how often and the
    first error (a reward failing on fewer than half the samples goes on: see the training test below)."""
    from race.config.configfile import config_from_dict
    from race.engine.calibration import calibrate
    from race.tasks.rewards.base import RewardError

    for fn, why in (("boom", "RuntimeError: boom on purpose"), ("text", "TypeError: the reward returned str")):
        cfg = config_from_dict({"model": "race/tiny-arith", "budget": 2e10,
                                "reward": {"kind": "custom", "function": f"rewards.py:{fn}"}}, base_dir=str(workdir))
        with pytest.raises(RewardError) as err:
            calibrate(cfg, prompts=4, samples=2)
        assert "failed on 8 of 8 calibration samples" in str(err.value) and why in str(err.value), err.value


def test_reward_errors_in_training_and_evaluation_reach_the_report(workdir):
    """A custom reward that raises on every call: the pilot goes on (those samples score 0), and
    the diagnosis names the error count and the first message for training and for the target."""
    from dataclasses import replace

    from race.config.configfile import config_from_dict
    from race.flops.grid import plan_grid
    from race.engine.pilot import run_pilot
    from race.stats.regime import classify

    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e10, "grid": [0.5, 0.62, 0.74], "seeds": 1,
                            "lengths": {"prompt": 5.9, "completion": 3.5}, "grpo": {"max_completion_len": 6},
                            "schedule": {"lower_rho_by": "keep", "min_n_train": 2},
                            "eval": {"prompts": 20, "samples": 2, "checkpoints": 0},
                            "reward": {"kind": "custom", "function": "rewards.py:boom"}}, base_dir=str(workdir))
    schedule = plan_grid(cfg).schedules[1]
    result = run_pilot(cfg, schedule, 0)
    assert result.extra["reward_errors"] > 0 and "boom on purpose" in result.extra["reward_first_error"]
    assert result.extra["eval_errors"]["reward"]["count"] == 40
    from race.core.records import FlopBreakdown

    f = result.flops
    pilots = [replace(result, rho_target=r, flops=FlopBreakdown(f.search, f.learning * k, f.reward))
              for k, r in ((1, 0.5), (2, 0.62), (4, 0.74))]
    notes = " ".join(classify(pilots, primary_target="pass@1", n_boot=50).warnings)
    assert "the reward failed" in notes and "target 'reward' failed 120 times in held-out evaluation" in notes
    assert "RuntimeError: boom on purpose" in notes


# ---------------------------------------------------------------- hostile files (the third round)

def _default_results() -> dict:
    import gzip
    import json
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    with gzip.open(os.path.join(here, "..", "docs", "runs", "default.results.json.gz"), "rt") as fh:
        return json.load(fh)


def _report(*args):
    from click.testing import CliRunner

    from race.run.cli import main

    return CliRunner().invoke(main, ["report", *args])


def test_hostile_results_files_end_in_one_line(tmp_path):
    import gzip
    import json

    bomb = tmp_path / "bomb.json.gz"                   # 1 MB on disk, 300 MiB of spaces inside
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        for _ in range(300):
            fh.write(b" " * 2 ** 20)
        fh.write(b'{"schema_version": 1}')
    r = _report(str(bomb))
    assert r.exit_code == 2 and "decompresses past 268,435,456 bytes" in r.output and len(r.output.splitlines()) == 1
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    r = _report(str(deep))
    assert r.exit_code == 2 and "nests JSON too deeply" in r.output
    raw = _default_results()
    raw["diagnosis"]["verdicts"]["reward"]["rho_range"] = [float("nan"), float("nan")]
    (tmp_path / "nan.json").write_text(json.dumps(raw))
    r = _report(str(tmp_path / "nan.json"))
    assert r.exit_code == 2 and "rho_range [nan, nan]: expected two numbers in (0, 1)" in r.output
    raw = _default_results()
    raw["pilots"][0]["flops"] = {**raw["pilots"][0]["flops"], "learning": 1e30, "total": 1e30 + 3e11}
    (tmp_path / "huge.json").write_text(json.dumps(raw))
    r = _report(str(tmp_path / "huge.json"))
    assert r.exit_code == 2 and "a pilot spent 1e+30 FLOPs against the grid's 6e+11 per pilot" in r.output
    raw = _default_results()                  # FLOPs that no longer fit the pilot's own schedule
    f = raw["pilots"][1]["flops"]
    raw["pilots"][1]["flops"] = {**f, "search": f["search"] * 1.5, "learning": f["learning"] * 1.5,
                                 "reward": f["reward"] * 1.5, "total": f["total"] * 1.5}
    (tmp_path / "sched.json").write_text(json.dumps(raw))
    r = _report(str(tmp_path / "sched.json"))
    assert r.exit_code == 2 and "stops within a step of the budget 6e+11" in r.output, r.output
    raw = _default_results()                  # the same total, its split moved: measured ρ off the plan
    f = raw["pilots"][2]["flops"]
    raw["pilots"][2]["flops"] = {**f, "search": f["search"] + 0.5 * f["learning"], "learning": 0.5 * f["learning"],
                                 "rho": 0.5 * f["learning"] / f["total"]}
    (tmp_path / "rho.json").write_text(json.dumps(raw))
    r = _report(str(tmp_path / "rho.json"))
    assert r.exit_code == 2 and "its schedule plans" in r.output and "expected them within 0.15" in r.output, r.output
    (tmp_path / "v.json").write_text('{"schema_version": "1"}')
    r = _report(str(tmp_path / "v.json"))
    assert r.exit_code == 2 and "schema_version '1' (a string): this RACE reads the number 1" in r.output


# (what is changed in docs/runs/default.results.json.gz, what the one line says): the typed schema
# (race.stats.results.results_schema, pydantic over the record dataclasses) refuses each before any use
SCHEMA_CASES = [
    (lambda r: r["pilots"][0].update(seed="x"), "pilots.0.seed: Input should be a valid integer"),
    (lambda r: r["pilots"][3]["flops"].update(search=float("inf")), "pilots.3.flops.search: Input should be a finite number"),
    (lambda r: r["pilots"][0].update(evals={"reward": "abc"}), "pilots.0.evals.reward: Input should be a valid tuple"),
    (lambda r: r["pilots"][0].update(rho_target=1.5), "pilot ρ target 1.5 is outside (0, 1)"),
    (lambda r: r["pilots"][0].pop("flops"), "pilots.0.flops: Field required"),
    (lambda r: r["diagnosis"]["verdicts"]["reward"].update(regime="very-heavy"), "regime: Input should be 'search-heavy'"),
    (lambda r: r["diagnosis"]["verdicts"]["reward"].update(rho_range=[0.3]), "diagnosis.verdicts.reward.rho_range.1: Field required"),
    (lambda r: r.update(kind="study"), "kind: Input should be 'results'"),
    (lambda r: r.update(pilots={"a": 1}), "pilots: Input should be a valid list"),
    # numbers are JSON numbers: pydantic's lax mode would read these strings and booleans as numbers
    (lambda r: r["diagnosis"]["verdicts"]["reward"].update(rho_range=["0.3", "0.5"]),
     "diagnosis.verdicts.reward.rho_range.0 '0.3' is a string: expected a JSON number"),
    (lambda r: r["pilots"][1]["flops"].update(search=str(r["pilots"][1]["flops"]["search"])),
     "pilots.1.flops.search '"),
    (lambda r: r["pilots"][0].update(seed=True), "pilots.0.seed True is a boolean: expected a JSON number"),
    (lambda r: r["pilots"][0]["schedule"].update(steps=str(r["pilots"][0]["schedule"]["steps"])),
     "pilots.0.schedule.steps '"),
    (lambda r: r["config"].update(grid=["0.5", 0.62, 0.74, 0.85]), "config.grid.0 '0.5' is a string"),
    (lambda r: r["config"]["grpo"].update(temperature=True), "config.grpo.temperature True is a boolean"),
]


@pytest.mark.parametrize("edit,message", SCHEMA_CASES, ids=[m.split(":")[0] for _, m in SCHEMA_CASES])
def test_results_files_go_through_one_typed_schema(tmp_path, edit, message):
    import json

    raw = _default_results()
    edit(raw)
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    for args in (("report", str(tmp_path / "bad.json")), ("compare", str(tmp_path / "bad.json"), str(tmp_path / "bad.json"))):
        from click.testing import CliRunner

        from race.run.cli import main

        r = CliRunner().invoke(main, list(args))
        assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)


def test_the_results_schema_reads_what_race_wrote_before(tmp_path):
    """A field a later RACE added reads back as its default when an older file has it null or
    lacks it, and a top-level key the schema does not know is kept as metadata."""
    import json

    from race.stats.results import load_results

    raw = _default_results()
    raw["pilots"][0]["checkpoints"] = None
    raw["pilots"][1].pop("checkpoints")
    raw["diagnosis"]["verdicts"]["reward"].pop("open_side")
    raw["written_by"] = "a newer RACE"
    (tmp_path / "old.json").write_text(json.dumps(raw))
    res = load_results(str(tmp_path / "old.json"))
    assert res.pilots[0].checkpoints == () and res.pilots[1].checkpoints == ()
    assert res.diagnosis.primary.open_side is None and res.meta["written_by"] == "a newer RACE"
    assert [p.to_dict() for p in res.pilots[2:]] == raw["pilots"][2:]     # the rest round-trips exactly

def test_escape_sequences_in_a_results_file_never_reach_the_terminal(tmp_path):
    import json

    raw = _default_results()
    raw["diagnosis"]["verdicts"]["reward"]["warnings"] = ["\x1b[2J\x1b]0;owned\x07 cleared"]
    (tmp_path / "esc.json").write_text(json.dumps(raw))
    r = _report(str(tmp_path / "esc.json"))
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "\\x1b[2J\\x1b]0;owned\\x07 cleared" in r.output


def test_hostile_configs_and_storages_end_in_one_line(tmp_path):
    from click.testing import CliRunner

    from race.run.cli import main

    alias = tmp_path / "alias.yaml"
    alias.write_text("a: &a [1, 1, 1]\nb: &b [*a, *a, *a]\nmodel: race/tiny-arith\nbudget: 1e11\n")
    r = CliRunner().invoke(main, ["plan", str(alias)])
    assert r.exit_code == 2 and "uses a YAML alias (*a) at line 2" in r.output
    dup = tmp_path / "dup.yaml"
    dup.write_text("model: race/tiny-arith\nbudget: 1e11\nbudget: 2e11\n")
    r = CliRunner().invoke(main, ["plan", str(dup)])
    assert r.exit_code == 2 and "repeats the key 'budget' at line 3" in r.output
    big = tmp_path / "big.yaml"
    big.write_text("model: race/tiny-arith\n# " + "x" * (2 ** 20) + "\n")
    r = CliRunner().invoke(main, ["plan", str(big)])
    assert r.exit_code == 2 and "the limit is 1,048,576" in r.output
    r = CliRunner().invoke(main, ["report", "--storage", "journal:/dev/zero", "--study", "s"])
    assert r.exit_code == 2 and "is a character device: expected a regular file" in r.output


def test_runaway_sizes_and_misnamed_numbers_are_refused_before_work():
    import race
    from race.config.configfile import ConfigError, config_from_dict
    from race.core.errors import RaceError

    base = {"model": "race/tiny-arith", "budget": 1e11}
    with pytest.raises(ConfigError, match="seeds 1000000 is more than 64"):
        config_from_dict({**base, "seeds": 1_000_000})
    with pytest.raises(ConfigError, match="grid has 40 points, more than 32"):
        config_from_dict({**base, "grid": [round(0.02 + 0.02 * i, 2) for i in range(40)]})
    with pytest.raises(ConfigError, match="learning_rate.ref 'fast' is not a learning rate: expected a positive number like 1e-3"):
        config_from_dict({**base, "learning_rate": {"ref": "fast"}})
    with pytest.raises(ConfigError, match=r"budget 'x{169}… \(9,832 more characters\) is not a FLOP count"):
        config_from_dict({**base, "budget": "x" * 10_000})
    with pytest.raises(RaceError, match="workers -1: expected a whole number from 0"):
        race.diagnose(workers=-1, budget=1e10)


def test_sigterm_ends_in_one_line_with_143_and_init_to_an_unwritable_place_in_one_line(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "race", "pilot", "--budget", "1e10", "--out", str(tmp_path / "g")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    head = []
    for line in proc.stderr:            # the signal lands once the study is stored, whatever the machine's pace
        head.append(line)
        if "pilots to run" in line:
            break
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    err = "".join(head) + err
    assert proc.returncode == 143, err[-500:]
    assert err.strip().splitlines()[-1].startswith("Error: terminated (SIGTERM); finished pilots stay in the storage")
    from click.testing import CliRunner

    from race.run.cli import main

    target = tmp_path / "ro"
    target.mkdir()
    os.chmod(target, 0o500)
    r = CliRunner().invoke(main, ["init", "--model", "race/tiny-arith", "--task", "arithmetic-easy", "--full-run", "6e14",
                                  "--out", "/proc/race-cannot-write.yaml"])
    assert r.exit_code == 2 and "cannot write '/proc/race-cannot-write.yaml'" in r.output


def test_a_sigterm_whose_raise_was_swallowed_is_raised_again_by_the_pilot_pool():
    """CI (stop 65) sent SIGTERM while numpy's lazy ``import numpy.random`` ran; the Cython module init
    dropped the handler's raise and the grid ran to its end with exit 0. The handler also sets a flag,
    and the pool raises ``Terminated`` again at its next poll."""
    import os
    import signal
    import time

    from race.config.configfile import config_from_dict
    from race.core import signals
    from race.run.processes import PilotPool, Tick

    old = signal.getsignal(signal.SIGTERM)
    try:
        signals.on_sigterm()
        swallowed = False
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
        except KeyboardInterrupt:          # what the C code did with the first raise
            swallowed = True
        assert swallowed
        pool = PilotPool(config_from_dict({"model": "race/tiny-arith", "budget": 1e10}), workers=1, poll=0.01)
        with pytest.raises(signals.Terminated):
            next(iter(pool))
        signals.on_sigterm()               # a new command starts with the flag down
        assert next(iter(pool)) == Tick(0, 0)      # an idle pool, not stopped
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_worker_runs_a_reward_from_storage_only_by_consent(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    from race.core.errors import RaceError
    from race.tasks.rewards.base import reward_source, source_digest
    from race.run.workers import check_reward_consent
    rw = tmp_path / "myreward.py"
    rw.write_text("open(__file__ + '.imported', 'w').close()\ndef score(p, c, r):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    assert reward_source("myreward:score") == str(rw) and reward_source(f"{rw}:score") == str(rw)
    assert not (tmp_path / "myreward.py.imported").exists()          # found, never imported
    info = SimpleNamespace(run_config={"reward": {"kind": "custom", "function": "myreward:score"}},
                           meta={"reward_source": {"function": "myreward:score", "file": str(rw),
                                                   "sha256": source_digest(str(rw))}})
    check_reward_consent(info)                                       # the same file: runs, and says which
    assert f"here {rw} (sha256 {source_digest(str(rw))[:16]}" in capsys.readouterr().err
    rw.write_text("import os\ndef score(p, c, r):\n    return 0.0\n")  # storage and file now disagree
    with pytest.raises(RaceError, match="byte for byte; copy it, or pass --trust-reward"):
        check_reward_consent(info, quiet=True)
    check_reward_consent(info, trust_reward=True, quiet=True)
    with pytest.raises(RaceError, match="the coordinator recorded no hash"):
        check_reward_consent(SimpleNamespace(run_config=info.run_config, meta={}), quiet=True)
    check_reward_consent(SimpleNamespace(run_config={"reward": {"kind": "sparse"}}, meta={}), quiet=True)


@pytest.mark.parametrize("body", ["raise RuntimeError('boom')", "return None", "return 1e308", "return 'x'",
                                  "return float('nan')"])
def test_a_reward_broken_on_every_call_stops_at_calibration(tmp_path, body):
    from race.config.configfile import config_from_dict
    from race.engine.calibration import calibrate
    from race.tasks.rewards.base import RewardError

    rw = tmp_path / "broken.py"
    rw.write_text(f"def score(prompt, completion, reference):\n    {body}\n")
    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e10, "task": "arithmetic-easy",
                            "reward": {"kind": "custom", "function": f"{rw}:score"},
                            "grpo": {"max_completion_len": 6}})
    with pytest.raises(RewardError, match=r"the reward failed on 64 of 64 calibration samples .* before any pilot"):
        calibrate(cfg, prompts=16)


def test_a_full_disk_is_named_not_hidden_behind_the_storage_wrapper():
    """optuna wraps a failed commit in StorageInternalError ("… e.g. exceeding max length"); the
    driver's cause in its chain (sqlite: database or disk is full) is what the one line names."""
    from race.run.store.engine import first_line

    assert first_line(_disk_full(), "sqlite:///x.db") == "database or disk is full"
    plain = ValueError("postgresql://u:secret@h/db refused")
    assert "secret" not in first_line(plain, "postgresql://u:secret@h/db")


def test_a_reward_timeout_kills_the_rewards_setsid_children_too(tmp_path):
    """A reward that starts a child in its own session, then hangs: the timeout's one line, and the
    child is gone with it (race.tasks.rewards.isolated.kill_tree), not left running after race."""
    from race.tasks.rewards.isolated import IsolatedReward, RewardFailed

    pidfile = tmp_path / "child.pid"
    rw = tmp_path / "spawner.py"
    rw.write_text("import subprocess, sys, time\n"
                  "def score(prompt, completion, reference):\n"
                  "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)'], "
                  "start_new_session=True)\n"
                  f"    open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
                  "    time.sleep(60)\n")
    r = IsolatedReward(f"{rw}:score", timeout=3).start()
    with pytest.raises(RewardFailed, match="did not return within 3 s"):
        r.score_batch(["p"], ["c"], ["r"])
    pid = int(pidfile.read_text())
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        raise AssertionError(f"the reward's setsid child {pid} outlived it")


def _limited(*args, cwd, seconds=60):
    """``race ARGS`` in a child under ``ulimit -v 2000000`` (RLIMIT_AS ≈ 1.9 GiB), as issue 36 asks."""
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (2_000_000 * 1024, 2_000_000 * 1024))

    return subprocess.run([sys.executable, "-m", "race", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=seconds, preexec_fn=cap, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_memory_bombs_end_in_one_line_under_a_memory_limit(tmp_path):
    """The memory cases of issue 36, each in a process capped at 2,000,000 KiB of address space: one
    `Error:` line, exit 2, within a minute (none grows until the cap kills it)."""
    import gzip

    bomb = tmp_path / "bomb.json.gz"                      # 1 GiB of spaces inside, ~1 MB on disk
    with gzip.open(bomb, "wb", compresslevel=9) as fh:
        for _ in range(1024):
            fh.write(b" " * 2 ** 20)
        fh.write(b'{"schema_version": 1}')
    nest = "a0: &a0 [race/tiny-arith, race/tiny-arith]\n" + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
        for i in range(1, 9))
    (tmp_path / "models.yaml").write_text(nest + "model: race/tiny-arith\nbudget: 1e11\nmodels: *a8\n")
    (tmp_path / "seeds.yaml").write_text("model: race/tiny-arith\nbudget: 1e11\nseeds: 1000000\n")
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    with open(tmp_path / "huge.log", "wb") as fh:          # a sparse 5 GiB journal: optuna would read it all
        fh.truncate(5 << 30)
    cases = [(("report", str(bomb)), "decompresses past"),
             (("report", "--storage", f"journal:{tmp_path / 'huge.log'}", "--study", "s"), "over RACE's limit of 1 GiB"),
             (("report", "--storage", "journal:/dev/zero", "--study", "s"), "character device"),
             (("report", "--storage", "journal:/dev/full", "--study", "s"), "character device"),
             (("plan", "models.yaml"), "YAML alias"),
             (("plan", "seeds.yaml"), "seeds 1000000 is more than 64"),
             (("report", "deep.json"), "nests JSON too deeply")]
    for args, message in cases:
        r = _limited(*args, cwd=tmp_path)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0] and len(lines[0]) < 1000, (args, r.stderr[-500:])


# ---------------------------------------------------------------- issue 36, the audit's second pass

def _disk_full() -> Exception:
    """What a full disk raises mid-commit: optuna's StorageInternalError ("… e.g. exceeding max
    length"), its cause sqlite's own error."""
    import sqlite3

    from optuna.exceptions import StorageInternalError

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as cause:
            raise StorageInternalError("An exception is raised during the commit. This typically happens due to "
                                       "invalid data in the commit, e.g. exceeding max length.") from cause
    except StorageInternalError as e:
        return e


FULL_DISK = ("cannot be written: the disk that holds it is full (database or disk is full): free space there (or give "
             "another --storage), then run the same command again; finished pilots stay in the storage")


def test_a_full_disk_while_the_study_is_created_is_named_and_leaves_no_half_study(tmp_path, monkeypatch):
    import optuna

    from race.run.store import Store, StoreError

    url = f"sqlite:///{tmp_path}/race.db"
    st = Store(url, "grid")
    real = optuna.study.Study.set_user_attr

    def fills_up(self, key, value):
        if key == "race:classify":              # a few attributes in: the disk fills
            raise _disk_full()
        return real(self, key, value)

    monkeypatch.setattr(optuna.study.Study, "set_user_attr", fills_up)
    with pytest.raises(StoreError) as err:
        st.create(config={"grid": [0.5]}, run_config={"budget": 1e10, "grid": [0.5, 0.6, 0.7], "seeds": 1}, plan={},
                  classify={}, meta={}, adaptive=None)
    assert str(err.value) == f"storage {url!r} {FULL_DISK}"
    monkeypatch.undo()
    assert not st.exists()                      # the half-made study is gone: the same command starts clean


def test_a_full_disk_reaches_the_user_as_one_line_and_exit_2(tmp_path, monkeypatch):
    """Through the Store (``race worker``: Store.load) and, for a storage call made anywhere else,
    through the CLI's own net: one line naming the full disk and the storage, exit 2, no traceback."""
    import optuna

    import race.run.workers

    url = f"sqlite:///{tmp_path}/race.db"
    (tmp_path / "race.db").touch()              # a worker joins a storage that exists (an empty SQLite file is one)
    monkeypatch.setattr(optuna, "load_study", lambda **kw: (_ for _ in ()).throw(_disk_full()))
    r = CliRunner().invoke(main, ["worker", "--storage", url, "--study", "grid"])
    assert r.exit_code == 2 and _one_error_line(r) == f"Error: storage {url!r} {FULL_DISK}"
    monkeypatch.setattr(race.run.workers, "run_worker", lambda *a, **kw: (_ for _ in ()).throw(_disk_full()))
    r = CliRunner().invoke(main, ["worker", "--storage", url, "--study", "grid"])
    assert r.exit_code == 2 and _one_error_line(r) == f"Error: storage {url!r} {FULL_DISK}"


def test_a_results_file_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    import errno

    from race.stats.results import Results, ResultsError, save_results

    def no_space(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    (tmp_path / "results.json").write_text("{}")
    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(ResultsError, match="cannot write .*results.json': No space left on device: the disk that holds "
                                           "it is full; free space there, then run the same command again"):
        save_results(str(tmp_path), Results(pilots=()))
    assert os.listdir(tmp_path) == ["results.json"] and (tmp_path / "results.json").read_text() == "{}"


def test_a_study_left_unready_is_removed_only_when_it_holds_nothing(tmp_path):
    import optuna

    from race.run.store import Store

    url = f"sqlite:///{tmp_path}/race.db"
    optuna.create_study(study_name="bare", storage=url)
    ready = optuna.create_study(study_name="ready", storage=url)
    ready.set_user_attr("race:ready", True)
    assert Store(url, "bare").remove_unready() and not Store(url, "bare").exists()
    assert not Store(url, "ready").remove_unready() and Store(url, "ready").exists()


def _tampered(tmp_path, edit) -> str:
    raw = _default_results()
    raw["plan"] = {}                            # as docs/runs keep them: no calibrated lengths to plan with
    for p in raw["pilots"]:
        if p["rho_target"] == 0.74:
            edit(p["schedule"])
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(raw))
    return str(path)


def test_a_tampered_schedule_without_a_plan_is_refused_before_calibration(tmp_path):
    """Issue 36's case: the ρ=0.74 pilots' steps + 1 in a file that carries no plan. Refused in one
    line before calibration (seconds, not the ~24 s calibration takes) and before any storage."""
    path = _tampered(tmp_path, lambda s: s.update(steps=s["steps"] + 1))
    t0 = time.monotonic()
    r = CliRunner().invoke(main, ["pilot", "--seeds", "4", "--import-pilots", path, "--out", str(tmp_path / "tamp")])
    assert r.exit_code == 2 and time.monotonic() - t0 < 15
    line = _one_error_line(r)
    assert "pilot ρ=0.74 seed 0 in" in line and "ran a schedule that does not add up" in line
    assert "flops_per_step" in line
    assert not (tmp_path / "tamp").exists()


def _scale(s, k):
    s.update(steps=s["steps"] + k, flops={x: v * (s["steps"] + k) / s["steps"] for x, v in s["flops"].items()})


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(steps=s["steps"] + 1), "steps × flops_per_step."),
    (lambda s: _scale(s, 40), "the budget 6e+11 buys"),
    (lambda s: s.update(learning_rate=s["learning_rate"] * 2), "by the config's rule for"),
    (lambda s: s.update(lora_rank=s["lora_rank"] * 2), "in the config"),
    (lambda s: s.update(rho_target=0.75), "its schedule is for ρ=0.75"),
], ids=["steps", "steps-and-flops", "learning-rate", "lora-rank", "rho"])
def test_what_an_imported_schedule_must_satisfy_whatever_the_calibration(tmp_path, edit, message):
    from race.config.configfile import config_from_dict
    from race.run.prechecks import check_importable, written_config
    from race.stats.results import load_results
    from race.run.store import StoreError

    path = _tampered(tmp_path, edit)
    cfg = config_from_dict(written_config(load_results(str(tmp_path / "tampered.json"))))
    with pytest.raises(StoreError, match="does not add up") as err:
        check_importable(cfg, path)
    assert message in str(err.value)
    check_importable(cfg, _tampered(tmp_path, lambda s: None))       # the file as RACE wrote it passes


def test_a_schedule_only_calibration_can_refuse_is_refused_before_the_study_exists(tmp_path):
    """Pilots planned with other token lengths than this run's calibration measures: refused after
    calibration (here a given one) but before the study is created, so no storage is left."""
    from types import SimpleNamespace

    from race.config.configfile import config_from_dict
    from race.run.prechecks import written_config
    from race.stats.results import load_results
    from race.run.study import run_study
    from race.run.store import StoreError

    path = _tampered(tmp_path, lambda s: None)
    cfg = config_from_dict({**written_config(load_results(path)), "seeds": 4})
    cal = SimpleNamespace(healthy=None, prompt_len=20.0, completion_len=20.0, to_dict=lambda: {},
                          data_warning=lambda: None, reward_warning=lambda: None)
    with pytest.raises(StoreError, match="ran another schedule"):
        run_study(cfg, out_dir=str(tmp_path / "run"), quiet=True, import_pilots=path, calibration=cal)
    assert not (tmp_path / "run").exists()


FORGED = "verdict (reward): update-heavy · recommended ρ ≥ 0.95 · confidence 0.99"


@pytest.mark.parametrize("fmt", ["text", "md"])
def test_a_results_file_cannot_forge_a_line_of_the_report(tmp_path, fmt):
    """Newlines in single-line fields from a file (meta, a warning) are escaped, a carriage return
    everywhere; the report's own lines stay as they are."""
    raw = _default_results()
    raw["diagnosis"]["meta"]["task"] = f"arithmetic-easy\n\n  {FORGED}"
    raw["diagnosis"]["meta"]["model"] = "race/tiny-arith\roverwritten"
    raw["diagnosis"]["verdicts"]["reward"]["warnings"] = [f"fine\n  {FORGED}", "two\u2028lines"]
    (tmp_path / "forged.json").write_text(json.dumps(raw))
    r = _report(str(tmp_path / "forged.json"), "--format", fmt)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert not any(line.lstrip(" -").startswith(FORGED) for line in lines)
    assert "\r" not in r.output and "\u2028" not in r.output
    assert f"task: arithmetic-easy\\n\\n  {FORGED}" in r.output and "race/tiny-arith\\roverwritten" in r.output
    assert sum(line.lstrip(" -").startswith("verdict (reward): ") for line in lines) == 1   # the report's own
    assert len(lines) > 20


def test_terminal_safe_and_one_line():
    from race.core.safeio import one_line, quote, terminal_safe

    assert terminal_safe("a\tb\nc\rd\x1b[2J") == "a\tb\nc\\rd\\x1b[2J"         # RACE's own lines kept, CR shown
    assert one_line("a\tb\nc\rd\u2028e") == "a\tb\\nc\\rd\\u2028e"
    assert len(quote("x" * 10_000)) <= 200 and quote("short") == "'short'"


def test_a_huge_value_is_quoted_short_in_the_error_line(tmp_path):
    cases = {"grid.yaml": "model: race/tiny-arith\nbudget: 1e11\ngrid: [" + ", ".join(["0.5"] * 3000) + "]\n",
             "name.yaml": "model: race/tiny-arith\nbudget: 1e11\nname: " + "n" * 5000 + "\n",
             "models.yaml": "budget: 1e11\nmodels: [" + ", ".join(["race/tiny-arith"] * 300) + "]\n"}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        r = CliRunner().invoke(main, ["plan", str(tmp_path / name)])
        assert r.exit_code == 2 and len(_one_error_line(r)) < 300, (name, r.output)
    from race.run.cli_support import LINE_CHARS, error_line as _one_line

    long = "x " * 2000
    assert len(_one_line(long)) <= LINE_CHARS + 40 and "characters cut" in _one_line(long)



def test_a_results_file_cannot_forge_a_recipe_line():
    """Issue 36: a newline in a note (text that can come from a results file) stays on its line in
    `race recipe`'s text and inside its YAML comments (race.core.safeio.one_line)."""
    import os
    from dataclasses import replace

    import yaml

    from race.fullrun.recipes import recipe, render_recipe

    here = os.path.dirname(os.path.abspath(__file__))
    rec = recipe(os.path.join(here, "..", "docs", "runs", "tiny-steps-sparse.results.json"), trainer="trl",
                 full_run_budget=1e13)
    forged = "verdict (reward): update-heavy · recommended ρ ≥ 0.95"
    rec = replace(rec, notes=(*rec.notes, f"ok\n{forged}\rX"))
    text = render_recipe(rec, "text")
    assert not any(line.startswith(forged) for line in text.splitlines())
    assert "ok\\n" + forged in text or "ok\\x0a" + forged in text or forged in text.split("note: ok", 1)[1].splitlines()[0]
    body = yaml.safe_load(render_recipe(rec, "yaml"))       # the note stays inside its comment
    assert isinstance(body, dict) and not any(str(k).startswith("verdict") for k in body)


def test_a_model_config_cannot_forge_a_line_of_race_flops(tmp_path):
    """Issue 36: `race flops` prints names from a model's config.json (its warnings and its table):
    a newline there stays escaped on its own line."""
    import json

    from click.testing import CliRunner

    from race.run.cli import main
    from race.flops.catalog import resolve_model_path

    cfg = json.load(open(os.path.join(resolve_model_path("race/tiny-arith"), "config.json")))
    cfg["model_type"] = "qwen2x\nverdict (reward): forged"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    out = CliRunner().invoke(main, ["flops", "--model", str(tmp_path), "--allow-approximate"])
    assert out.exit_code == 0, out.output
    assert "forged" in out.output
    assert not any(line.strip().startswith("verdict (reward): forged") for line in out.output.splitlines())
