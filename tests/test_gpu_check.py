"""bench/gpu_check.py in its reduced CPU mode: the same engine, a tiny random Qwen2, seconds."""
import json
import subprocess
import sys

from conftest import ROOT


def test_gpu_check_reduced_mode_runs_on_cpu(tmp_path):
    out = tmp_path / "gc.json"
    code = ("import sys; sys.path.insert(0, 'bench'); import gpu_check\n"
            f"gpu_check.main(['--cpu', '--steps', '1', '--json', {str(out)!r}])\n"
            "print('HEAVY', [m for m in ('vllm', 'optuna') if m in sys.modules])\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "HEAVY []" in r.stdout                    # the H200 machine has neither
    assert "rollout tok/s" in r.stdout and "update MFU" in r.stdout
    data = json.loads(out.read_text())
    row, group = data["rows"]                         # the solo pilot, then a lockstep group of 3 seeds
    assert (row["engine"], group["engine"]) == ("solo", "lockstep (3 seeds)")
    assert group["rollout_tok_s"] > 0 and group["update_tok_s"] > 0 and group["learning_flops"] > 0
    # three seeds' tokens in the group's timed step
    assert round(group["rollout_tok_s"] * group["rollout_s"], 6) <= 3 * 2 * 4 * 8   # tokens/s × s: float rounding
    assert data["peak_flop_s"] > 1e8
    assert row["rollout_s"] > 0 and row["update_s"] > 0
    assert 0 < row["rollout_tok_s"] and 0 < row["update_tok_s"]
    # 2 prompts × 4 rollouts of ≤ 8 tokens in the one timed step
    assert round(row["rollout_tok_s"] * row["rollout_s"], 6) <= 2 * 4 * 8
    assert row["learning_flops"] > 0 and row["search_flops"] > 0
    assert 0 < row["update_mfu"] < 2
    assert row["peak_mem_measured"] is None and row["peak_mem_plan"] > 0


def test_gpu_check_keeps_the_rows_of_models_that_ran_when_one_fails(tmp_path, monkeypatch):
    """A model that raises is reported by name; the other model's row is still printed and saved."""
    import os
    import sys

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check

    real, calls = gpu_check.check_model, []

    def flaky(name, *a, **kw):
        calls.append(name)
        if len(calls) == 1:
            raise RuntimeError("CUDA out of memory (test double)")
        return real(name, *a, **kw)

    monkeypatch.setattr(gpu_check, "check_model", flaky)
    out = tmp_path / "gc.json"
    assert gpu_check.main(["--cpu", "--models", "race/tiny-arith", "race/tiny-arith", "--steps", "1",
                           "--lockstep", "0", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert calls == ["race/tiny-arith", "race/tiny-arith"]
    assert [r["model"] for r in data["rows"]] == ["race/tiny-arith"]
    assert data["failed"] == [{"model": "race/tiny-arith", "error": "RuntimeError: CUDA out of memory (test double)"}]
    assert data["env"]["torch"] and data["env"]["command"].startswith("PYTHONPATH=. python bench/gpu_check.py --cpu")
