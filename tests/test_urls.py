"""race.core.urls: storage passwords never leak, whatever characters they hold.

Checked at every place a storage URL is printed or stored: error lines of `race pilot`,
`race worker` and `race report` on an unreachable server (no PostgreSQL needed), and a real
grid on PostgreSQL with a role whose password holds / @ : % space and non-ASCII characters
(started by .ci/postgres.sh): its stdout, stderr, results.json and every attribute of the
optuna study.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from conftest import require
from race.config.configfile import ConfigError
from race.core.urls import check, file_path, masked, passwords, redact

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["ab/cd", "p@ss@word", "u:s:e:r", "100%sure", "with space s", "pässwörd-€", "a/b@c:d%e f€"]


def _url(pw: str, port: int = 1) -> str:
    return f"postgresql://race:{quote(pw, safe='')}@127.0.0.1:{port}/race"


def _spellings(pw: str) -> list[str]:
    return [pw, quote(pw, safe=""), quote(pw)]


@pytest.mark.parametrize("pw", HOSTILE)
def test_masked_and_redacted_text_hold_no_spelling_of_the_password(pw):
    url = _url(pw)
    assert masked(url) == "postgresql://race:***@127.0.0.1:1/race"
    text = redact(f"connection to {url} failed: password {pw!s} rejected ({quote(pw, safe='')})", url)
    assert all(s not in text for s in _spellings(pw)), text
    assert set(_spellings(pw)) <= set(passwords(url)) | {quote(pw)}


@pytest.mark.parametrize("url,path", [
    ("sqlite:///rel/race.db", "rel/race.db"), ("sqlite:////abs/race.db?timeout=30", "/abs/race.db"),
    ("sqlite://", None), ("sqlite:///:memory:", None), ("journal:g/j.log", "g/j.log"), ("j.jsonl", "j.jsonl"),
    ("journal://g/j.log", "g/j.log"), ("postgresql://u:secret@h/db", None), ("mysql+pymysql://h/db", None)])
def test_file_path_is_the_file_a_file_storage_keeps(url, path):
    assert file_path(url) == path


def test_a_password_in_the_query_string_is_masked_too():
    url = "postgresql://h/db?user=u&password=hunter22"
    assert "hunter22" not in masked(url) and "password=***" in masked(url)
    assert "hunter22" not in redact(f"refused hunter22 at {url}", url)


def test_more_than_one_unescaped_at_is_refused_without_echoing_the_url():
    url = "postgresql://race:top@secret@db.example/race"
    with pytest.raises(ConfigError) as err:
        check(url)
    assert "percent-encode" in str(err.value) and "secret" not in str(err.value) and "top" not in str(err.value)
    assert masked(url) == "postgresql://***"
    check(_url("a@b"))                       # encoded: fine
    check("sqlite:////tmp/x.db")
    check("journal:/tmp/a@b.log")


def _race(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "race", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout)


RAW = ["ab/cd", "u:s:e:r", "with space s", "pässwörd-€"]     # typed without percent-encoding


@pytest.mark.parametrize("pw, url", [(pw, _url(pw)) for pw in HOSTILE]
                         + [(pw, f"postgresql://race:{pw}@127.0.0.1:1/race") for pw in RAW])
def test_an_unreachable_storage_is_one_line_without_the_password(tmp_path, pw, url):
    out = _race("report", "--storage", url, "--study", "x", cwd=tmp_path)
    assert out.returncode == 2
    assert all(s not in out.stdout + out.stderr for s in _spellings(pw)), out.stderr
    assert [line for line in out.stderr.splitlines() if line.strip()][-1].startswith("Error: storage")


def test_pilot_and_worker_refuse_an_unreachable_storage_without_the_password(tmp_path):
    pw = HOSTILE[-1]
    url = _url(pw)
    for args in (("pilot", "--storage", url, "--out", str(tmp_path / "run"), "--quiet"),
                 ("worker", "--storage", url, "--study", "x")):
        out = _race(*args, cwd=tmp_path)
        assert out.returncode == 2, out.stderr
        assert all(s not in out.stdout + out.stderr for s in _spellings(pw)), out.stderr
        assert "Traceback" not in out.stderr
    # the one-line refusal of an ambiguous URL, before anything is written
    out = _race("pilot", "--storage", "postgresql://race:top@secret@127.0.0.1:1/race", "--out",
                str(tmp_path / "run2"), cwd=tmp_path)
    assert out.returncode == 2 and "secret" not in out.stderr and "percent-encode" in out.stderr
    assert not (tmp_path / "run2").exists()


@pytest.mark.postgres
def test_a_real_grid_on_postgresql_stores_and_prints_no_spelling_of_a_hostile_password(tmp_path):
    url = os.environ.get("RACE_TEST_POSTGRES_HOSTILE_URL")
    require(bool(url), "PostgreSQL with a hostile-password role (RACE_TEST_POSTGRES_HOSTILE_URL, .ci/postgres.sh)")
    from urllib.parse import unquote

    pw = unquote(url.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1])
    assert all(c in pw for c in "/@:% ") and any(ord(c) > 127 for c in pw)
    study = f"hostile-{os.getpid()}"
    run = tmp_path / "run"
    out = _race("pilot", "--storage", url, "--study", study, "--out", str(run), "--budget", "2e10", "--seeds", "1",
                "--grid", "0.5,0.62,0.74", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "postgresql://race_hostile:***@" in out.stderr
    rep = _race("report", "--storage", url, "--study", study, "--format", "json", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    worker = _race("worker", "--storage", url, "--study", study, "--wait", "0", cwd=tmp_path)   # nothing left to run
    assert worker.returncode == 0, worker.stderr
    from race.run.store import open_storage

    storage = open_storage(url)
    sid = storage.get_study_id_from_name(study)
    attrs = json.dumps([storage.get_study_user_attrs(sid), storage.get_study_system_attrs(sid),
                        [[t.user_attrs, t.system_attrs, t.params] for t in storage.get_all_trials(sid)]],
                       default=str, ensure_ascii=False)
    texts = [out.stdout, out.stderr, rep.stdout, rep.stderr, worker.stdout, worker.stderr, attrs,
             *(p.read_text(errors="replace") for p in run.rglob("*") if p.is_file() and p.suffix != ".db")]
    for spelling in _spellings(pw):
        assert all(spelling not in t for t in texts), spelling


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_storage_is_refused_in_one_line(url):
    """No pilot process, worker or report can share a database that ends with its process (a review of session 39:
    race report --storage sqlite:// and race worker ended in an internal error)."""
    from race.core.urls import check

    with pytest.raises(ConfigError, match=r"in-memory SQLite storage .* expected sqlite:///FILE"):
        check(url)


def test_a_results_file_records_a_file_storage_by_its_absolute_path(tmp_path, monkeypatch):
    """race pilot --storage sqlite:///run1/race.db recorded that relative URL, which names the file only from the
    folder it ran in (a review of session 39); servers' URLs stay as given."""
    from race.core.urls import absolute

    monkeypatch.chdir(tmp_path)
    assert absolute("sqlite:///run1/race.db?timeout=5") == f"sqlite:///{tmp_path}/run1/race.db?timeout=5"
    assert absolute("journal:j.log") == f"journal:{tmp_path}/j.log" and absolute("j.jsonl") == f"{tmp_path}/j.jsonl"
    for url in ("sqlite:////abs/x.db", "postgresql://u:p@h/db", "sqlite://"):
        assert absolute(url) == url
