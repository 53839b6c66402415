"""Storage URLs: parsed, checked and masked by SQLAlchemy's own URL parser (``make_url``).

Invariants: no password (from the netloc or a ``password=`` query parameter) ever reaches a
message, a file or a stored attribute through this module: ``masked`` renders a URL with
``***`` in its place, and ``redact`` removes every spelling of it (as typed, percent-decoded,
percent-encoded; 4 characters or more: a shorter one is masked inside the URL only, since
replacing it in free text would mangle every word containing it) from any text, e.g. a
driver's error message. A netloc with more than one
unescaped ``@`` is ambiguous (where does the password end?): ``check`` refuses it without
echoing the URL, asking for percent-encoding. Journal storages (``journal:FILE``, ``FILE.log``)
are file paths and carry no credentials.

Pure module: SQLAlchemy only (optuna depends on it), imported when a URL is looked at.
"""
from __future__ import annotations

import os

from urllib.parse import quote, unquote

from race.core.errors import ConfigError

HIDDEN = "***"
MIN_FREE_TEXT = 4          # secrets this long or longer are removed from free text too, not only from URLs
_PASSWORD_KEYS = ("password", "passwd", "pwd")


def journal_path(url: str) -> str | None:
    """The file of a journal storage URL (``journal:FILE``, ``journal://FILE``, ``FILE.log``), else None."""
    if url.startswith("journal://"):
        return url[len("journal://"):]
    if url.startswith("journal:"):
        return url[len("journal:"):]
    if "://" not in url and url.endswith((".log", ".journal", ".jsonl")):
        return url
    return None


def file_path(url: str) -> str | None:
    """The local file a file storage keeps (a journal's, or an SQLite database's as SQLAlchemy parses it:
    ``sqlite:///FILE?…`` → ``FILE``); None for a server storage and for SQLite in memory."""
    journal = journal_path(url)
    if journal is not None:
        return journal
    parsed = _parse(url) if isinstance(url, str) and url.startswith("sqlite") else None
    database = getattr(parsed, "database", None)
    return database if database and database != ":memory:" else None


def absolute(url: str) -> str:
    """``url`` with a file storage's relative path made absolute (``sqlite:///runs/a/race.db`` →
    ``sqlite:////HOME/runs/a/race.db``, ``journal:j.log`` → ``journal:/HOME/j.log``), so a results file that records
    it names the same file from any folder; other URLs as given."""
    path = file_path(url)
    if path is None or os.path.isabs(path):
        return url
    full = os.path.abspath(path)
    if journal_path(url) is not None:
        return f"journal:{full}" if url.startswith("journal:") else full
    parsed = _parse(url)
    return parsed.set(database=full).render_as_string(hide_password=False) if parsed is not None else url


def check(url: str) -> None:
    """Refuse, in one line and without echoing it, a URL whose password cannot be told apart
    from its host: more than one unescaped ``@`` before the query string."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"storage URL {url!r} is empty: expected sqlite:///FILE, postgresql://USER@HOST/DB, "
                          "mysql://USER@HOST/DB or journal:FILE")
    if journal_path(url) is not None or "://" not in url:
        return
    if url.startswith("sqlite") and file_path(url) is None:
        raise ConfigError("an in-memory SQLite storage (sqlite:// or :memory:) ends with the process that opened it, "
                          "so no pilot process, worker or report can share it: expected sqlite:///FILE")
    authority = url.split("://", 1)[1].split("?", 1)[0]
    if authority.count("@") > 1:
        raise ConfigError("the storage URL has more than one unescaped '@', so its password cannot be told apart "
                          "from its host: percent-encode the password (@ as %40, / as %2F, : as %3A, % as %25; "
                          "urllib.parse.quote(password, safe='') does it)")


def _parse(url: str):
    from sqlalchemy.engine import make_url

    try:
        return make_url(url)
    except Exception:  # noqa: BLE001 — not an SQLAlchemy URL (journal paths, typos): nothing to mask
        return None


def passwords(url: str) -> list[str]:
    """Every spelling of the URL's secrets that could appear in a text: as typed in the URL,
    percent-decoded, percent-encoded (longest first, empty ones left out)."""
    if not isinstance(url, str) or journal_path(url) is not None:
        return []
    found: set[str] = set()
    parsed = _parse(url)
    if parsed is not None:
        if parsed.password:
            found.add(str(parsed.password))
        for key, value in parsed.query.items():
            if key.lower() in _PASSWORD_KEYS:
                found.update([value] if isinstance(value, str) else value)
    if "://" in url:                               # the raw text between "user:" and the last "@"
        authority = url.split("://", 1)[1].split("?", 1)[0]
        if "@" in authority:
            userinfo = authority.rsplit("@", 1)[0]
            if ":" in userinfo:
                found.add(userinfo.split(":", 1)[1])
    spelled = set()
    for secret in found:
        spelled.update({secret, unquote(secret), quote(secret, safe=""), quote(unquote(secret), safe="")})
    return sorted((s for s in spelled if s), key=len, reverse=True)


def masked(url: str) -> str:
    """The URL with its password (netloc and ``password=`` query parameter) shown as ``***``."""
    if not isinstance(url, str) or journal_path(url) is not None:
        return url
    if "://" in url and url.split("://", 1)[1].split("?", 1)[0].count("@") > 1:
        return url.split("://", 1)[0] + "://" + HIDDEN        # ambiguous: show nothing of it
    parsed = _parse(url)
    if parsed is None:
        text = url
        for secret in passwords(url):
            text = text.replace(secret, HIDDEN)
        return text
    query = {k: (HIDDEN if k.lower() in _PASSWORD_KEYS else v) for k, v in parsed.query.items()}
    text = parsed.set(query=query).render_as_string(hide_password=True)
    return text.replace("%2A%2A%2A", HIDDEN)


def redact(text: str, url: str) -> str:
    """``text`` with ``url`` shown masked and every spelling of its secrets replaced by ``***``."""
    if not isinstance(text, str) or not isinstance(url, str):
        return text
    secrets = passwords(url)
    if secrets and url in text:
        text = text.replace(url, masked(url))
    for secret in secrets:
        if len(secret) >= MIN_FREE_TEXT:         # a 1–3 character one would mangle every word it occurs in
            text = text.replace(secret, HIDDEN)
    return text
