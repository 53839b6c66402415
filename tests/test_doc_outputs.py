"""Every docs page block that shows a ``race report`` of a committed results file (a fenced block whose
first line is ``$ race report docs/runs/…``) shows what that command prints today.

A line of ``…`` stands for lines left out; every other quoted line must be a line of the output, in
order. The README's report block is checked the same way in test_meta.py. These commands read committed
files only, so they run in a second.
"""
import glob
import os
import re
import shlex

import pytest
from click.testing import CliRunner

from conftest import ROOT

PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")) + glob.glob(os.path.join(ROOT, "docs", "*", "*.md")))


def _quoted_reports() -> list[tuple[str, list[str], list[str]]]:
    found = []
    for page in PAGES:
        text = open(page, encoding="utf-8").read()
        for block in re.findall(r"^```[a-z]*\n(\$ race report docs/runs/.*?)^```", text, flags=re.M | re.S):
            first, *shown = block.rstrip("\n").splitlines()
            found.append((os.path.relpath(page, ROOT), shlex.split(first[2:])[1:], shown))
    return found


def test_some_page_quotes_a_report():
    assert any(page == os.path.join("docs", "drift.md") for page, _, _ in _quoted_reports())


@pytest.mark.parametrize("page,args,shown", _quoted_reports(), ids=lambda v: v if isinstance(v, str) else None)
def test_a_quoted_report_is_what_the_command_prints(page, args, shown):
    from race.run.cli import main

    out = CliRunner().invoke(main, [os.path.join(ROOT, a) if a.startswith("docs/") else a for a in args])
    assert out.exit_code == 0, out.output
    printed = out.output.splitlines()
    at = 0
    for line in shown:
        if line.strip() == "…":
            continue
        assert line in printed[at:], f"{page}: {line!r} is not printed (after line {at}) by race {' '.join(args)}"
        at = printed.index(line, at) + 1
