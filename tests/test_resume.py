"""Real ``race pilot`` processes, really killed: resume after kill -9, a pilot killed like the
OOM killer does, and the adaptive grid growing into the full one — all on the default
storage (SQLite in the output folder)."""
import json
import os
import signal
import subprocess

import pytest

from conftest import ROOT, untimed, untimed_diagnosis
from pilot_cli import kill_leftovers, by_state, midway, open_study, race, read, start, wait_for, write_config
from race.run.adaptive import allocate_seeds
from race.run.store import key_of


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    yield
    kill_leftovers()


def _results(out):
    return json.load(open(os.path.join(out, "results.json")))


def test_kill_9_mid_grid_then_resume(tmp_path):
    """kill -9 of the whole `race pilot` process group with one pilot finished and one mid-way;
    the same command again runs only the missing pilots, and its diagnosis (and every pilot)
    equals that of an uninterrupted run; `race report --storage` reproduces it."""
    cfg = write_config(tmp_path / "c.yaml", name="resume", budget=2.4e11)  # pilots long enough (≈ 6 s) to catch mid-way on a quiet machine
    out = tmp_path / "run"
    args = ["pilot", cfg, "--out", out, "--heartbeat", "2"]       # two pilots at a time
    proc = start(args, tmp_path / "first")
    url = f"sqlite:///{out}/race.db"
    store = open_study(url, "resume", proc=proc)
    wait_for(lambda: by_state(store, "COMPLETE") and any(midway(t) for t in store.trials()), procs=[proc])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    finished = {key_of(t): t.number for t in by_state(store, "COMPLETE")}
    cut = [key_of(t) for t in store.trials() if midway(t)]
    assert finished and cut

    again = subprocess.run(race(*args), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"resuming, {len(finished)} pilots complete, {3 - len(finished)} to run" in again.stderr
    complete = by_state(store, "COMPLETE")
    assert sorted(key_of(t) for t in complete) == [(0.6, 0), (0.75, 0), (0.92, 0)]   # each exactly once
    for t in complete:
        if key_of(t) in finished:
            assert t.number == finished[key_of(t)]          # a finished pilot is never re-run
    dead = [t for t in by_state(store, "FAIL") if key_of(t) in cut]
    assert dead and all("died" in t.user_attrs["error"] and t.user_attrs["stale"] for t in dead)

    ref = subprocess.run(race("pilot", cfg, "--out", tmp_path / "ref"), capture_output=True,
                         text=True, cwd=ROOT, timeout=600)
    assert ref.returncode == 0, ref.stderr
    assert untimed(again.stdout) == untimed(ref.stdout) and "RACE diagnosis" in ref.stdout
    a, b = _results(out), _results(tmp_path / "ref")
    for key in ("evals", "curve", "flops"):
        assert [p[key] for p in a["pilots"]] == [p[key] for p in b["pilots"]]
    assert untimed_diagnosis(a["diagnosis"]) == untimed_diagnosis(b["diagnosis"])
    rep = subprocess.run(race("report", "--storage", url, "--study", "resume"), capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert rep.returncode == 0 and rep.stdout == again.stdout     # the same pilots: timing included
    refit = subprocess.run(race("report", "--storage", url, "--study", "resume", "--refit"), capture_output=True,
                           text=True, cwd=ROOT, timeout=120)
    assert refit.stdout == again.stdout


def test_pilot_killed_like_the_oom_killer(tmp_path):
    """SIGKILL to one pilot process (what the kernel's OOM killer sends): the grid goes on, the
    command ends with one line naming the pilot (exit 2), every finished pilot is kept, and the
    same command again runs only that pilot."""
    cfg = write_config(tmp_path / "c.yaml", name="oom", budget=4.8e11)   # a pilot runs long enough (≈ 12 s) to be caught in its first half
    out = tmp_path / "run"
    args = ["pilot", cfg, "--out", out, "--retries", "0", "--heartbeat", "2"]
    proc = start(args, tmp_path / "first")
    store = open_study(f"sqlite:///{out}/race.db", "oom", proc=proc)

    def kill_one():   # a pilot in its first half, whose process is alive (not a zombie that already reported)
        for t in store.trials():
            pid = t.user_attrs.get("pilot_pid")
            if midway(t) and pid and t.user_attrs["progress"]["flops"] < 2.4e11 and _alive(pid):
                try:
                    os.kill(t.user_attrs["pilot_pid"], signal.SIGKILL)
                    return t
                except ProcessLookupError:        # it finished a moment ago: take another
                    pass
        return None

    victim = wait_for(lambda: by_state(store, "COMPLETE") and kill_one(), procs=[proc])
    assert proc.wait(timeout=600) == 2
    stdout, stderr = read(tmp_path / "first")
    last = stderr.strip().splitlines()[-1]
    rho = key_of(victim)[0]
    assert last.startswith(f"Error: 1 pilot(s) failed — ρ={rho:g} seed 0: pilot process killed by signal 9 "
                           "(out of memory?); 2 finished pilots are kept in sqlite:///"), last
    assert "Traceback" not in stderr
    assert sorted(key_of(t) for t in by_state(store, "COMPLETE")) == sorted(
        k for k in [(0.6, 0), (0.75, 0), (0.92, 0)] if k[0] != rho)
    saved = _results(out)
    assert sorted(p["status"] for p in saved["pilots"]) == ["complete", "complete", "failed"]

    again = subprocess.run(race(*args), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "resuming, 2 pilots complete, 1 to run" in again.stderr
    assert "RACE diagnosis" in again.stdout
    assert len(by_state(store, "COMPLETE")) == 3


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_adaptive_grid_then_the_full_grid(tmp_path):
    """--adaptive runs seed 0 everywhere and one second seed where the informative policy puts it
    (from the seed-0 scores); the plain command on the same study then runs just the missing
    pilots of the full grid."""
    cfg = write_config(tmp_path / "c.yaml", name="adapt", seeds=2, budget=1e10)
    out = tmp_path / "run"
    first = subprocess.run(race("pilot", cfg, "--out", out, "--adaptive"), capture_output=True, text=True,
                           cwd=ROOT, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "RACE diagnosis" in first.stdout and "adaptive" in first.stderr
    assert "adaptive: informative, 4 of 6 pilots" in first.stdout           # the report says what ran
    saved = _results(out)
    seed0 = {p["rho_target"]: sum(p["evals"]["reward"]) / len(p["evals"]["reward"])
             for p in saved["pilots"] if p["seed"] == 0}
    n = allocate_seeds(sorted(seed0), seed0, extra=1, max_seeds=2)
    (second,) = [r for r in n if n[r] == 2]
    assert sorted((p["rho_target"], p["seed"]) for p in saved["pilots"]) == sorted(
        [(0.6, 0), (0.75, 0), (0.92, 0), (second, 1)])
    assert saved["adaptive"] == "informative"
    store = open_study(f"sqlite:///{out}/race.db", "adapt")
    assert store.study.user_attrs["race:adaptive"]["share"] == 0.5
    # a larger share on the same study adds pilots (⌊0.84 × 6⌋ = 5), the next greedy seed
    more = subprocess.run(race("pilot", cfg, "--out", out, "--adaptive-share", "0.84"), capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert more.returncode == 0, more.stderr
    assert "resuming, 4 pilots complete, 1 to run" in more.stderr and "informative, 5 of 6 pilots" in more.stdout
    assert store.study.user_attrs["race:adaptive"]["share"] == 0.84
    n3 = allocate_seeds(sorted(seed0), seed0, extra=2, max_seeds=2)
    assert sorted((p["rho_target"], p["seed"]) for p in _results(out)["pilots"]) == sorted(
        [(r, 0) for r in seed0] + [(r, 1) for r in n3 if n3[r] == 2])
    kept = {key_of(t): t.number for t in by_state(store, "COMPLETE")}
    full = subprocess.run(race("pilot", cfg, "--out", out), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert full.returncode == 0, full.stderr
    assert "resuming, 5 pilots complete, 1 to run" in full.stderr
    done = {key_of(t): t.number for t in by_state(store, "COMPLETE")}
    assert len(done) == 6 and all(done[k] == n for k, n in kept.items())
    assert len(_results(out)["pilots"]) == 6


def _small_grid(tmp_path, evals: str = "prompts: 30, samples: 2, checkpoints: 3"):
    """A 3-point, 1-seed grid of the tiny arithmetic policy at 1e10 FLOPs in ``tmp_path/c.yaml``, and a
    function running ``python -m race ARGS`` there (this checkout on PYTHONPATH)."""
    import subprocess
    import sys

    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: race/tiny-arith\nbudget: 1e10\ngrid: [0.5, 0.62, 0.74]\nseeds: 1\n"
                   "lengths: {prompt: 5.9, completion: 3.5}\ngrpo: {max_completion_len: 6}\n"
                   "schedule: {lower_rho_by: keep, min_n_train: 2}\neval: {" + evals + "}\n")
    env = {**os.environ, "PYTHONPATH": ROOT}

    def run(*args):
        return subprocess.run([sys.executable, "-m", "race", *args], capture_output=True, text=True, cwd=tmp_path,
                              env=env, timeout=600)
    return cfg, run


def test_finished_pilots_are_imported_from_a_results_file_into_a_new_storage(tmp_path):
    """A grid whose storage is lost resumes from its results.json: the pilots there are recorded as
    complete in the new study and only the missing one runs; another config is one line, exit 2."""
    cfg, race = _small_grid(tmp_path)
    first = race("pilot", str(cfg), "--out", "a", "--quiet", "--format", "json")
    assert first.returncode == 0, first.stderr[-2000:]
    full = json.loads((tmp_path / "a" / "results.json").read_text())
    partial = {**full, "pilots": [p for p in full["pilots"] if p["rho_target"] != 0.62], "diagnosis": None}
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    second = race("pilot", str(cfg), "--out", "b", "--import-pilots", "partial.json", "--format", "json")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "imported 2 finished pilot(s)" in second.stderr and "1 pilots to run" in second.stderr
    again = json.loads((tmp_path / "b" / "results.json").read_text())
    assert [p["evals"] for p in again["pilots"]] == [p["evals"] for p in full["pilots"]]   # the rerun one too
    assert again["diagnosis"]["regime"] == full["diagnosis"]["regime"]
    other = tmp_path / "d.yaml"
    other.write_text(cfg.read_text().replace("budget: 1e10", "budget: 2e10"))
    refused = race("pilot", str(other), "--out", "c", "--import-pilots", "partial.json", "--quiet")
    assert refused.returncode == 2 and "ran with another config (budget" in refused.stderr
    # a larger grid (one more seed per point) takes the finished pilots and runs only the new seed
    bigger = tmp_path / "e.yaml"
    bigger.write_text(cfg.read_text().replace("seeds: 1", "seeds: 2"))
    tampered = {**full, "pilots": [dict(p, schedule={**p["schedule"], "steps": p["schedule"]["steps"] + 1})
                                   if p["rho_target"] == 0.74 else p for p in full["pilots"]]}
    (tmp_path / "tampered.json").write_text(json.dumps(tampered))
    odd = race("pilot", str(bigger), "--out", "f", "--import-pilots", "tampered.json", "--quiet")
    assert odd.returncode == 2 and "ρ=0.74 seed 0" in odd.stderr and "ran another schedule (steps" in odd.stderr
    assert not (tmp_path / "f").exists()           # refused before calibration: no study, no folder written
    grown = race("pilot", str(bigger), "--out", "e", "--import-pilots", "a/results.json", "--format", "json")
    assert grown.returncode == 0, grown.stderr[-2000:]
    assert "imported 3 finished pilot(s)" in grown.stderr and "3 pilots to run" in grown.stderr
    wide = json.loads((tmp_path / "e" / "results.json").read_text())
    assert sorted((p["rho_target"], p["seed"]) for p in wide["pilots"]) == [(r, s) for r in (0.5, 0.62, 0.74)
                                                                          for s in (0, 1)]
    assert [p["evals"] for p in wide["pilots"] if p["seed"] == 0] == [p["evals"] for p in full["pilots"]]


def test_a_resumed_grid_keeps_the_length_probe_stored_in_its_results(tmp_path):
    """`race probe DIR` stores its record in DIR/results.json; `race pilot` on the same DIR again (a resume
    with nothing left to run) rewrites the file from its storage and must keep that record."""
    cfg, race_ = _small_grid(tmp_path, evals="prompts: 20, samples: 2, checkpoints: 2")
    first = race_("pilot", str(cfg), "--out", "a", "--quiet", "--format", "json")
    assert first.returncode == 0, first.stderr[-2000:]
    path = tmp_path / "a" / "results.json"
    raw = json.loads(path.read_text())
    probe = {"full_run_budget": 1e11, "learning_rate": 1e-3, "steps": 12, "covers": 1.0, "status": "held",
             "curve": [{"fraction": 0.0, "step": 0, "mean": 0.3}, {"fraction": 1.0, "step": 12, "mean": 0.35}]}
    path.write_text(json.dumps({**raw, "probes": [probe]}))
    again = race_("pilot", str(cfg), "--out", "a", "--quiet", "--format", "json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(path.read_text())["probes"] == [probe]
