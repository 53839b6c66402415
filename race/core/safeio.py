"""Reading untrusted files and printing untrusted text: bounds before work. Pure (no third-party imports
at import time).

- ``read_capped``: a regular file's text, refused when it is a character device, FIFO or socket,
  or larger than the cap; a gzip stream is decompressed in chunks and refused once the decompressed
  text passes the cap, so a small bomb never reaches memory.
- ``loads_json``: ``json.loads`` whose nesting too deep for the parser is one-line error, not a
  RecursionError, and that refuses a repeated key in an object (JSON would silently keep the last).
- ``load_yaml``: ``yaml.safe_load`` that refuses aliases (the "billion laughs" expansion) and
  duplicate keys (YAML silently keeps the second).
- ``terminal_safe``: text with every control character but newline and tab written as a visible
  escape (``\\x1b``, ``\\r``), so a file or a model cannot drive the terminal or overwrite a line;
  ``one_line``: the same with newlines escaped too, for a single-line field that comes from a file
  or a model (a task name, a warning), so it can never forge a line of a report.
- ``quote``: a bad value for an error message, at most ``QUOTE_CHARS`` characters in all.
- ``write_inside``: the one way RACE writes a file: into a named folder, through a temporary file in
  the target's own folder and a rename, never through or over a symbolic link at the final
  component, and never to a path whose resolved location leaves the named folder (``../``, a
  planted link to a folder elsewhere).
- ``locked``: one writer at a time for a file that is read, changed and written back (a results
  file, its probe records): an ``fcntl`` lock on a hidden ``.NAME.lock`` beside it; a second writer
  waits up to ``LOCK_WAIT`` seconds, then is refused in one line naming the holder.

Every refusal is a ``RaceError`` subclass with one line naming the file and the limit.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from typing import IO, Any, Callable, Iterator

from race.core.errors import RaceError

MAX_RESULTS_BYTES = 256 * 2 ** 20      # a results file, decompressed (a 10 000-pilot grid is ~0.2 GiB)
MAX_CONFIG_BYTES = 1 * 2 ** 20         # a YAML config
MAX_JOURNAL_BYTES = 1 * 2 ** 30        # an optuna journal file (optuna replays all of it into memory on open)
QUOTE_CHARS = 200                      # characters of a bad value an error message shows, the cut mark included
LOCK_WAIT = 300.0                      # seconds a second writer of a results file waits for the first


class UnsafeInput(RaceError):
    """A file or value past RACE's bounds (size, depth, aliases, device files)."""


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)``, at most ``limit`` characters in all: cut, with the count of the rest."""
    return shortened(repr(value), limit)


def shortened(text: str, limit: int = 80) -> str:
    """``text`` (a path, a name) cut to ``limit`` characters with the count of the rest, unquoted."""
    text = str(text)
    if len(text) <= limit:
        return text
    keep = max(1, limit - 30)
    return f"{text[:keep]}… ({len(text) - keep:,} more characters)"


def check_regular(path: str, what: str) -> None:
    """Refuse a path that is not a regular file (a character device such as /dev/zero, a FIFO)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return                                   # the caller's own "does not exist" message
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise UnsafeInput(f"{what} {path!r} is {kind}: expected a regular file")


def read_capped(path: str, *, limit: int, what: str) -> str:
    """The text of ``path`` (UTF-8; gzip-compressed when its first bytes say so), refused past
    ``limit`` bytes of text."""
    import gzip

    check_regular(path, what)
    with open(path, "rb") as fh:
        zipped = fh.read(2) == b"\x1f\x8b"
    if not zipped and os.path.getsize(path) > limit:
        raise UnsafeInput(f"{what} {path!r} is {os.path.getsize(path):,} bytes: the limit is {limit:,}")
    chunks, size = [], 0
    with (gzip.open(path, "rb") if zipped else open(path, "rb")) as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                break
            size += len(block)
            if size > limit:
                raise UnsafeInput(f"{what} {path!r} decompresses past {limit:,} bytes: the limit (a compressed "
                                  "file this large is refused before it fills memory)")
            chunks.append(block)
    return b"".join(chunks).decode("utf-8")


MAX_INT_DIGITS = 400        # an integer in a RACE file has at most ~20 digits; Python's own limit is 4,300


def loads_json(text: str, *, what: str) -> Any:
    """``json.loads``; nesting deeper than the parser takes, or a key repeated within one object
    (the parser would keep the last silently), is a one-line UnsafeInput."""
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise UnsafeInput(f"{what} repeats the key {quote(key, 60)} in one object: JSON would keep only "
                                  "the last value; remove the duplicate")
            out[key] = value
        return out

    def whole(digits: str) -> int:
        if len(digits) > MAX_INT_DIGITS:
            raise UnsafeInput(f"{what} holds an integer of {len(digits):,} digits: expected the numbers RACE writes "
                              f"(at most {MAX_INT_DIGITS} digits)")
        return int(digits)

    try:
        return json.loads(text, object_pairs_hook=unique, parse_int=whole)
    except RecursionError:
        raise UnsafeInput(f"{what} nests JSON too deeply: expected a RACE file, not nesting past Python's "
                          "recursion limit") from None


def load_yaml(text: str, *, what: str) -> Any:
    """``yaml.safe_load`` without aliases and without duplicate keys."""
    import yaml

    class _Loader(yaml.SafeLoader):
        pass

    def compose_node(self, parent, index):  # noqa: ANN001
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise UnsafeInput(f"{what} uses a YAML alias (*{event.anchor}) at line {event.start_mark.line + 1}: RACE "
                              "configs take no anchors or aliases (their expansion is unbounded)")
        return yaml.SafeLoader.compose_node(self, parent, index)

    def mapping(loader, node, deep=False):  # noqa: ANN001
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise UnsafeInput(f"{what} repeats the key {quote(key, 60)} at line {key_node.start_mark.line + 1}: "
                                  "YAML would keep only the second value")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    _Loader.compose_node = compose_node                # type: ignore[method-assign]
    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=_Loader)         # noqa: S506 — a SafeLoader subclass
    except RecursionError:
        raise UnsafeInput(f"{what} nests YAML too deeply") from None
    except ValueError as e:          # int() past Python's digit limit (4300): a number no config holds
        if "integer string conversion" not in str(e):
            raise
        raise UnsafeInput(f"{what} holds an integer of more than 4,300 digits: expected numbers a config holds") \
            from None


# tab and newline are the only control characters RACE's own output uses (tables, multi-line
# reports); carriage return is escaped too: a "\r" from a file would overwrite the line it ends
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0, 32), 127, *range(128, 160)) if c not in (9, 10)}
_CONTROL[13] = "\\r"
_LINE = {**_CONTROL, 10: "\\n", 0x2028: "\\u2028", 0x2029: "\\u2029", 0x85: "\\x85"}


def terminal_safe(text: str) -> str:
    """``text`` with control characters (ESC, BEL, backspace, CR, C1 …) written as visible escapes;
    tab and newline kept (RACE's own multi-line text)."""
    return text.translate(_CONTROL)


def one_line(value: Any) -> str:
    """``str(value)`` for a single-line field from a file or a model (a task or model name, a
    warning, a pilot's error): every control character escaped, newlines and line separators
    included, so the field stays on its line and cannot forge another line of a report."""
    return str(value).translate(_LINE)


class UnsafeWrite(RaceError):
    """A write RACE refuses: through a symbolic link, or to a place outside the folder it was named."""


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


def write_inside(folder: str, name: str, content: str | bytes | Callable[[IO[bytes]], Any], *,
                 what: str = "file") -> str:
    """Write ``folder/name`` (``name`` may hold subfolders, created as needed) and return its path.

    ``content``: text (UTF-8), bytes, or a function that writes into the open binary file (a
    Parquet writer, a figure's ``savefig``). The bytes go to a temporary file in the target's own
    folder, flushed to disk, then renamed over the target, so a crash or a full disk leaves the
    previous file whole and a reader never sees half a file. Refused (``UnsafeWrite``, nothing
    written): a target that is a symbolic link (a link is never followed, nor replaced), or not a
    regular file (a folder, a FIFO); a target whose folder resolves outside ``folder`` (``..`` in
    ``name``, a link planted as one of its subfolders). ``folder`` itself may be a link: it is the
    place the user named. An ``OSError`` of the write itself (no space, no permission) is raised
    as it is, for the caller to word."""
    root = os.path.realpath(folder)
    target = os.path.normpath(os.path.join(os.path.abspath(folder), name))
    parent = os.path.realpath(os.path.dirname(target))       # resolves a planted link in the existing part
    if not _inside(root, parent):
        raise UnsafeWrite(f"{what} {target!r} resolves to {os.path.join(parent, os.path.basename(target))!r}, "
                          f"outside the folder {folder!r}: RACE writes only inside the folder it is given "
                          "(a symbolic link or '..' leads out); remove the link or choose another folder")
    os.makedirs(parent, exist_ok=True)
    final = os.path.join(parent, os.path.basename(target))
    try:
        mode = os.lstat(final).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISLNK(mode):
        raise UnsafeWrite(f"{what} {target!r} is a symbolic link (to {os.readlink(final)!r}): RACE never writes "
                          "through a link nor replaces one; remove it, then run the same command again")
    if mode is not None and not stat.S_ISREG(mode):
        raise UnsafeWrite(f"{what} {target!r} exists and is not a regular file: expected a file RACE may replace")
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(final)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content.encode("utf-8") if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)       # as open() would create it (mkstemp's file is private)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return final


def _open_lock(lock: str) -> int:
    """The lock file's descriptor: created, or an existing regular file with one link. A planted link
    (symbolic: never followed; hard: its other name would be truncated by the pid written in it), a
    FIFO or a folder in its place is refused in one line (UnsafeWrite), before anything is written."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError as e:
        kind = "a symbolic link" if os.path.islink(lock) else "a folder" if os.path.isdir(lock) else "unusable"
        raise UnsafeWrite(f"lock file {lock!r} is {kind} ({e.strerror}): expected RACE's own lock file or none; "
                          "remove it, then run the same command again (nothing was written)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        kind = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} hard links"
        raise UnsafeWrite(f"lock file {lock!r} is {kind}: expected RACE's own lock file or none (a planted one "
                          "would be written through); remove it, then run the same command again (nothing was written)")
    return fd


class Busy(RaceError):
    """Another process holds the lock on a file RACE reads, changes and writes back."""


@contextlib.contextmanager
def locked(path: str, *, what: str = "results file", wait: float | None = None) -> Iterator[None]:
    """Hold the lock of ``path`` (a file that is read, changed and written back) for the block: an
    exclusive ``fcntl.flock`` on ``.NAME.lock`` in its folder, which records the holder's pid. A
    second process waits up to ``wait`` seconds (``LOCK_WAIT``), then gets ``Busy`` in one line;
    the lock goes with the process, so a killed holder never leaves it held. Where ``fcntl`` does
    not exist (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:                        # pragma: no cover - not POSIX
        yield
        return
    wait = LOCK_WAIT if wait is None else wait
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    lock = os.path.join(folder, f".{os.path.basename(path)}.lock")
    fd = _open_lock(lock)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "another process"
                    raise Busy(f"{what} {path!r} is being written by process {holder} (lock {lock!r}); waited "
                               f"{wait:g} s: run the command again when it has finished (nothing was written)") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)                           # releases the flock
