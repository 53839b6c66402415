"""docs/tutorial.md's code runs as written, and the config header it shows is what `race init` writes today.

The tutorial's own blocks are read from the page: its data generator and reward are written into a fresh
folder, its `race init` commands run there (`python -m race`, as the `race` command), and the header the page
quotes must equal the one written, line for line. Its pilots are not run here (minutes); the figures it quotes
from them were taken on the same commands (docs/tutorial.md's date line).
"""
import os
import re
import shlex
import subprocess
import sys

from conftest import ROOT

PAGE = os.path.join(ROOT, "docs", "tutorial.md")


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


def _init_commands(text: str) -> list[list[str]]:
    cmds = []
    for block in _blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("race init "):
                cmds.append(shlex.split(line))
    return cmds


def test_the_tutorials_race_init_writes_the_header_it_shows(tmp_path):
    text = open(PAGE, encoding="utf-8").read()
    generator, reward = _blocks(text, "python")[:2]
    subprocess.run([sys.executable, "-c", generator], cwd=tmp_path, check=True)
    (tmp_path / "myreward.py").write_text(reward, encoding="utf-8")
    first, big = _init_commands(text)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    for cmd in (first, big):
        out = subprocess.run([sys.executable, "-m", "race", *cmd[1:]], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
    shown = text.split("The header of `grid.yaml` shows the arithmetic", 1)[1]
    shown = shown.split("```\n", 1)[1].split("```", 1)[0].strip("\n").splitlines()
    written = [line for line in (tmp_path / "grid.yaml").read_text(encoding="utf-8").splitlines()
               if line.startswith("# ")]
    start = next(i for i, line in enumerate(written) if line.startswith("# Sizing:"))
    assert written[start:start + len(shown)] == shown and shown[-1].startswith("# WARNING")
    big_header = (tmp_path / "grid-big.yaml").read_text(encoding="utf-8")
    assert "at 4.38e+11 FLOPs each, F / B = 27.4" in big_header     # step 4's prose: 4.38e11 a pilot, 27.4 × B
