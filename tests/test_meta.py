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


def test_the_readme_is_short_shows_the_real_report_and_indexes_every_docs_page():
    import glob

    from click.testing import CliRunner

    from race.run.cli import main

    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(readme.splitlines()) <= 150
    block = readme.split("<!-- readme:report:begin -->", 1)[1].split("<!-- readme:report:end -->", 1)[0]
    shown = block.strip().removeprefix("```").removesuffix("```").strip("\n")
    out = CliRunner().invoke(main, ["report", os.path.join(ROOT, "docs", "runs", "default.results.json.gz")])
    assert out.exit_code == 0, out.output
    assert shown.splitlines() == out.output.splitlines()[:len(shown.splitlines())] and len(shown.splitlines()) >= 10
    for page in glob.glob(os.path.join(ROOT, "docs", "*.md")) + glob.glob(os.path.join(ROOT, "docs", "*", "*.md")):
        rel = os.path.relpath(page, ROOT).replace(os.sep, "/")
        assert f"({rel})" in readme, page
    assert 'if __name__ == "__main__":' in readme


def test_the_generated_reference_pages_are_current():
    """docs/reference/cli.md, config.md and api.md come from the click commands, the config
    dataclasses and the public names (scripts/reference.py); a change without regenerating fails here."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "reference.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_nothing_points_outside_the_repository():
    """Papers are cited by title and arXiv id; no file names a note that lives outside the repository
    (the project's working references and design notes are not shipped)."""
    import glob

    outside = ("REFERENCES.md", "DESIGN.md", "../shared", "seeds/00")
    hits = []
    for ext in ("py", "md", "yaml", "cfg", "toml"):
        for path in glob.glob(os.path.join(ROOT, "**", f"*.{ext}"), recursive=True):
            rel = os.path.relpath(path, ROOT)
            if rel.startswith(("CHANGELOG", ".ci" + os.sep + "cache", "tests" + os.sep + "test_meta.py")) or "egg-info" in rel:
                continue
            text = open(path, encoding="utf-8", errors="replace").read()
            hits += [f"{rel}: {name}" for name in outside if name in text]
    assert not hits, hits
