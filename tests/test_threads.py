"""Torch threads per pilot process (race.run.processes.pilot_threads) and the busy-machine warning."""
import os

from race.run import processes as runner


def test_threads_share_the_cores_and_omp_num_threads_wins(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert runner.pilot_threads(2, "cpu") == 4 and runner.pilot_threads(16, "cpu") == 1
    assert runner.pilot_threads(1, "cuda:0") == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runner.pilot_threads(2, "cpu") == 3


def test_a_busy_machine_with_multithreaded_pilots_gets_one_line(monkeypatch):
    """Load ≥ half the cores and ≥ 2 threads per pilot → the warning names the load and the fix;
    a quiet machine, one thread per pilot, or a GPU → nothing."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (4.2, 4.0, 3.0))
    w = runner.busy_machine_warning(1, "cpu")
    assert w and "load average 4.2 on 2 cores" in w and "2 threads" in w and "OMP_NUM_THREADS=1" in w
    assert runner.busy_machine_warning(2, "cpu") is None          # one thread each
    assert runner.busy_machine_warning(1, "cuda:0") is None
    monkeypatch.setattr(os, "getloadavg", lambda: (0.3, 0.2, 0.1))
    assert runner.busy_machine_warning(1, "cpu") is None
