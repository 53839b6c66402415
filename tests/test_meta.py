"""The README's test command is the one CI runs."""
import os
import re

from conftest import ROOT


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    cmds = re.findall(r"^(python -m pytest .*)$", readme, flags=re.M)
    assert len(cmds) == 1, cmds
    assert cmds[0] in ci.splitlines()
