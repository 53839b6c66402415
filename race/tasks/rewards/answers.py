"""Final answers of worked solutions, and the rewards that check them: ``math`` and ``format``.

A worked solution (GSM8K, MATH, a chat model's reasoning) ends in a *final answer statement*;
``extract_answer`` finds it, in this order of precedence:

1. the last top-level ``\\boxed{...}`` / ``\\fbox{...}`` (braces balanced, nesting allowed; a
   last box whose braces never close — a completion cut off mid-answer — means *no* answer);
2. else the text after the last ``####`` up to the end of its line (GSM8K);
3. else the text after the last ``the answer is`` / ``answer:`` (any case) up to the end of its
   sentence (a ``.`` followed by a space or the end of the line) or line;
4. else ``None``.

Invariants:

- text after the first end-of-sequence marker (``race.tasks.rewards.rules.EOS_MARKERS``) is ignored,
  and only the last ``MAX_TAIL`` characters before it are searched: extraction is linear in at
  most ``MAX_TAIL`` characters whatever the completion's length;
- model text is never evaluated as Python. Two plain numbers (``18``, ``-0.5``, ``1,234``,
  ``3/4``, ``\\frac{3}{4}``, after ``normalize_answer``) are compared here, exactly, as
  ``fractions.Fraction`` (a decimal side is rounded to 6 places first, as math-verify does:
  ``0.333333 = 1/3``). Anything else goes to math-verify's *LaTeX* parser (ANTLR grammar →
  sympy constructors; never its ``sympy.parse_expr`` path, which calls ``eval``) in a
  persistent worker process, one check at a time, at most ``MAX_ANSWER`` characters a side;
- each such check has a hard time limit (``CHECK_TIMEOUT``, ``reward.check_timeout``) that
  holds in any thread or process: a soft ``setitimer`` alarm in the worker, and past it plus
  ``KILL_GRACE`` the parent kills the worker (a new one starts on the next check). A check
  over the limit is *not equal* (the reward scores 0.0) and is counted in ``check_stats()``;
- ``import race`` stays light: math-verify (and sympy) are imported only in the worker.

docs/rewards.md describes the rewards and the checker's safety.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from fractions import Fraction
from typing import Callable

from race.tasks.rewards.rules import EOS_MARKERS, sparse

CHECK_TIMEOUT = 2.0     # seconds one math-verify check may take (reward.check_timeout); over: not equal
KILL_GRACE = 1.0        # past CHECK_TIMEOUT, seconds before the parent kills a worker stuck in C code
STARTUP_TIMEOUT = 120.0     # seconds the worker may take to import math-verify / sympy (not a check)
MAX_TAIL = 4096         # characters before the EOS searched for the final answer
MAX_ANSWER = 512        # longest answer (either side) the checker accepts; longer: not equal / not parseable
CHECKERS = ("math", "sparse")   # answer_checker names ("exact" is sparse)

# ------------------------------------------------------------------------------ extraction

_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"\banswer\s*(?:is\b\s*:?|:)[ \t]*([^\n]*)", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\.(?=\s|$)")
_CLOSING = re.compile(r"[\s.$*}\\\])]*")     # what may follow a well-formed final statement: ". $ ** } \] \)"


def before_eos(completion: str) -> tuple[str, bool]:
    """``(text before the first EOS marker, whether one was found)``."""
    cut = min((i for i in (completion.find(m) for m in EOS_MARKERS) if i >= 0), default=-1)
    return (completion, False) if cut < 0 else (completion[:cut], True)


def _boxes(text: str) -> list[tuple[int, int, str | None]]:
    """Top-level ``\\boxed{}`` / ``\\fbox{}`` of ``text`` as ``(start, end, content)``; a box whose
    braces never close comes last with content None. ``\\{`` and ``\\}`` are not structural."""
    out: list[tuple[int, int, str | None]] = []
    pos = 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return out
        depth, i, n = 1, m.end(), len(text)
        while i < n and depth:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            depth += (c == "{") - (c == "}")
            i += 1
        if depth:
            out.append((m.start(), n, None))
            return out
        out.append((m.start(), i, text[m.end():i - 1]))
        pos = i


def _statement(text: str) -> tuple[str, str | None, int, int] | None:
    """The final answer statement of ``text``: ``(form, answer, end, count)`` — the form
    (``boxed``, ``####``, ``answer is``), its answer (None: malformed), where the statement
    ends, and how many statements of that form ``text`` holds; None without any."""
    boxes = _boxes(text)
    if boxes:
        _, end, content = boxes[-1]
        content = content.strip() if content is not None else None
        return "boxed", content or None, end, len(boxes)
    hashes = list(_HASHES.finditer(text))
    if hashes:
        m = hashes[-1]
        answer = m.group(1).strip().rstrip(".").strip()
        return "####", answer or None, m.end(), len(hashes)
    said = list(_ANSWER_IS.finditer(text))
    if said:
        m = said[-1]
        rest = m.group(1)
        stop = _SENTENCE_END.search(rest)
        cut = stop.start() if stop else len(rest)
        answer = rest[:cut].strip().strip("*").strip()
        return "answer is", answer or None, m.start(1) + (stop.end() if stop else len(rest)), len(said)
    return None


def extract_answer(completion: str) -> str | None:
    """The final answer of a worked solution (module docstring), stripped; None without one.

    ``"… so \\boxed{\\frac{1}{2}}.</s>"`` → ``"\\frac{1}{2}"``; ``"…\\n#### 1,234"`` → ``"1,234"``;
    ``"The answer is 12 apples. I hope…"`` → ``"12 apples"``; ``"42"`` → None.
    """
    if not isinstance(completion, str):
        return None
    text, _ = before_eos(completion)
    found = _statement(text[-MAX_TAIL:])
    return found[1] if found else None


# ---------------------------------------------------------------------------- normalising

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm|textrm)\s*\{([^{}]*)\}")
_UNIT_TEXT = re.compile(rf"({_NUMBER})\s*(?:\\(?:text|textbf|mbox|mathrm|textrm)\s*\{{\s*[^{{}}\d]*\}}\s*)+")
_UNIT_WORDS = re.compile(rf"({_NUMBER})\s+[A-Za-z]{{2,}}(?:[\s.\-/]+[A-Za-z]+)*\.?")
_SPACES = re.compile(r"\\[,!;: ]|\\q?quad\b|~")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_CURRENCY = re.compile(r"\\\$|\$|€|£|¥|₹|\\euro\b|\\pounds\b")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°")
_PERCENT = re.compile(r"\s*(?:\\%|%)$")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_PLAIN = re.compile(r"([-+])?(\d+(?:\.\d*)?|\.\d+)")
_SLASH = re.compile(r"([-+])?(\d+)\s*/\s*(\d+)")
_FRAC = re.compile(r"([-+])?\\frac\s*\{\s*([-+]?\d+)\s*\}\s*\{\s*([-+]?\d+)\s*\}|([-+])?\\frac(\d)(\d)")


def normalize_answer(answer: str) -> str:
    """A light normal form of an answer, for both sides of a check: math-mode wrappers
    (``$…$``, ``\\(…\\)``), bold ``**``, a final ``.``, thin spaces, ``\\left``/``\\right``,
    currency signs (``$5`` → ``5``), ``%`` and degree signs, ``\\dfrac``/``\\tfrac`` (→ ``\\frac``),
    thousands separators (``1,234`` → ``1234``, ``1{,}234`` too) and units after a number
    (``12 apples``, ``12\\text{ dollars}`` → ``12``: a word of two letters or more after a space,
    or ``\\text{}`` without digits) are removed; whitespace is collapsed."""
    s = answer.strip()
    s = s.replace("{,}", ",").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _LEFT_RIGHT.sub("", _SPACES.sub(" ", s))
    for _ in range(3):
        s = s.strip().rstrip(".").strip()
        for left, right in _WRAPPERS:
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left):-len(right)].strip()
    whole = _TEXT.fullmatch(s)
    if whole:                                   # \text{12 apples}
        s = whole.group(1).strip()
    s = _CURRENCY.sub("", s)
    s = _DEGREES.sub("", s)
    s = _PERCENT.sub("", s).strip()
    for unit in (_UNIT_TEXT, _UNIT_WORDS):
        m = unit.fullmatch(s)
        if m:
            s = m.group(1)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    return " ".join(s.split())


def _number(s: str) -> tuple[Fraction, bool] | None:
    """``(value, written as a decimal)`` of a normalised plain number (``-3``, ``0.5``, ``3/4``,
    ``\\frac{3}{4}``, ``-\\frac34``); None for anything else or a zero denominator."""
    m = _PLAIN.fullmatch(s)
    if m:
        value = Fraction(m.group(2))
        return (-value if m.group(1) == "-" else value), "." in m.group(2)
    m = _SLASH.fullmatch(s)
    if m and int(m.group(3)):
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return (-value if m.group(1) == "-" else value), False
    m = _FRAC.fullmatch(s)
    if m:
        sign, num, den = (m.group(1), m.group(2), m.group(3)) if m.group(2) else (m.group(4), m.group(5), m.group(6))
        if int(den):
            value = Fraction(int(num), int(den))
            return (-value if sign == "-" else value), False
    return None


def reference_answer(reference: str) -> str:
    """The answer a reference states: its final answer statement (``#### 18``, ``\\boxed{18}``, a
    whole worked solution) when it has one, else the whole reference, stripped."""
    return extract_answer(reference) or str(reference).strip()


# ------------------------------------------------------------------------------- checking

class CheckerError(RuntimeError):
    """The math checker's worker cannot run (math-verify missing, the worker would not start)."""


_STATS = {"checks": 0, "fast": 0, "worker_checks": 0, "timeouts": 0, "worker_deaths": 0, "worker_starts": 0}
_STATS_LOCK = threading.Lock()


def check_stats() -> dict[str, int]:
    """Counters of this process: ``checks`` (answers compared or parsed), ``fast`` (decided
    without math-verify), ``worker_checks`` (sent to the worker), ``timeouts`` (over the limit:
    scored as not equal), ``worker_deaths`` (the worker ended mid-check: not equal),
    ``worker_starts``. A worker that cannot start at all raises ``CheckerError``."""
    with _STATS_LOCK:
        return dict(_STATS)


def _count(key: str) -> None:
    with _STATS_LOCK:
        _STATS[key] += 1


class _Timeout(Exception):
    pass


class _Died(CheckerError):
    """The worker ended in the middle of a check (killed, out of memory, crashed)."""


class _Worker:
    """One persistent child process running math-verify; JSON lines over pipes; one request at a
    time (a lock). Started on first use, and again after a kill or in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.owner = 0
        self.buffer = b""
        self.broken: str | None = None

    def ask(self, message: dict, timeout: float) -> dict:
        with self.lock:
            if self.broken:
                raise CheckerError(self.broken)
            if self.proc is None or self.owner != os.getpid() or self.proc.poll() is not None:
                self._start()
            try:
                self._send(message)
                return self._read(timeout + KILL_GRACE)
            except _Timeout:
                self._kill()
                raise

    def _start(self) -> None:
        if self.proc is not None and self.owner == os.getpid():
            self._kill()
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), *[os.pardir] * 3))   # the folder holding race/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.proc = subprocess.Popen([sys.executable, "-c", "from race.tasks.rewards.answers import serve; serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.owner, self.buffer = os.getpid(), b""
        _count("worker_starts")
        try:
            reply = self._read(STARTUP_TIMEOUT)
        except (_Timeout, _Died) as e:
            self._kill()
            self.broken = f"the math checker's worker did not start ({e or 'no reply'} within {STARTUP_TIMEOUT:g} s)"
            raise CheckerError(self.broken) from None
        if reply.get("fatal"):
            self._kill()
            self.broken = reply["fatal"]
            raise CheckerError(self.broken)

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            self._kill()
            raise _Died("the math checker's worker ended unexpectedly") from None

    def _read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout()
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self._kill()
                    raise _Died("the math checker's worker ended unexpectedly")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and self.owner == os.getpid() and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        with self.lock:
            self._kill()

    def forget(self) -> None:
        """In a forked child: the parent's worker and lock are the parent's; start afresh."""
        self.lock = threading.Lock()
        self.proc, self.owner, self.buffer = None, 0, b""


_WORKER = _Worker()
atexit.register(_WORKER.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_WORKER.forget)


def _ask(message: dict, timeout: float) -> bool:
    """The worker's boolean answer; False (counted) when over ``timeout``."""
    _count("worker_checks")
    try:
        reply = _WORKER.ask({**message, "timeout": timeout}, timeout)
    except _Timeout:
        _count("timeouts")
        return False
    except _Died:                   # out of memory, killed from outside: not equal, and the next check restarts it
        _count("worker_deaths")
        return False
    if reply.get("timeout"):
        _count("timeouts")
    return bool(reply.get("ok"))


@functools.lru_cache(maxsize=8192)
def _worker_equal(gold: str, pred: str, timeout: float) -> bool:
    return _ask({"op": "verify", "gold": gold, "pred": pred}, timeout)


@functools.lru_cache(maxsize=8192)
def _worker_parses(text: str, timeout: float) -> bool:
    return _ask({"op": "parse", "text": text}, timeout)


def _check_timeout(timeout: float) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"check timeout {timeout!r} must be a positive number of seconds")
    return float(timeout)


def answers_equal(answer: str | None, reference: str, *, timeout: float = CHECK_TIMEOUT) -> bool:
    """True iff ``answer`` (an extracted final answer) states the reference's answer
    (``reference_answer``): equal after ``normalize_answer``, or two plain numbers of equal value,
    or equivalent under math-verify (in the worker, within ``timeout`` seconds; over it: False)."""
    timeout = _check_timeout(timeout)
    if not answer or not isinstance(reference, str):
        return False
    _count("checks")
    pred, gold = normalize_answer(answer), normalize_answer(reference_answer(reference))
    if not pred or not gold or len(pred) > MAX_ANSWER or len(gold) > MAX_ANSWER:
        _count("fast")
        return False
    if pred == gold:
        _count("fast")
        return True
    a, b = _number(pred), _number(gold)
    if a is not None and b is not None:
        _count("fast")
        (x, x_decimal), (y, y_decimal) = a, b
        if x_decimal or y_decimal:          # math-verify's float_rounding=6: 0.333333 = 1/3
            return round(x, 6) == round(y, 6)
        return x == y
    return _worker_equal(gold, pred, timeout)


def parses(answer: str | None, *, timeout: float = CHECK_TIMEOUT) -> bool:
    """True iff ``answer`` is a single-line number or expression: a plain number, or text
    math-verify's LaTeX parser turns into a sympy object (within ``timeout``)."""
    timeout = _check_timeout(timeout)
    if not answer or "\n" in answer:
        return False
    _count("checks")
    s = normalize_answer(answer)
    if not s or len(s) > MAX_ANSWER:
        return False
    if _number(s) is not None:
        _count("fast")
        return True
    return _worker_parses(s, timeout)


# -------------------------------------------------------------------------------- rewards

def math_answer(prompt: str, completion: str, reference: str, *, timeout: float = CHECK_TIMEOUT) -> float:
    """Reward ``math``: 1.0 iff the completion's final answer (``extract_answer``) is equivalent to
    the reference's (``answers_equal``: ``1/2 = 0.5 = \\frac{1}{2}``, ``1,234 = 1234``, ``$5 = 5``,
    ``12 apples = 12``, ``18.0 = 18``), else 0.0; a check over ``timeout`` scores 0.0."""
    return 1.0 if answers_equal(extract_answer(completion), reference, timeout=timeout) else 0.0


def answer_format(prompt: str, completion: str, reference: str, *, timeout: float = CHECK_TIMEOUT) -> float:
    """Reward ``format``: 1.0 iff all of

    - the completion is terminated (an EOS / end-of-turn marker, ``EOS_MARKERS``);
    - the text before it has a final answer statement (``extract_answer``'s forms), and exactly one
      statement of that form (one top-level ``\\boxed``/``\\fbox``, or one ``####``, or one
      ``answer is``/``answer:``);
    - nothing but whitespace and closing marks (``. $ * } \\] )``) follows the statement: it ends
      the text;
    - its answer is one line that ``parses`` (a number, or an expression math-verify reads).

    else 0.0. Correctness is not checked (that is ``math``); the reference is not read.
    """
    text, terminated = before_eos(completion) if isinstance(completion, str) else ("", False)
    if not terminated:
        return 0.0
    tail = text[-MAX_TAIL:]
    found = _statement(tail)
    if found is None:
        return 0.0
    _, answer, end, count = found
    if answer is None or count != 1 or not _CLOSING.fullmatch(tail[end:]):
        return 0.0
    return 1.0 if parses(answer, timeout=timeout) else 0.0


def _with_timeout(reward: Callable[..., float], name: str, timeout: float) -> Callable[[str, str, str], float]:
    """``reward`` (``math_answer`` or ``answer_format``) with its own check time limit; the function
    itself at the default limit, so configs that keep it share one cache of checks."""
    timeout = _check_timeout(timeout)
    if timeout == CHECK_TIMEOUT:
        return reward

    def bound(prompt: str, completion: str, reference: str) -> float:
        return reward(prompt, completion, reference, timeout=timeout)
    bound.__name__ = bound.__qualname__ = name
    return bound


def math_reward(timeout: float = CHECK_TIMEOUT) -> Callable[[str, str, str], float]:
    """The ``math`` reward with its own check time limit (``reward.check_timeout``)."""
    return _with_timeout(math_answer, "math", timeout)


def format_reward(timeout: float = CHECK_TIMEOUT) -> Callable[[str, str, str], float]:
    """The ``format`` reward with its own check time limit (``reward.check_timeout``)."""
    return _with_timeout(answer_format, "format", timeout)


def answer_checker(name: str = "math", *, timeout: float = CHECK_TIMEOUT) -> Callable[[str, str, str], bool]:
    """``fn(prompt, completion, reference) -> bool``: is the completion's answer right?

    ``math``: the final answer of a worked solution is equivalent to the reference's
    (``math_answer``), for reasoning tasks (GSM8K, MATH); ``sparse`` (or ``exact``): the text before
    the EOS equals the reference exactly (``race.tasks.rewards.rules.sparse``), for the built-in tasks.
    """
    if name == "math":
        timeout = _check_timeout(timeout)

        def math_correct(prompt: str, completion: str, reference: str) -> bool:
            return math_answer(prompt, completion, reference, timeout=timeout) == 1.0
        return math_correct
    if name in ("sparse", "exact"):
        def exact_correct(prompt: str, completion: str, reference: str) -> bool:
            return sparse(prompt, completion, reference) == 1.0
        return exact_correct
    raise ValueError(f"answer checker {name!r} is unknown: expected one of {', '.join(CHECKERS)} (or 'exact')")


def checker_for(reward_kind: str, mix: dict | None = None) -> str:
    """The checker (``answer_checker`` name) that suits a reward: ``math`` for the ``math`` and
    ``format`` rewards and a ``mix`` with either, else ``sparse``."""
    names = set(mix or ()) if reward_kind == "mix" else {reward_kind}
    return "math" if names & {"math", "format"} else "sparse"


# --------------------------------------------------------------------------------- worker

def serve() -> None:  # pragma: no cover — runs in the worker process (tests drive it through the rewards)
    """The worker's loop: JSON lines in on stdin, replies on stdout. Each check runs under a
    ``setitimer`` alarm of its ``timeout``; math-verify's own (whole-second ``signal.alarm``)
    timeouts are off. Memory is capped (``RLIMIT_AS``, 4 GiB) where the platform allows."""
    import signal

    send = _reply_channel()
    _cap_memory()
    try:
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError:
        send({"fatal": "the math and format rewards need math-verify: pip install 'math-verify>=0.9,<1'"})
        return
    read = _latex_reader(parse, LatexExtractionConfig)
    signal.signal(signal.SIGALRM, _ring)
    send({"ready": True})
    for raw in sys.stdin.buffer:
        msg = json.loads(raw)
        send(_check(msg, read, verify))


class _Alarm(BaseException):     # not an Exception: math-verify's `except Exception` cannot swallow it
    """A check's time is up (the worker's ``SIGALRM``)."""


def _ring(signum, frame):  # pragma: no cover — the worker's SIGALRM handler
    raise _Alarm()


def _reply_channel() -> Callable[[dict], None]:  # pragma: no cover — runs in the worker process
    """The worker's reply channel: a JSON line each on its own copy of stdout, while fd 1 and
    ``sys.stdout`` go to stderr (a library's prints never mix with the replies). A parent gone
    (killed on a timeout): the worker leaves quietly."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        try:
            out.write((json.dumps(obj) + "\n").encode())
            out.flush()
        except (BrokenPipeError, OSError):     # the parent is gone (killed on a timeout): leave quietly
            os._exit(0)

    return send


def _cap_memory() -> None:  # pragma: no cover — runs in the worker process
    """Cap the worker's address space at 4 GiB (``RLIMIT_AS``) where the platform allows."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, ValueError, OSError):
        pass


def _latex_reader(parse: Callable, extraction_config: type) -> Callable:  # pragma: no cover — worker only
    """math-verify's ``parse`` of an answer as LaTeX, with its own timeout off (and its loggers quiet)."""
    import logging

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    config = [extraction_config(boxed_match_priority=0, try_extract_without_anchor=False)]

    def read(text: str):
        # LaTeX only: the answer is put in a box, so math-verify's ExprExtractionConfig path
        # (sympy.parse_expr, which evals) is never taken
        return parse("\\boxed{" + text + "}", extraction_config=config, fallback_mode="no_fallback",
                     parsing_timeout=None)

    return read


def _check(msg: dict, read: Callable, verify: Callable) -> dict:  # pragma: no cover — worker only
    """The reply to one request (``verify`` two answers, or ``parse`` one) under a ``setitimer``
    alarm of its ``timeout``: ``ok``, and ``timeout`` when the alarm rang; a malformed answer is
    not equal, never a crash."""
    import signal

    signal.setitimer(signal.ITIMER_REAL, max(float(msg["timeout"]), 1e-3))
    try:
        if msg["op"] == "verify":
            gold, pred = read(msg["gold"]), read(msg["pred"])
            ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
        else:
            ok = bool(read(msg["text"]))
        signal.setitimer(signal.ITIMER_REAL, 0)
        reply = {"ok": bool(ok)}
    except _Alarm:
        reply = {"ok": False, "timeout": True}
    except Exception:  # noqa: BLE001 — a malformed answer is not equal, never a crash
        signal.setitimer(signal.ITIMER_REAL, 0)
        reply = {"ok": False}
    return reply
