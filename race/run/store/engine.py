"""Opening an optuna storage from a URL: SQLite (with immediate write locks), PostgreSQL /
MySQL (with connect timeouts and the installed driver), optuna's journal file (with heartbeats
through optuna's own interface). Invariant: every error is a one-line ``StoreError`` with the URL
masked and the password removed from the driver's message (race.core.urls)."""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable

import optuna
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import TrialState

from race.core import urls
from race.run.store.base import DEFAULT_HEARTBEAT, GRACE_FACTOR, HEARTBEAT, StoreError


def mask_url(url: str) -> str:
    """``race.core.urls.masked``: the URL with its password shown as ``***``."""
    return urls.masked(url)


def default_url(out_dir: str) -> str:
    """The default storage of a grid: an SQLite file in its output folder."""
    return "sqlite:///" + os.path.abspath(os.path.join(out_dir, "race.db"))


class JournalHeartbeatStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """optuna's journal storage with optuna's heartbeat interface (RDB storages have it built in):
    the heartbeat is a system attr of the trial, so ``fail_stale_trials`` works the same way."""

    def __init__(self, backend: Any, interval: int, grace: int, callback: Callable) -> None:
        super().__init__(backend)
        self._race_hb = (interval, grace, callback)

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, HEARTBEAT, time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now, grace = time.time(), self._race_hb[1]
        return [t._trial_id for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
                if t.system_attrs.get(HEARTBEAT) is not None and now - t.system_attrs[HEARTBEAT] > grace]

    def get_heartbeat_interval(self) -> int | None:
        return self._race_hb[0]

    def get_heartbeat_stale_trial_callback(self) -> Callable | None:
        return self._race_hb[2]


def _sqlite_immediate(engine: Any) -> None:
    """Make every SQLite transaction ``BEGIN IMMEDIATE``.

    optuna takes a WAITING trial with SELECT … FOR UPDATE, then UPDATE; SQLite ignores FOR UPDATE
    and Python's sqlite3 runs the SELECT outside a transaction, so two processes could both take
    the same trial (measured: tests/test_store.py). Holding the write lock from the start of
    each transaction makes the take atomic, as it is on PostgreSQL and MySQL."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_pysqlite_transactions(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None
        # WAL: commits without an fsync each (a killed process loses nothing; a power cut may
        # lose the last commits), readers do not block the writer
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()          # connections made before the listeners would not have them


def _postgres_driver(url: str) -> str:
    """``postgresql://`` means psycopg (3) to SQLAlchemy ≥ 2.1; use psycopg2 when only it is installed."""
    if not url.startswith("postgresql://"):
        return url
    import importlib.util

    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def open_storage(url: str, *, heartbeat: int = DEFAULT_HEARTBEAT, on_stale: Callable | None = None) -> Any:
    """An optuna storage for ``url``: ``sqlite:///FILE``, ``postgresql://…``, ``mysql://…`` (any
    SQLAlchemy URL optuna's RDBStorage takes), or ``journal:FILE`` / ``FILE.log`` (optuna's journal
    file storage). Unreachable or malformed storages raise ``StoreError`` (one line, masked)."""
    heartbeat = max(1, int(heartbeat))
    grace = GRACE_FACTOR * heartbeat
    urls.check(url)
    masked = urls.masked(url)
    path = urls.journal_path(url)
    try:
        if path is not None:
            return _journal_storage(path, masked, heartbeat, grace, on_stale)
        scheme = _rdb_scheme(url, masked)
        url, engine = _engine_kwargs(url, scheme)    # the URL a driver sees (psycopg2 when only it is installed)
        storage = _rdb_storage(url, engine, heartbeat, grace, on_stale)
        if scheme == "sqlite":
            _sqlite_immediate(storage.engine)
        return storage
    except StoreError:
        raise
    except ImportError as e:
        cause = e.__cause__ if isinstance(e.__cause__, ImportError) else e
        raise StoreError(f"storage {masked!r} needs a Python driver that is not installed "
                         f"({first_line(cause, url)}): pip install race-rl[postgres] for PostgreSQL, "
                         "pymysql for MySQL with a mysql+pymysql:// URL") from None
    except Exception as e:  # noqa: BLE001 — SQLAlchemy / driver errors: unreachable, refused, bad database
        raise system_failure(e, url) or StoreError(f"storage {masked!r} is unreachable: {first_line(e, url)}") from None


def _journal_storage(path: str, masked: str, heartbeat: int, grace: int, on_stale: Callable | None) -> Any:
    """optuna's journal file storage at ``path`` with RACE's heartbeats; a path that is no regular
    file, or a log over ``MAX_JOURNAL_BYTES``, is refused (``StoreError``)."""
    from optuna.storages.journal import JournalFileBackend

    from race.core.safeio import MAX_JOURNAL_BYTES, UnsafeInput, check_regular

    try:
        check_regular(path, "journal storage")     # /dev/zero, /dev/full, a FIFO: never opened
    except UnsafeInput as e:
        raise StoreError(str(e)) from None
    size = os.path.getsize(path) if os.path.isfile(path) else 0
    if size > MAX_JOURNAL_BYTES:                   # optuna reads the whole log, line by line, into memory
        raise StoreError(f"journal storage {masked!r} is {size / 2**30:.2f} GiB, over RACE's limit of "
                         f"{MAX_JOURNAL_BYTES / 2**30:g} GiB (optuna replays the whole file into memory): "
                         "start a new journal file for new studies, or keep large grids in "
                         "sqlite:///FILE or postgresql://…")

    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    return JournalHeartbeatStorage(JournalFileBackend(path), heartbeat, grace, on_stale)


def _rdb_scheme(url: str, masked: str) -> str:
    """The database of an SQLAlchemy URL (``sqlite``, ``postgresql``, ``mysql``, …); ``StoreError``
    for anything optuna's RDBStorage does not take (and for ``postgres://``)."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if "://" not in url or scheme not in ("sqlite", "postgresql", "postgres", "mysql", "mariadb", "oracle",
                                          "mssql"):
        raise StoreError(f"storage {masked!r} is not an optuna storage URL: expected sqlite:///FILE, "
                         "postgresql://USER@HOST/DB, mysql://USER@HOST/DB or journal:FILE")
    if scheme == "postgres":
        raise StoreError(f"storage {masked!r}: SQLAlchemy spells the scheme postgresql://, not postgres://")
    return scheme


def _engine_kwargs(url: str, scheme: str) -> tuple[str, dict[str, Any]]:
    """(URL, SQLAlchemy engine kwargs) for ``scheme``: an SQLite file's folder made, a 60 s lock
    wait; a 10 s connect timeout for PostgreSQL and MySQL (PostgreSQL's driver chosen)."""
    engine: dict[str, Any] = {}
    if scheme == "sqlite":
        file = url.split(":///", 1)[-1]
        if file and file != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(file)) or ".", exist_ok=True)
        engine = {"connect_args": {"timeout": 60}}
    elif scheme == "postgresql":
        engine = {"connect_args": {"connect_timeout": 10}}
        url = _postgres_driver(url)
    elif scheme in ("mysql", "mariadb"):
        engine = {"connect_args": {"connect_timeout": 10}}
    return url, engine


def _rdb_storage(url: str, engine: dict[str, Any], heartbeat: int, grace: int, on_stale: Callable | None) -> Any:
    """optuna's RDBStorage for ``url`` with the heartbeat settings (up to 5 tries: see below)."""
    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                storage = optuna.storages.RDBStorage(url, engine_kwargs=engine, heartbeat_interval=heartbeat,
                                                     grace_period=grace,
                                                     heartbeat_stale_trial_callback=on_stale)
            break
        except Exception as e:  # noqa: BLE001
            # two processes creating the tables of a new database at once: the loser retries
            text = str(e)
            if attempt == 4 or not ("alembic_version" in text or "already exists" in text):
                raise
            time.sleep(0.5 * (attempt + 1))
    return storage


# words of a driver's own message that say what went wrong with the machine, not the data: when a
# wrapper (optuna's StorageInternalError: "… e.g. exceeding max length") hides one, it is named instead
_SYSTEM_WORDS = ("disk", "full", "i/o", "no space", "read-only", "readonly", "locked", "permission")


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and the exceptions behind it (``__cause__``, else ``__context__``), each once."""
    chain, seen = [], set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        chain.append(x)
        x = x.__cause__ or x.__context__
    return chain


def first_line(e: BaseException, url: str = "") -> str:
    """One line for a storage error, credentials masked: the driver's message (``orig``), or, when a
    wrapper hides a system cause in its chain (a full disk, an I/O error, a locked or read-only
    database), that cause's."""
    chain = _chain(e)
    for c in chain[1:]:
        text = str(getattr(c, "orig", None) or c).strip()
        if any(w in text.lower() for w in _SYSTEM_WORDS):
            return urls.redact(text.splitlines()[0], url)
    msg = str(getattr(e, "orig", None) or e).strip().splitlines()
    return urls.redact(msg[0] if msg else type(e).__name__, url)


# the machine, not the data: what a driver (or the file system under a journal) says when the disk
# is full, fails, or is read-only, as (words of its message or errno, what the user is told)
_DRIVERS = ("sqlite3", "sqlalchemy", "psycopg", "psycopg2", "pymysql", "MySQLdb", "mysql", "optuna")
_FULL_WORDS = ("disk is full", "no space left", "disk full", "could not extend file", "quota exceeded",
               "the table is full", "database or disk is full")
_IO_WORDS = ("disk i/o error", "input/output error")
_READONLY_WORDS = ("readonly database", "read-only file system", "read-only database")


def _system_kind(c: BaseException) -> str | None:
    """"full", "io" or "readonly" when ``c`` is a driver's or the file system's error saying so."""
    import errno

    if isinstance(c, OSError) and c.errno in (errno.ENOSPC, errno.EDQUOT):
        return "full"
    if isinstance(c, OSError) and c.errno == errno.EIO:
        return "io"
    if isinstance(c, OSError) and c.errno == errno.EROFS:
        return "readonly"
    if type(c).__module__.split(".")[0] not in _DRIVERS and not isinstance(c, OSError):
        return None
    text = str(getattr(c, "orig", None) or c).lower()
    for kind, words in (("full", _FULL_WORDS), ("io", _IO_WORDS), ("readonly", _READONLY_WORDS)):
        if any(w in text for w in words):
            return kind
    return None


def system_failure(e: BaseException, url: str | None) -> StoreError | None:
    """A one-line ``StoreError`` when a storage operation failed because the machine did (its disk is
    full, fails, or is read-only) — whatever wrapper hides that in ``e``'s chain (optuna's
    StorageInternalError: "… e.g. exceeding max length"); None for any other error."""
    for c in _chain(e):
        kind = _system_kind(c)
        if kind is None:
            continue
        from race.core.safeio import shortened

        text = str(getattr(c, "orig", None) or c).strip()
        first = text.splitlines()[0] if text else type(c).__name__
        said = shortened(urls.redact(first, url) if url else first, 120)
        what = {"full": "the disk that holds it is full", "io": "the disk that holds it fails (an I/O error)",
                "readonly": "it is read-only"}[kind]
        todo = {"full": "free space there (or give another --storage)",
                "io": "check that disk (or give another --storage)",
                "readonly": "make it writable (or give another --storage)"}[kind]
        name = f"storage {shortened(urls.masked(url), 120)!r}" if url else "the storage"
        return StoreError(f"{name} cannot be written: {what} ({said}): {todo}, then run the same command again; "
                          "finished pilots stay in the storage")
    return None
