"""Held-out hardening campaign for issue 50 (session 26, 2026-12-06).

About 120 new adversarial cases over the newest surfaces (race probe, race pilot --probe / --design /
--share, race plan --full-run --share --design, race init, race report --full-run, race recipe --emit,
race.fullrun.watch, race.stats.drift / rate / forecast, race.diagnose(design=, share=), config files,
results files, storage URLs with credentials), written without reading the team's own cases.

    python bench/hardening_heldout.py [--only SUBSTRING] [--json OUT.json]

Each case runs in its own temporary folder (CLI cases as `python -m race …` subprocesses, API cases as
`python -c` subprocesses, both under a timeout) and is judged against the issue's rules:

- write-outside: a victim file planted outside the named folder is byte-identical afterwards;
- lost-record:   a user's file is untouched without --force;
- silent-wrong:  an absurd / inverted / NaN / inf / negative / wrong-type input is refused, not answered;
- raw-exception: the CLI exits 2 with ONE line starting "Error:" and no traceback; the API raises a
                 race.core.errors.RaceError subclass whose message names the argument (and value);
- hang:          nothing runs past its timeout;
- late:          a refusal that needs no compute comes before any (no probe / pilot / calibration line,
                 within a few seconds);
- leak:          a password in a storage URL never appears in any output.

A case's expected class is the rule it checks; its verdict is good or bad, with the class of what went
wrong (which can differ from the expected one: a case expecting a refusal that hangs is a hang).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_GZ = os.path.join(ROOT, "docs", "runs", "default.results.json.gz")   # B = 6e11, 4 ρ × 3 seeds
B = 6e11
PY = sys.executable
SECRET = "hunter2Zq9"
# lines that mean compute has started (a refusal after one of them is late)
COMPUTE_MARKERS = ("length probe at F", "probe: ", "calibrat", "pilot 1/", "pilots done", "% of its budget",
                   "rollout", "step 1 ")
CLI_FAST = 12.0          # a refusal that needs no compute comes within this many seconds (2 busy cores)


@dataclass
class Outcome:
    verdict: str          # good / bad
    cls: str              # the class of what went wrong ('' when good)
    got: str


@dataclass
class Case:
    name: str
    surface: str
    expected: str         # the rule's class
    run: Callable[[str], Outcome]


CASES: list[Case] = []


def case(name: str, surface: str, expected: str):
    def deco(fn):
        CASES.append(Case(name, surface, expected, fn))
        return fn
    return deco


# ------------------------------------------------------------------ helpers

def sha(path: str) -> str:
    if os.path.islink(path) and not os.path.exists(path):
        return "dangling"
    if not os.path.exists(path):
        return "missing"
    if os.path.isdir(path):
        h = hashlib.sha256()
        for r, ds, fs in sorted(os.walk(path)):
            for f in sorted(fs):
                p = os.path.join(r, f)
                h.update(p.encode())
                h.update(open(p, "rb").read() if os.path.isfile(p) else b"?")
        return h.hexdigest()
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def victim(tmp: str, name: str = "victim.txt", text: str = "precious user data\n") -> str:
    """A file outside the folder a case names (tmp/outside/NAME)."""
    d = os.path.join(tmp, "outside")
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def results_dir(tmp: str, name: str = "r", mutate: Callable[[dict], None] | None = None,
                raw: str | None = None) -> str:
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "results.json")
    if raw is not None:
        with open(p, "w") as f:
            f.write(raw)
        return d
    data = json.load(gzip.open(RESULTS_GZ))
    if mutate:
        mutate(data)
    with open(p, "w") as f:
        json.dump(data, f)
    return d


CONFIG = """\
model: race/tiny-arith
task: arithmetic-easy
budget: 2.0e12
grid: [0.3, 0.6, 0.85]
seeds: 1
name: heldout
"""


def config(tmp: str, extra: str = "", name: str = "c.yaml") -> str:
    p = os.path.join(tmp, name)
    with open(p, "w") as f:
        f.write(CONFIG + extra)
    return p


@dataclass
class Run:
    rc: int | None
    out: str
    err: str
    secs: float
    timed_out: bool


def cli(tmp: str, args: list[str], timeout: float = 30.0, env: dict | None = None) -> Run:
    t0 = time.monotonic()
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **(env or {}))
    p = subprocess.Popen([PY, "-m", "race", *args], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=e, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return Run(p.returncode, out, err, time.monotonic() - t0, False)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        return Run(None, out, err, time.monotonic() - t0, True)


def short(s: str, n: int = 110) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def last_line(r: Run) -> str:
    lines = [l for l in r.err.splitlines() if l.strip()]
    return lines[-1] if lines else (r.out.strip().splitlines() or [""])[-1]


def leak(r: Run) -> bool:
    return SECRET in r.out or SECRET in r.err


def _names_for(args) -> tuple[str, ...]:
    """What a refusal of these pilot/plan options must name (empty: anything)."""
    a = list(args)
    if "--share" in a:
        v = a[a.index("--share") + 1]
        try:
            bad = not (0 < float(v) < 1)
        except ValueError:
            bad = True
        if bad:
            return ("share",)
    return ()


def judge_refusal(r: Run, *, fast: float = CLI_FAST, why: str = "", names: tuple[str, ...] = ()) -> Outcome:
    """The CLI must refuse: exit 2, one 'Error:' line, no traceback, before any compute."""
    if leak(r):
        return Outcome("bad", "leak", "password printed: " + short(last_line(r)))
    if r.timed_out:
        started = any(m in r.err for m in COMPUTE_MARKERS + ("RACE pilot grid",))
        return Outcome("bad", "late" if started else "hang",
                       f"still running after {r.secs:.0f} s" + (" (compute started: " + short(
                           next(l for l in r.err.splitlines() if any(m in l for m in COMPUTE_MARKERS + ("RACE pilot grid",))), 70) + ")"
                                                               if started else ""))
    if "Traceback" in r.err or "Traceback" in r.out:
        return Outcome("bad", "raw-exception", "traceback: " + short(last_line(r)))
    errs = [l for l in r.err.splitlines() if l.startswith("Error:")]
    if r.rc == 0:
        return Outcome("bad", "silent-wrong", "exit 0: " + short(r.out.strip().splitlines()[-1] if r.out.strip() else r.err))
    if r.rc != 2 or len(errs) != 1:
        return Outcome("bad", "raw-exception", f"exit {r.rc}, {len(errs)} Error: lines: " + short(last_line(r)))
    before = r.err.split(errs[0])[0]
    if any(m in before for m in COMPUTE_MARKERS) or r.secs > fast:
        return Outcome("bad", "late", f"refused after {r.secs:.0f} s: " + short(errs[0]))
    if names and not any(n in errs[0] for n in names):
        return Outcome("bad", "silent-wrong", "refused for another reason, not the bad "
                       + "/".join(names) + ": " + short(errs[0], 80))
    return Outcome("good", "", f"exit 2 in {r.secs:.1f} s: " + short(errs[0], 90))


def judge_ok(r: Run, *, must: tuple[str, ...] = (), forbid: tuple[str, ...] = ("nan", "inf")) -> Outcome:
    """The CLI should answer (exit 0), with no traceback, no leak, no NaN/inf in what it prints."""
    if leak(r):
        return Outcome("bad", "leak", "password printed")
    if r.timed_out:
        return Outcome("bad", "hang", f"still running after {r.secs:.0f} s")
    if "Traceback" in r.err:
        return Outcome("bad", "raw-exception", "traceback: " + short(last_line(r)))
    if r.rc != 0:
        return Outcome("bad", "silent-wrong", f"exit {r.rc}: " + short(last_line(r)))
    words = set(r.out.lower().replace(",", " ").replace("(", " ").replace(")", " ").split())
    bad = [f for f in forbid if f in words]
    if bad:
        return Outcome("bad", "silent-wrong", f"prints {bad}")
    miss = [m for m in must if m not in r.out + r.err]
    if miss:
        return Outcome("bad", "silent-wrong", f"missing {miss}")
    return Outcome("good", "", "exit 0: " + short(r.out.strip().splitlines()[0] if r.out.strip() else ""))


API_WRAP = r"""
import json, sys, time, math
t0 = time.monotonic()
try:
    from race.core.errors import RaceError
    ns = {}
    exec(compile(sys.argv[1], "<case>", "exec"), ns)
    r = ns.get("result")
    print(json.dumps({"ok": True, "result": repr(r)[:400], "secs": time.monotonic() - t0}))
except BaseException as e:
    print(json.dumps({"ok": False, "type": type(e).__module__ + "." + type(e).__qualname__,
                      "race": isinstance(e, RaceError), "msg": str(e)[:400], "secs": time.monotonic() - t0}))
"""


def api(tmp: str, code: str, timeout: float = 30.0) -> dict:
    t0 = time.monotonic()
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    p = subprocess.Popen([PY, "-c", API_WRAP, textwrap.dedent(code)], cwd=tmp, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=e, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, err = p.communicate()
        return {"hang": True, "secs": time.monotonic() - t0, "stderr": err, "stdout": out}
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if not lines:
        return {"crash": True, "rc": p.returncode, "stderr": err[-400:], "stdout": out[-400:]}
    d = json.loads(lines[-1])
    d["stdout"], d["stderr"] = out, err
    return d


def judge_api_refusal(d: dict, names: tuple[str, ...] = (), *, fast: float | None = None,
                      hang_cls: str = "hang") -> Outcome:
    """The API must raise a RaceError subclass whose message names the argument."""
    if d.get("hang"):
        return Outcome("bad", hang_cls, f"no answer after {d['secs']:.0f} s" +
                       (" (accepted: pilots started)" if hang_cls == "late" else ""))
    if d.get("crash"):
        return Outcome("bad", "raw-exception", f"process died rc {d['rc']}: " + short(d["stderr"]))
    if SECRET in json.dumps(d):
        return Outcome("bad", "leak", "password in the message")
    if d["ok"]:
        return Outcome("bad", "silent-wrong", "returned " + short(d["result"], 90))
    if not d["race"]:
        return Outcome("bad", "raw-exception", f"{d['type']}: " + short(d["msg"], 90))
    if names and not any(n in d["msg"] for n in names):
        return Outcome("bad", "raw-exception", f"{d['type'].split('.')[-1]} names none of {list(names)}: " + short(d["msg"], 80))
    if fast is not None and d["secs"] > fast:
        return Outcome("bad", "late", f"refused after {d['secs']:.0f} s: " + short(d["msg"], 80))
    return Outcome("good", "", f"{d['type'].split('.')[-1]}: " + short(d["msg"], 90))


def judge_api_ok(d: dict, check: Callable[[str], str | None] | None = None) -> Outcome:
    if d.get("hang"):
        return Outcome("bad", "hang", f"no answer after {d['secs']:.0f} s")
    if d.get("crash"):
        return Outcome("bad", "raw-exception", f"process died rc {d['rc']}")
    if not d["ok"]:
        return Outcome("bad", "raw-exception" if not d["race"] else "silent-wrong", f"{d['type']}: " + short(d["msg"], 90))
    why = check(d["result"]) if check else None
    if why:
        return Outcome("bad", "silent-wrong", why)
    return Outcome("good", "", "returned " + short(d["result"], 90))


# ------------------------------------------------------------------ race probe

def _probe(tmp, *extra, mutate=None, timeout=25.0):
    d = results_dir(tmp, mutate=mutate)
    return cli(tmp, ["probe", d, *extra], timeout=timeout)


for _n, _f in [("zero", "0"), ("negative", "-6e12"), ("nan", "nan"), ("inf", "inf"), ("junk", "6e12abc"),
               ("below B", "3e11"), ("equal B", "6e11"), ("10^30 x B", "6e41"), ("past MAX_FACTOR 2000 x B", "1.2e15"),
               ("overflow 1e999", "1e999")]:
    case(f"probe --full-run {_n}", "race probe", "silent-wrong" if "x B" in _n else "raw-exception")(
        (lambda f: lambda tmp: judge_refusal(_probe(tmp, "--full-run", f)))(_f))

for _opt, _v in [("--rho", "0"), ("--rho", "1"), ("--rho", "nan"), ("--rho", "-0.4"), ("--lr", "0"), ("--lr", "-1e-3"),
                 ("--lr", "nan"), ("--lr", "inf"), ("--lr", "1e9"), ("--device", "cuda:97"), ("--device", "tpu")]:
    case(f"probe {_opt} {_v}", "race probe", "silent-wrong")(
        (lambda o, v: lambda tmp: judge_refusal(_probe(tmp, "--full-run", "6e12", o, v)))(_opt, _v))


@case("probe on a missing results path", "race probe", "raw-exception")
def _(tmp):
    return judge_refusal(cli(tmp, ["probe", "nope/results.json", "--full-run", "6e12"]))


@case("probe on an empty results.json", "race probe", "raw-exception")
def _(tmp):
    return judge_refusal(cli(tmp, ["probe", results_dir(tmp, raw=""), "--full-run", "6e12"]))


@case("probe on binary garbage", "race probe", "raw-exception")
def _(tmp):
    d = os.path.join(tmp, "r")
    os.makedirs(d)
    open(os.path.join(d, "results.json"), "wb").write(bytes(range(256)) * 8)
    return judge_refusal(cli(tmp, ["probe", d, "--full-run", "6e12"]))


@case("probe on a JSON array", "race probe", "raw-exception")
def _(tmp):
    return judge_refusal(cli(tmp, ["probe", results_dir(tmp, raw="[1, 2, 3]"), "--full-run", "6e12"]))


@case("probe on results with a duplicated 'config' key", "race probe", "silent-wrong")
def _(tmp):
    data = json.load(gzip.open(RESULTS_GZ))
    cfg = json.dumps(dict(data["config"], budget=6e13))
    text = json.dumps(data)
    text = text[:-1] + ', "config": ' + cfg + "}"          # a second 'config', with another budget
    return judge_refusal(cli(tmp, ["probe", results_dir(tmp, raw=text), "--full-run", "6e12"]))


@case("probe on results whose config budget is NaN", "race probe", "silent-wrong")
def _(tmp):
    return judge_refusal(_probe(tmp, "--full-run", "6e12", mutate=lambda d: d["config"].update(budget=float("nan"))))


@case("probe on results whose config budget is negative", "race probe", "silent-wrong")
def _(tmp):
    return judge_refusal(_probe(tmp, "--full-run", "6e12", mutate=lambda d: d["config"].update(budget=-6e11)))


@case("probe on results with no pilots", "race probe", "raw-exception")
def _(tmp):
    return judge_refusal(_probe(tmp, "--full-run", "6e12", mutate=lambda d: d.update(pilots=[])))


@case("probe on results whose 'probes' is a string", "race probe", "raw-exception")
def _(tmp):
    return judge_refusal(_probe(tmp, "--full-run", "6e12", mutate=lambda d: d.update(probes="tampered")))


@case("probe on a results.json that is a FIFO", "race probe", "hang")
def _(tmp):
    d = os.path.join(tmp, "r")
    os.makedirs(d)
    os.mkfifo(os.path.join(d, "results.json"))
    return judge_refusal(cli(tmp, ["probe", d, "--full-run", "6e12"], timeout=20))


@case("probe on a folder without results.json", "race probe", "raw-exception")
def _(tmp):
    os.makedirs(os.path.join(tmp, "empty"))
    return judge_refusal(cli(tmp, ["probe", "empty", "--full-run", "6e12"]))


@case("probe on a results.json symlinked outside, F absurd", "race probe", "write-outside")
def _(tmp):
    v = victim(tmp, "results.json", json.dumps(json.load(gzip.open(RESULTS_GZ))))
    before = sha(v)
    os.makedirs(os.path.join(tmp, "r"))
    os.symlink(v, os.path.join(tmp, "r", "results.json"))
    o = judge_refusal(cli(tmp, ["probe", "r", "--full-run", "6e41"]))
    if sha(v) != before:
        return Outcome("bad", "write-outside", "the symlink's target changed")
    return o


@case("probe: storage URL with a password in the results file", "race probe", "leak")
def _(tmp):
    r = _probe(tmp, "--full-run", "6e41",
               mutate=lambda d: d.update(storage=f"postgresql://alice:{SECRET}@db.example:5432/race"))
    return judge_refusal(r)


# ------------------------------------------------------------------ race pilot --probe / --design / --share

PILOT = ["pilot", "--budget", "6e11", "--grid", "0.3,0.6,0.85", "--seeds", "1", "--workers", "1", "--out", "p"]


def _pilot(tmp, *extra, timeout=25.0, cfg=None):
    base = PILOT[1:] if "--design" not in extra else PILOT[3:]      # a sized design sets the budget itself
    args = ["pilot"] + ([cfg] if cfg else []) + base + list(extra)
    return cli(tmp, args, timeout=timeout)


for _n, _x in [
    ("--probe without --full-run", ["--probe"]),
    ("--probe --full-run = B", ["--probe", "--full-run", "6e11"]),
    ("--probe --full-run 10^30 x B", ["--probe", "--full-run", "6e41"]),
    ("--probe --full-run past MAX_FACTOR (5000 x B)", ["--probe", "--full-run", "3e15"]),
    ("--full-run nan", ["--full-run", "nan"]),
    ("--full-run -1e12", ["--full-run", "-1e12"]),
    ("--design fit without --full-run", ["--design", "fit"]),
    ("--design fit --share 0", ["--design", "fit", "--full-run", "1e12", "--share", "0"]),
    ("--design fit --share 1.5", ["--design", "fit", "--full-run", "1e12", "--share", "1.5"]),
    ("--design fit --share nan", ["--design", "fit", "--full-run", "1e12", "--share", "nan"]),
    ("--design flat --share -0.1", ["--design", "flat", "--full-run", "1e12", "--share", "-0.1"]),
    ("--design flat, share too small for the grid", ["--design", "flat", "--full-run", "1e10", "--share", "0.01"]),
    ("--design fit, share buys no pilot", ["--design", "fit", "--full-run", "1e9", "--share", "0.001"]),
    ("--share with --design grid (ignored?)", ["--design", "grid", "--share", "0.3"]),
    ("--share without --design or --full-run", ["--share", "0.2"]),
    ("--design fit --share inf", ["--design", "fit", "--full-run", "1e12", "--share", "inf"]),
    ("--full-run 1e999", ["--full-run", "1e999", "--probe"]),
]:
    case(f"pilot {_n}", "race pilot", "late" if ("probe" in _n or "design" in _n) else "raw-exception")(
        (lambda x: lambda tmp: judge_refusal(_pilot(tmp, *x), names=_names_for(x)))(_x))


@case("pilot --storage postgresql with a password, unreachable", "race pilot", "leak")
def _(tmp):
    r = _pilot(tmp, "--storage", f"postgresql://alice:{SECRET}@127.0.0.1:1/race", "--full-run", "nan")
    return judge_refusal(r)


@case("pilot --storage mysql with a password, unreachable, valid otherwise", "race pilot", "leak")
def _(tmp):
    r = _pilot(tmp, "--storage", f"mysql://bob:{SECRET}@127.0.0.1:1/race", timeout=40)
    if leak(r):
        return Outcome("bad", "leak", "password printed")
    return judge_refusal(r, fast=40)


@case("pilot --out is an existing file", "race pilot", "lost-record")
def _(tmp):
    p = os.path.join(tmp, "p")
    open(p, "w").write("mine\n")
    o = judge_refusal(_pilot(tmp, timeout=25))
    if open(p).read() != "mine\n":
        return Outcome("bad", "lost-record", "the file was replaced")
    return o


# config files: pilot_design / pilot_share
def _judge_config_pilot(tmp, extra):
    c = config(tmp, extra)
    if "'0.1'" in extra:           # a quoted number: read as 0.1 or refused, never another value
        d = api(tmp, f"import race; result = race.load_config({c!r}).pilot_share")
        if d.get("ok") and d["result"] in ("0.1",):
            return Outcome("good", "", "read as the number 0.1")
        return judge_api_refusal(d, ("pilot_share",))
    return judge_refusal(cli(tmp, ["pilot", c, "--workers", "1", "--out", "p"], timeout=25))


for _n, _x in [("pilot_share: 2", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: 2\n"),
               ("pilot_share: .nan", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: .nan\n"),
               ("pilot_share: '0.1' (a string)", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: '0.1'\n"),
               ("pilot_share: true", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: true\n"),
               ("pilot_share: 0", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: 0\n"),
               ("pilot_design: Fit", "full_run_budget: 1.0e12\npilot_design: Fit\n"),
               ("pilot_design: 3", "full_run_budget: 1.0e12\npilot_design: 3\n"),
               ("pilot_design: fit without full_run_budget", "pilot_design: fit\n"),
               ("pilot_share twice (duplicate key)", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: 0.1\npilot_share: 0.9\n"),
               ("pilot_share: 1.0e-300", "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: 1.0e-300\n")]:
    if _n in ("pilot_share: '0.1' (a string)", "pilot_design: fit without full_run_budget", "pilot_share: 1.0e-300"):
        # race plan plans the grid as written without a full run; race pilot is where a design sizes pilots
        case(f"config {_n} (race pilot)", "config", "late")(
            (lambda x: lambda tmp: _judge_config_pilot(tmp, x))(_x))
        continue
    case(f"config {_n} (race plan)", "config", "silent-wrong")(
        (lambda x: lambda tmp: judge_refusal(cli(tmp, ["plan", config(tmp, x)]), names=(
            ("full_run_budget", "full-run", "full run") if "without" in x or "pilot_design: fit\n" == x[-17:] and "full_run" not in x
            else ("pilot_share", "share", "pilot_design", "pilot design", "repeats"))))(_x))


@case("config pilot_share: 2 (race pilot)", "config", "late")
def _(tmp):
    c = config(tmp, "full_run_budget: 1.0e12\npilot_design: fit\npilot_share: 2\n")
    return judge_refusal(cli(tmp, ["pilot", c, "--workers", "1", "--out", "p"], timeout=25))


# ------------------------------------------------------------------ race plan --full-run --share --design

for _n, _x in [("--share 0", ["--full-run", "6e12", "--share", "0"]),
               ("--share 1", ["--full-run", "6e12", "--share", "1"]),
               ("--share nan", ["--full-run", "6e12", "--share", "nan"]),
               ("--share inf", ["--full-run", "6e12", "--share", "inf"]),
               ("--share -0.1", ["--full-run", "6e12", "--share", "-0.1"]),
               ("--full-run 0", ["--full-run", "0"]),
               ("--full-run -6e12", ["--full-run", "-6e12"]),
               ("--full-run nan", ["--full-run", "nan"]),
               ("--design bogus", ["--full-run", "6e12", "--design", "bogus"]),
               ("--share without --full-run", ["--share", "0.2"]),
               ("--design flat without --full-run", ["--design", "flat"]),
               ("--design flat, share too small", ["--full-run", "1e10", "--share", "0.01", "--design", "flat"]),
               ("--share '0,1'", ["--full-run", "6e12", "--share", "0,1"]),
               ("--budget nan", ["--full-run", "6e12", "--budget", "nan"])]:
    case(f"plan {_n}", "race plan", "silent-wrong")(
        (lambda x: lambda tmp: judge_refusal(cli(tmp, ["plan", config(tmp), *x]), names=_names_for(x)))(_x))


@case("plan --full-run 1e40 --format json (no NaN/inf in the answer)", "race plan", "silent-wrong")
def _(tmp):
    r = cli(tmp, ["plan", config(tmp), "--full-run", "1e40", "--format", "json"])
    if r.rc == 2:
        return judge_refusal(r)
    o = judge_ok(r)
    if o.verdict == "good" and any(t in r.out for t in ("NaN", "Infinity")):
        return Outcome("bad", "silent-wrong", "JSON holds NaN / Infinity")
    return o


@case("plan --full-run 6e12 --design prior (sanity: answers)", "race plan", "silent-wrong")
def _(tmp):
    return judge_ok(cli(tmp, ["plan", config(tmp), "--full-run", "6e12", "--design", "prior"]))


# ------------------------------------------------------------------ race init

INIT = ["init", "--model", "race/tiny-arith", "--task", "arithmetic-easy"]


for _n, _x in [("--share 0", ["--full-run", "6e12", "--share", "0"]),
               ("--share 1", ["--full-run", "6e12", "--share", "1"]),
               ("--share nan", ["--full-run", "6e12", "--share", "nan"]),
               ("--share -0.2", ["--full-run", "6e12", "--share", "-0.2"]),
               ("--full-run nan", ["--full-run", "nan"]),
               ("--full-run -5e18", ["--full-run", "-5e18"]),
               ("--full-run 0", ["--full-run", "0"]),
               ("--full-run inf", ["--full-run", "inf"])]:
    case(f"init {_n}", "race init", "silent-wrong")(
        (lambda x: lambda tmp: judge_refusal(cli(tmp, INIT + x)))(_x))


@case("init --out an existing file without --force", "race init", "lost-record")
def _(tmp):
    p = os.path.join(tmp, "mine.yaml")
    open(p, "w").write("# my edited config\n")
    o = judge_refusal(cli(tmp, INIT + ["--full-run", "6e12", "--out", "mine.yaml"]))
    return o if open(p).read() == "# my edited config\n" else Outcome("bad", "lost-record", "the file was replaced")


@case("init --out a symlink to a file outside, --force", "race init", "write-outside")
def _(tmp):
    v = victim(tmp)
    before = sha(v)
    os.makedirs(os.path.join(tmp, "w"))
    os.symlink(v, os.path.join(tmp, "w", "c.yaml"))
    r = cli(tmp, INIT + ["--full-run", "6e12", "--out", "w/c.yaml", "--force"])
    if sha(v) != before:
        return Outcome("bad", "write-outside", "wrote through the symlink into outside/victim.txt")
    if r.rc == 0 or r.rc == 2:
        return Outcome("good", "", f"exit {r.rc}; victim untouched")
    return judge_refusal(r)


@case("init --out a dangling symlink pointing outside", "race init", "write-outside")
def _(tmp):
    os.makedirs(os.path.join(tmp, "w"))
    os.makedirs(os.path.join(tmp, "outside"))
    target = os.path.join(tmp, "outside", "new.yaml")
    os.symlink(target, os.path.join(tmp, "w", "c.yaml"))
    r = cli(tmp, INIT + ["--full-run", "6e12", "--out", "w/c.yaml", "--force"])
    if os.path.exists(target):
        return Outcome("bad", "write-outside", "created outside/new.yaml through the dangling symlink")
    return Outcome("good", "", f"exit {r.rc}; nothing outside") if r.rc in (0, 2) and "Traceback" not in r.err \
        else judge_refusal(r)


@case("init --out a hard link to a file outside, --force", "race init", "write-outside")
def _(tmp):
    v = victim(tmp)
    before = sha(v)
    os.makedirs(os.path.join(tmp, "w"))
    os.link(v, os.path.join(tmp, "w", "c.yaml"))
    r = cli(tmp, INIT + ["--full-run", "6e12", "--out", "w/c.yaml", "--force"])
    if sha(v) != before:
        return Outcome("bad", "write-outside", "rewrote the hard link's shared inode (outside/victim.txt changed)")
    return Outcome("good", "", f"exit {r.rc}; victim untouched") if "Traceback" not in r.err else judge_refusal(r)


@case("init --out a FIFO, --force", "race init", "hang")
def _(tmp):
    os.mkfifo(os.path.join(tmp, "c.yaml"))
    r = cli(tmp, INIT + ["--full-run", "6e12", "--out", "c.yaml", "--force"], timeout=25)
    if r.timed_out:
        return Outcome("bad", "hang", f"still running after {r.secs:.0f} s")
    return Outcome("good", "", f"exit {r.rc}") if r.rc in (0, 2) and "Traceback" not in r.err else judge_refusal(r)


@case("init --out an existing directory", "race init", "lost-record")
def _(tmp):
    os.makedirs(os.path.join(tmp, "d"))
    return judge_refusal(cli(tmp, INIT + ["--full-run", "6e12", "--out", "d", "--force"]))


@case("init writes pilot_design / pilot_share that load and plan", "race init", "silent-wrong")
def _(tmp):
    r = cli(tmp, INIT + ["--full-run", "6e12", "--share", "0.2", "--out", "c.yaml"])
    if r.rc != 0:
        return judge_ok(r)
    text = open(os.path.join(tmp, "c.yaml")).read()
    if "pilot_share" not in text or "pilot_design" not in text:
        return Outcome("bad", "silent-wrong", "no pilot_design / pilot_share key written")
    d = api(tmp, "import race; c = race.load_config('c.yaml'); result = (c.pilot_design, c.pilot_share, c.full_run_budget)")
    return judge_api_ok(d, lambda s: None if "0.2" in s else f"loaded {s}, not share 0.2")


@case("init --full-run 1e60 (absurd)", "race init", "silent-wrong")
def _(tmp):
    r = cli(tmp, INIT + ["--full-run", "1e60"])
    return judge_refusal(r) if r.rc != 0 else judge_ok(r)


# ------------------------------------------------------------------ race report --full-run

def _report(tmp, *extra, mutate=None, raw=None, timeout=30.0):
    d = results_dir(tmp, mutate=mutate, raw=raw)
    return cli(tmp, ["report", d, *extra], timeout=timeout)


for _n, _f in [("nan", "nan"), ("-1", "-1"), ("0", "0"), ("junk", "1e12x")]:
    case(f"report --full-run {_n}", "race report", "silent-wrong")(
        (lambda f: lambda tmp: judge_refusal(_report(tmp, "--full-run", f)))(_f))


@case("report --full-run 10^30 x B (no answer at F)", "race report", "silent-wrong")
def _(tmp):
    r = _report(tmp, "--full-run", "6e41")
    if r.rc == 2:
        return judge_refusal(r)
    o = judge_ok(r)
    if o.verdict == "bad":
        return o
    if "stable" in r.out.lower().replace("not tested", "").replace("unstable", "") and "refus" not in r.out.lower():
        return Outcome("bad", "silent-wrong", "a stability statement at 10^30 × B with no refusal")
    return Outcome("good", "", "exit 0 with the forecast refused")


_PROBE_REC = {"full_run_budget": 6e12, "rho": 0.55, "learning_rate": 1e-3, "schedule_kind": "constant",
              "steps": 7780, "prompts_per_step": 1, "n_gen": 8, "full_steps": 7780, "covers": 1.0,
              "planned_covers": 1.0, "budget": 1e11, "share": 0.02, "target": "reward",
              "curve": [{"fraction": 0.0, "step": 0, "mean": 0.40}, {"fraction": 0.5, "step": 3890, "mean": 0.55},
                        {"fraction": 1.0, "step": 7780, "mean": 0.60}],
              "status": "held", "fall": None, "pilot_status": "complete", "wall_seconds": 1.0}


def _tampered(**kw):
    rec = dict(_PROBE_REC)
    for k, v in kw.items():
        if v is _DROP:
            rec.pop(k)
        else:
            rec[k] = v
    return lambda d: d.update(probes=[rec])


_DROP = object()

for _n, _kw in [("without 'covers'", {"covers": _DROP}), ("'covers' a string", {"covers": "all"}),
                ("'covers' 7 (over 100 %)", {"covers": 7.0}), ("'status' bogus", {"status": "maybe"}),
                ("'learning_rate' NaN", {"learning_rate": float("nan")}),
                ("'learning_rate' negative", {"learning_rate": -1e-3})]:
    case(f"report --full-run F, probe record {_n}", "race report", "silent-wrong")(
        (lambda kw: lambda tmp: _judge_tampered(tmp, kw))(_kw))


def _judge_tampered(tmp, kw):
    r = _report(tmp, "--full-run", "6e12", mutate=_tampered(**kw))
    o = judge_refusal(r)
    if r.rc == 0:
        line = next((l.strip() for l in r.out.splitlines() if "stability at F" in l), "")
        return Outcome("bad", "silent-wrong", "exit 0, read the record: " + short(line, 150))
    if o.verdict == "good" and ("results.json" not in r.err and "probe" not in r.err):
        return Outcome("bad", "raw-exception", "names neither the file nor the probe: " + short(last_line(r)))
    return o


@case("report on results with a duplicated 'diagnosis' key", "race report", "silent-wrong")
def _(tmp):
    text = json.dumps(json.load(gzip.open(RESULTS_GZ)))
    text = text[:-1] + ', "diagnosis": {"primary_target": "reward"}}'
    return judge_refusal(_report(tmp, raw=text))


@case("report on results with 'pilots' a mapping", "race report", "raw-exception")
def _(tmp):
    return judge_refusal(_report(tmp, mutate=lambda d: d.update(pilots={"a": 1})))


@case("report on deeply nested JSON (recursion)", "race report", "raw-exception")
def _(tmp):
    return judge_refusal(_report(tmp, raw="[" * 100000 + "]" * 100000))


@case("report on a gzip bomb (1 GiB of zeros)", "race report", "hang")
def _(tmp):
    d = os.path.join(tmp, "r")
    os.makedirs(d)
    with gzip.open(os.path.join(d, "results.json"), "wb", compresslevel=1) as f:
        chunk = b" " * (1 << 20)
        for _ in range(1024):
            f.write(chunk)
    return judge_refusal(cli(tmp, ["report", d], timeout=30), fast=20)


@case("report on a results.json FIFO", "race report", "hang")
def _(tmp):
    d = os.path.join(tmp, "r")
    os.makedirs(d)
    os.mkfifo(os.path.join(d, "results.json"))
    return judge_refusal(cli(tmp, ["report", d], timeout=20))


@case("report --storage postgresql with a password, unreachable", "race report", "leak")
def _(tmp):
    return judge_refusal(cli(tmp, ["report", "--storage", f"postgresql://bob:{SECRET}@127.0.0.1:1/x", "--study", "s"],
                             timeout=40), fast=40)


@case("report --storage mysql with a password in the query string", "race report", "leak")
def _(tmp):
    return judge_refusal(cli(tmp, ["report", "--storage", f"mysql://127.0.0.1:1/x?user=bob&password={SECRET}",
                                   "--study", "s"], timeout=40), fast=40)


@case("report results file whose storage holds a password", "race report", "leak")
def _(tmp):
    r = _report(tmp, "--format", "json", mutate=lambda d: d.update(storage=f"postgresql://alice:{SECRET}@db:5432/r"))
    if leak(r):
        return Outcome("bad", "leak", "password printed by report --format json")
    return judge_ok(r, forbid=())


@case("report --pool a missing file", "race report", "raw-exception")
def _(tmp):
    return judge_refusal(_report(tmp, "--full-run", "6e12", "--pool", "nope.json"))


# ------------------------------------------------------------------ race recipe --emit

def _recipe(tmp, *extra, timeout=40.0):
    base = os.path.join(tmp, "base.json")
    if not os.path.exists(base):
        with open(base, "w") as f:
            json.dump(json.load(gzip.open(RESULTS_GZ)), f)
    return cli(tmp, ["recipe", "base.json", "--for", "trl", "--full-run", "6e12", *extra], timeout=timeout)


def _emit_case(setup, *, force: bool, want_refusal: bool, watch_outside=True):
    def run(tmp):
        e = os.path.join(tmp, "e")
        os.makedirs(e, exist_ok=True)
        watched = setup(tmp, e)              # paths that must be untouched
        before = {p: sha(p) for p in watched}
        r = _recipe(tmp, "--emit", "e", *(["--force"] if force else []))
        changed = [os.path.relpath(p, tmp) for p in watched if sha(p) != before[p]]
        created = os.listdir(os.path.join(tmp, "outside")) if os.path.isdir(os.path.join(tmp, "outside")) else []
        if changed:
            cls = "write-outside" if any(c.startswith("outside") for c in changed) else "lost-record"
            return Outcome("bad", cls, f"changed {changed}; exit {r.rc}")
        if want_refusal:
            return judge_refusal(r)
        if r.timed_out:
            return Outcome("bad", "hang", f"still running after {r.secs:.0f} s")
        if "Traceback" in r.err:
            return Outcome("bad", "raw-exception", short(last_line(r)))
        return Outcome("good", "", f"exit {r.rc}; untouched: {len(watched)} watched path(s)")
    return run


def _s_user_file(tmp, e):
    p = os.path.join(e, "notes.txt")
    open(p, "w").write("my notes\n")
    return [p]


def _s_edited_reward(tmp, e):
    p = os.path.join(e, "race_reward.py")
    open(p, "w").write("# my edited reward\n")
    return [p]


def _s_link(rel):
    def s(tmp, e):
        v = victim(tmp)
        p = os.path.join(e, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.symlink(v, p)
        return [v]
    return s


def _s_hardlink(rel):
    def s(tmp, e):
        v = victim(tmp)
        p = os.path.join(e, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        os.link(v, p)
        return [v]
    return s


def _s_dirlink(rel):
    def s(tmp, e):
        out = os.path.join(tmp, "outside", "dir")
        os.makedirs(out)
        open(os.path.join(out, "keep.txt"), "w").write("keep\n")
        os.symlink(out, os.path.join(e, rel))
        return [out]
    return s


def _s_dangling(rel):
    def s(tmp, e):
        os.makedirs(os.path.join(tmp, "outside"), exist_ok=True)
        os.symlink(os.path.join(tmp, "outside", "created"), os.path.join(e, rel))
        return [os.path.join(tmp, "outside", "created")]
    return s


for _n, _s, _force, _ref in [
    ("non-empty DIR (a user file), no --force", _s_user_file, False, True),
    ("an edited race_reward.py, no --force", _s_edited_reward, False, True),
    ("a user file, --force (left alone)", _s_user_file, True, False),
    ("symlink race_reward.py → outside, --force", _s_link("race_reward.py"), True, True),
    ("symlink data/train.jsonl → outside, --force", _s_link("data/train.jsonl"), True, True),
    ("symlink train_trl.py → outside, --force", _s_link("train_trl.py"), True, True),
    ("symlink recipe.json → outside, no --force", _s_link("recipe.json"), False, True),
    ("symlink model/config.json → outside, --force", _s_link("model/config.json"), True, True),
    ("data/ a symlink to an outside folder, --force", _s_dirlink("data"), True, True),
    ("model/ a symlink to an outside folder, --force", _s_dirlink("model"), True, True),
    ("dangling symlink race_config.json → outside, --force", _s_dangling("race_config.json"), True, True),
    ("hard link race_reward.py ↔ outside, --force", _s_hardlink("race_reward.py"), True, False),
    ("hard link data/test.jsonl ↔ outside, --force", _s_hardlink("data/test.jsonl"), True, False),
]:
    case(f"recipe --emit: {_n}", "race recipe --emit", "write-outside" if "outside" in _n else "lost-record")(
        _emit_case(_s, force=_force, want_refusal=_ref))


@case("recipe --emit: race_reward.py a FIFO, --force", "race recipe --emit", "hang")
def _(tmp):
    e = os.path.join(tmp, "e")
    os.makedirs(e)
    os.mkfifo(os.path.join(e, "race_reward.py"))
    r = _recipe(tmp, "--emit", "e", "--force", timeout=30)
    if r.timed_out:
        return Outcome("bad", "hang", f"still running after {r.secs:.0f} s")
    return Outcome("good", "", f"exit {r.rc}") if "Traceback" not in r.err and r.rc in (0, 2) else judge_refusal(r)


@case("recipe --emit twice, second without --force", "race recipe --emit", "lost-record")
def _(tmp):
    r1 = _recipe(tmp, "--emit", "e")
    if r1.rc != 0:
        return judge_ok(r1)
    p = os.path.join(tmp, "e", "data", "train.jsonl")
    with open(p, "a") as f:
        f.write('{"prompt": "mine", "answer": "1"}\n')
    before = sha(p)
    o = judge_refusal(_recipe(tmp, "--emit", "e"))
    return o if sha(p) == before else Outcome("bad", "lost-record", "the edited data/train.jsonl was replaced")


@case("recipe --emit --force names the replaced files", "race recipe --emit", "lost-record")
def _(tmp):
    _recipe(tmp, "--emit", "e")
    open(os.path.join(tmp, "e", "race_reward.py"), "a").write("# edited\n")
    r = _recipe(tmp, "--emit", "e", "--force")
    if r.rc != 0:
        return judge_ok(r)
    return Outcome("good", "", "stderr names race_reward.py") if "race_reward.py" in r.err \
        else Outcome("bad", "lost-record", "replaced the edited race_reward.py without naming it")


@case("recipe --emit DIR is an existing file", "race recipe --emit", "lost-record")
def _(tmp):
    p = os.path.join(tmp, "e")
    open(p, "w").write("mine\n")
    o = judge_refusal(_recipe(tmp, "--emit", "e", "--force"))
    return o if open(p).read() == "mine\n" else Outcome("bad", "lost-record", "the file was replaced")


@case("recipe --emit DIR/data is a file, --force", "race recipe --emit", "lost-record")
def _(tmp):
    os.makedirs(os.path.join(tmp, "e"))
    p = os.path.join(tmp, "e", "data")
    open(p, "w").write("mine\n")
    r = _recipe(tmp, "--emit", "e", "--force")
    if open(p).read() != "mine\n" if os.path.isfile(p) else True:
        return Outcome("bad", "lost-record", f"the user's file 'data' was replaced (exit {r.rc})")
    return judge_refusal(r)


for _n, _x in [("--full-run nan", ["--full-run", "nan"]), ("--full-run -6e12", ["--full-run", "-6e12"]),
               ("--full-run 0", ["--full-run", "0"]), ("--rho 0", ["--rho", "0"]), ("--rho 1.5", ["--rho", "1.5"]),
               ("--rho nan", ["--rho", "nan"]), ("--full-run 10^30 x B", ["--full-run", "6e41"])]:
    case(f"recipe {_n}", "race recipe", "silent-wrong")(
        (lambda x: lambda tmp: judge_refusal(_recipe(tmp, *x)))(_x))


@case("recipe --storage mysql with a password, unreachable", "race recipe", "leak")
def _(tmp):
    return judge_refusal(cli(tmp, ["recipe", "--storage", f"mysql://carol:{SECRET}@127.0.0.1:1/x", "--study", "s",
                                   "--for", "verl", "--full-run", "6e12"], timeout=40), fast=40)


# ------------------------------------------------------------------ race.fullrun.watch (API)

W = "from race.fullrun.watch import *\nimport math, time\n"

for _n, _code, _names in [
    ("Watch(total_steps=0)", "result = Watch(total_steps=0)", ("total_steps",)),
    ("Watch(total_steps=-5)", "result = Watch(total_steps=-5)", ("total_steps",)),
    ("Watch(total_steps=10.5)", "result = Watch(total_steps=10.5)", ("total_steps",)),
    ("Watch(total_steps='100')", "result = Watch(total_steps='100')", ("total_steps",)),
    ("Watch(total_steps=True)", "result = Watch(total_steps=True)", ("total_steps",)),
    ("Watch(total_steps=10**15)", "result = Watch(total_steps=10**15)", ("total_steps",)),
    ("Watch(100, checkpoints=-3)", "result = Watch(100, checkpoints=-3)", ("checkpoints",)),
    ("Watch(100, checkpoints=[0.5, 1.5])", "result = Watch(100, checkpoints=[0.5, 1.5])", ("checkpoints",)),
    ("Watch(100, checkpoints=[nan])", "result = Watch(100, checkpoints=[float('nan')])", ("checkpoints",)),
    ("Watch(100, checkpoints='8')", "result = Watch(100, checkpoints='8')", ("checkpoints",)),
    ("Watch(100, target='')", "result = Watch(100, target='')", ("target",)),
    ("record(0, [])", "w = Watch(100); result = w.record(0, [])", ("scores",)),
    ("record(0, [nan, 1])", "w = Watch(100); result = w.record(0, [float('nan'), 1.0])", ("score",)),
    ("record(0, ['a', 'b'])", "w = Watch(100); result = w.record(0, ['a', 'b'])", ("score",)),
    ("record with another prompt count", "w = Watch(100); w.record(0, [1.0, 0.0, 1.0]); result = w.record(2, [1.0, 0.0])", ("scores", "prompt")),
    ("record(-1, …)", "w = Watch(100); result = w.record(-1, [1.0, 0.0])", ("step",)),
    ("record steps going backwards", "w = Watch(100); w.record(0, [1.0, 0.0]); w.record(50, [1.0, 1.0]); result = w.record(10, [1.0, 0.0])", ("step",)),
    ("record past total_steps", "w = Watch(100); w.record(0, [1.0, 0.0]); result = w.record(10**6, [1.0, 0.0])", ("step", "total_steps")),
    ("record(5, …) before the base (step 0)", "w = Watch(100); result = w.record(5, [1.0, 0.0])", ("step", "base")),
    ("due('5')", "w = Watch(100); result = w.due('5')", ("step",)),
    ("due(3.7)", "w = Watch(100); result = w.due(3.7)", ("step",)),
    ("check_scores('abc')", "result = check_scores('abc')", ("history",)),
    ("check_scores mismatched prompt counts", "result = check_scores([(0, [1.0, 0.0, 1.0]), (5, [1.0])])", ("history", "scores", "prompt")),
    ("check_scores with inf", "result = check_scores([(0, [float('inf'), 0.0]), (5, [1.0, 0.0])])", ("history", "score")),
    ("check_scores target=None", "result = check_scores([(0, [1.0, 0.0]), (5, [1.0, 0.0])], target=None)", ("target",)),
    ("check_means mean 1.5", "result = check_means([(0, 0.5), (10, 1.5)], prompts=100)", ("mean", "history")),
    ("check_means prompts=0", "result = check_means([(0, 0.5), (10, 0.4)], prompts=0)", ("prompts",)),
    ("check_means prompts=True", "result = check_means([(0, 0.5), (10, 0.4)], prompts=True)", ("prompts",)),
    ("check_means prompts=-5", "result = check_means([(0, 0.5), (10, 0.2)], prompts=-5)", ("prompts",)),
    ("check_means mean NaN", "result = check_means([(0, float('nan')), (10, 0.2)], prompts=10)", ("mean", "history", "score")),
    ("check_means steps unordered", "result = check_means([(0, 0.5), (20, 0.6), (10, 0.1)], prompts=100)", ("step", "history")),
    ("checkpoint_fractions('8')", "result = checkpoint_fractions('8')", ("spec", "checkpoints")),
    ("checkpoint_fractions(True)", "result = checkpoint_fractions(True)", ("spec", "checkpoints")),
    ("checkpoint_fractions(10**9) (under a 3 GiB address-space cap)",
     "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
     "result = checkpoint_fractions(10**9)", ("spec", "checkpoints")),
    ("run_with_timeout(timeout=-1)", "result = run_with_timeout(lambda: 1, -1, 'chk')", ("timeout",)),
    ("run_with_timeout(timeout=nan)", "result = run_with_timeout(lambda: 1, float('nan'), 'chk')", ("timeout",)),
    ("run_with_timeout(timeout=inf)", "result = run_with_timeout(lambda: 1, float('inf'), 'chk')", ("timeout",)),
    ("run_with_timeout(fn='x')", "result = run_with_timeout('x', 1.0, 'chk')", ("fn",)),
    ("run_with_timeout: fn raises ZeroDivisionError", "result = run_with_timeout(lambda: 1 / 0, 5.0, 'chk')", ("chk", "ZeroDivision")),
    ("run_with_timeout: fn never returns (forked)", "result = run_with_timeout(lambda: time.sleep(600), 1.0, 'chk')", ("chk",)),
    ("run_with_timeout: fn never returns (thread)", "result = run_with_timeout(lambda: time.sleep(600), 1.0, 'chk', isolate=False)", ("chk",)),
    ("run_with_timeout: fn exits the process", "import os\nresult = run_with_timeout(lambda: os._exit(3), 5.0, 'chk')", ("chk",)),
]:
    case(f"watch {_n}", "race.fullrun.watch", "hang" if "never returns" in _n else "raw-exception")(
        (lambda code, names: lambda tmp: judge_api_refusal(api(tmp, W + code, timeout=20), names))(_code, _names))


def _verl_dir(tmp, files: dict[str, bytes | None]) -> str:
    d = os.path.join(tmp, "val")
    os.makedirs(d)
    for name, data in files.items():
        p = os.path.join(d, name)
        if data is None:
            os.mkfifo(p)
        elif isinstance(data, tuple):
            os.symlink(data[0], p)
        else:
            open(p, "wb").write(data)
    return d


_GOOD0 = b'{"input": "a", "score": 1.0}\n{"input": "b", "score": 0.0}\n'

for _n, _files, _extra in [
    ("a missing folder", None, ""),
    ("binary garbage in 10.jsonl", {"0.jsonl": _GOOD0, "10.jsonl": b"\xff\xfe\x00garbage\x80" * 50}, ""),
    ("10.jsonl a FIFO", {"0.jsonl": _GOOD0, "10.jsonl": None}, ""),
    ("10.jsonl a symlink to /dev/zero", {"0.jsonl": _GOOD0, "10.jsonl": ("/dev/zero",)}, ""),
    ("score 'NaN' (a string)", {"0.jsonl": _GOOD0, "10.jsonl": b'{"input": "a", "score": "NaN"}\n{"input": "b", "score": 0.0}\n'}, ""),
    ("score NaN (a JSON NaN)", {"0.jsonl": _GOOD0, "10.jsonl": b'{"input": "a", "score": NaN}\n{"input": "b", "score": 0.0}\n'}, ""),
    ("max_bytes=-1", {"0.jsonl": _GOOD0}, ", max_bytes=-1"),
    ("max_bytes='big'", {"0.jsonl": _GOOD0}, ", max_bytes='big'"),
    ("a step file 'abc.jsonl' and a base without 'score'", {"0.jsonl": b'{"input": "a"}\n', "abc.jsonl": _GOOD0}, ""),
    ("an empty folder", {}, ""),
]:
    def _mk(files, extra):
        def run(tmp):
            d = _verl_dir(tmp, files) if files is not None else os.path.join(tmp, "nope")
            return judge_api_refusal(api(tmp, W + f"result = verl_history({d!r}{extra})", timeout=20),
                                     ("dump_dir", "max_bytes", "jsonl", d, "score", "step"))
        return run
    case(f"watch verl_history: {_n}", "race.fullrun.watch", "hang" if ("FIFO" in _n or "zero" in _n) else "raw-exception")(
        _mk(_files, _extra))


for _n, _kw, _names in [
    ("prompts=[]", "prompts=[], reward_func=f", ("prompts",)),
    ("prompts a string", "prompts='what is 2+2', reward_func=f", ("prompts",)),
    ("reward_func not callable", "prompts=['1+1='], reward_func='f'", ("reward_func",)),
    ("timeout=0", "prompts=['1+1='], reward_func=f, timeout=0", ("timeout",)),
    ("timeout=nan", "prompts=['1+1='], reward_func=f, timeout=float('nan')", ("timeout",)),
    ("on_error='explode'", "prompts=['1+1='], reward_func=f, on_error='explode'", ("on_error",)),
    ("samples=0", "prompts=['1+1='], reward_func=f, samples=0", ("samples",)),
    ("stop='false' (a string)", "prompts=['1+1='], reward_func=f, stop='false'", ("stop",)),
    ("keep_best=1 (an int)", "prompts=['1+1='], reward_func=f, keep_best=1", ("keep_best",)),
    ("columns length ≠ prompts", "prompts=['1+1=', '2+2='], reward_func=f, columns={'answer': ['2']}", ("columns", "answer")),
    ("temperature=-1", "prompts=['1+1='], reward_func=f, temperature=-1.0", ("temperature",)),
    ("max_new_tokens=10**9", "prompts=['1+1='], reward_func=f, max_new_tokens=10**9", ("max_new_tokens",)),
    ("batch_size=0", "prompts=['1+1='], reward_func=f, batch_size=0", ("batch_size",)),
]:
    case(f"watch trl_callback({_n})", "race.fullrun.watch", "raw-exception")(
        (lambda kw, names: lambda tmp: judge_api_refusal(api(
            tmp, W + "def f(prompts, completions, **kw): return [1.0] * len(prompts)\n"
                     f"result = trl_callback({kw})", timeout=60), names))(_kw, _names))


CALLBACK = r"""
from race.fullrun.watch import trl_callback
from types import SimpleNamespace
import time, transformers, glob, os
import race
root = os.path.join(os.path.dirname(race.__file__))
cands = [os.path.dirname(p) for p in glob.glob(os.path.join(root, '**', 'config.json'), recursive=True) if 'tiny-arith' in p]
path = sorted(cands, key=len)[0]
tok = transformers.AutoTokenizer.from_pretrained(path)
model = transformers.AutoModelForCausalLM.from_pretrained(path)
logs = []
CHECKER
cb = trl_callback(['1+1=', '2+3='], checker, timeout=2.0, max_new_tokens=4, log=logs.append, KW)
state = SimpleNamespace(max_steps=64, global_step=0)
control = SimpleNamespace(should_training_stop=False)
t0 = time.monotonic()
cb.on_train_begin(None, state, control, model=model, processing_class=tok)
for s in (1, 2, 4, 8):
    state.global_step = s
    cb.on_step_end(None, state, control, model=model, processing_class=tok)
cb.on_train_end(None, state, control, model=model, processing_class=tok)
result = {'secs': round(time.monotonic() - t0, 1), 'stop': control.should_training_stop, 'logs': logs[:3]}
"""

for _n, _checker, _kw, _want in [
    ("checker raises", "def checker(prompts, completions, **kw): raise RuntimeError('boom')", "", "log"),
    ("checker never returns", "def checker(prompts, completions, **kw):\n    time.sleep(600)", "", "log"),
    ("checker never returns, isolate=False", "def checker(prompts, completions, **kw):\n    time.sleep(600)",
     "isolate=False", "log"),
    ("checker returns one score too few", "def checker(prompts, completions, **kw): return [1.0]", "", "log"),
    ("checker returns strings and NaN", "def checker(prompts, completions, **kw): return ['x', float('nan')]", "", "log"),
    ("checker raises, on_error='stop'", "def checker(prompts, completions, **kw): raise KeyError('k')",
     "on_error='stop'", "stop"),
]:
    def _mkcb(checker, kw, want):
        def run(tmp):
            code = CALLBACK.replace("CHECKER", checker).replace(", KW", (", " + kw) if kw else "")
            d = api(tmp, code, timeout=90)
            if d.get("ok"):
                try:
                    res = eval(d["result"], {"nan": float("nan")})
                except Exception:
                    return Outcome("good", "", "returned " + short(d["result"], 80))
                if res["secs"] > 40:
                    return Outcome("bad", "hang", f"the evaluations took {res['secs']} s with timeout=2")
                if not res["logs"]:
                    return Outcome("bad", "silent-wrong", "no line logged for the failed evaluation")
                if want == "stop" and not res["stop"]:
                    return Outcome("bad", "silent-wrong", "on_error='stop' did not stop the run")
                if want == "log" and res["stop"]:
                    return Outcome("bad", "silent-wrong", "the run was stopped though on_error='log'")
                return Outcome("good", "", f"{res['secs']} s, logged: " + short(res["logs"][0], 70))
            if d.get("hang"):
                return Outcome("bad", "hang", f"no answer after {d['secs']:.0f} s")
            if d.get("crash"):
                return Outcome("bad", "raw-exception", "process died: " + short(d["stderr"], 80))
            return Outcome("bad", "raw-exception", f"raised into the trainer: {d['type']}: " + short(d["msg"], 70))
        return run
    case(f"watch TRL callback: {_n}", "race.fullrun.watch", "hang" if "never" in _n else "raw-exception")(
        _mkcb(_checker, _kw, _want))


# ------------------------------------------------------------------ race.stats.drift

D = "from race.stats.drift import *\nnan = float('nan'); inf = float('inf')\n"
RA = "rho_range=(0.3, 0.6), recommended_rho=0.45, pilot_budget=1e12, full_run_budget=1e13"


def _ra(**kw):
    base = {"rho_range": "(0.3, 0.6)", "recommended_rho": "0.45", "pilot_budget": "1e12", "full_run_budget": "1e13"}
    base.update(kw)
    pos = f"{base.pop('rho_range')}, {base.pop('recommended_rho')}"
    return f"result = range_at({pos}, " + ", ".join(f"{k}={v}" for k, v in base.items()) + ")"


for _n, _code, _names in [
    ("range_at inverted range (0.6, 0.3)", _ra(rho_range="(0.6, 0.3)"), ("rho_range",)),
    ("range_at recommended ρ outside the range", _ra(recommended_rho="0.8"), ("recommended_rho",)),
    ("range_at NaN in the range", _ra(rho_range="(nan, 0.6)"), ("rho_range",)),
    ("range_at range past 1", _ra(rho_range="(0.3, 1.7)"), ("rho_range",)),
    ("range_at range of length 1", _ra(rho_range="(0.3,)"), ("rho_range",)),
    ("range_at range a string", _ra(rho_range="'0.3,0.6'"), ("rho_range",)),
    ("range_at negative pilot budget", _ra(pilot_budget="-1e12"), ("pilot_budget",)),
    ("range_at pilot budget a string", _ra(pilot_budget="'1e12'"), ("pilot_budget",)),
    ("range_at pilot budget True", _ra(pilot_budget="True"), ("pilot_budget",)),
    ("range_at full_run_budget inf", _ra(full_run_budget="inf"), ("full_run_budget",)),
    ("range_at F < B", _ra(full_run_budget="1e11"), ("full_run_budget", "F")),
    ("range_at F past MAX_FACTOR", _ra(full_run_budget="1e16"), ("full_run_budget", "MAX_FACTOR", "F = 1e+16")),
    ("range_at drift NaN", _ra(drift="nan"), ("drift",)),
    ("range_at drift_se negative", _ra(drift_se="-0.01"), ("drift_se",)),
    ("range_at validated_factor 0", _ra(validated_factor="0"), ("validated_factor",)),
    ("range_at recommended ρ True", _ra(recommended_rho="True"), ("recommended_rho", "rho_range")),
    ("shrink negative SE", "result = shrink(-0.05, -0.01)", ("se_own",)),
    ("shrink spread 0", "result = shrink(-0.05, 0.01, spread=0.0)", ("spread",)),
    ("shrink d_own a string", "result = shrink('x', 0.01)", ("d_own",)),
    ("init_line pilot_budget 0", "result = init_line(0, 1e13)", ("pilot_budget",)),
    ("init_line full_run_budget NaN", "result = init_line(1e12, nan)", ("full_run_budget",)),
    ("fit_joint('abc')", "result = fit_joint('abc')", ("obs",)),
    ("fit_joint se_floor -1", "result = fit_joint([], se_floor=-1.0)", ("se_floor", "obs")),
    ("range_for_pilots inverted range", "result = range_for_pilots([], target='reward', pilot_budget=1e12, "
                                         "full_run_budget=1e13, rho_range=(0.6, 0.3), recommended_rho=0.45)", ("rho_range",)),
    ("range_for_pilots population NaN", "result = range_for_pilots([], target='reward', pilot_budget=1e12, "
                                         "full_run_budget=1e13, rho_range=(0.3, 0.6), recommended_rho=0.45, "
                                         "population=(nan, 0.05))", ("population",)),
    ("range_for_pilots constant_rate='false'", "result = range_for_pilots([], target='reward', pilot_budget=1e12, "
                                         "full_run_budget=1e13, rho_range=(0.3, 0.6), recommended_rho=0.45, "
                                         "constant_rate='false')", ("constant_rate",)),
]:
    case(f"drift {_n}", "race.stats.drift", "silent-wrong")(
        (lambda code, names: lambda tmp: judge_api_refusal(api(tmp, D + code), names))(_code, _names))


# ------------------------------------------------------------------ race.stats.rate

R = ("from race.stats.rate import *\nnan = float('nan')\n"
     "lr = LearningRate()\n")
for _n, _code, _names in [
    ("full_lr NaN", "result = full_run_rate(lr, status='stable', factor=10.0, full_lr=nan)", ("full_lr",)),
    ("full_lr negative", "result = full_run_rate(lr, status='stable', factor=10.0, full_lr=-1e-3)", ("full_lr",)),
    ("factor 0", "result = full_run_rate(lr, status='stable', factor=0.0, full_lr=1e-3)", ("factor",)),
    ("factor inf", "result = full_run_rate(lr, status='stable', factor=float('inf'), full_lr=1e-3)", ("factor",)),
    ("status 'STABLE'", "result = full_run_rate(lr, status='STABLE', factor=10.0, full_lr=1e-3)", ("status",)),
    ("cause 'bogus'", "result = full_run_rate(lr, status='at risk', factor=10.0, full_lr=1e-3, cause='bogus')", ("cause",)),
    ("probe a string", "result = full_run_rate(lr, status='stable', factor=10.0, full_lr=1e-3, probe='held')", ("probe",)),
    ("probe without its fields", "result = full_run_rate(lr, status='stable', factor=10.0, full_lr=1e-3, probe={'x': 1})", ("probe",)),
    ("probe with learning_rate NaN", "result = full_run_rate(lr, status='stable', factor=10.0, full_lr=1e-3, "
                                     "probe={'status': 'held', 'learning_rate': nan, 'covers': 1.0, 'full_run_budget': 1e13})",
     ("probe", "learning_rate")),
    ("lr a float", "result = full_run_rate(1e-3, status='stable', factor=10.0, full_lr=1e-3)", ("lr",)),
    ("configured_lr fixed 'false' (a string)", "result = configured_lr({'learning_rate': {'ref': 1e-3, 'fixed': 'false'}, "
                                               "'schedule': {'prompts_per_step': 8, 'n_train': 8}})", ("fixed",)),
    ("configured_lr('abc')", "result = configured_lr('abc')", ("raw",)),
    ("apply_rate scale NaN", "result = apply_rate(lr, {'scale': nan, 'schedule': 'cosine', 'warmup': 0.1, 'rule': 2})", ("scale", "rate")),
    ("apply_rate scale 1e6 (raises η)", "result = apply_rate(lr, {'scale': 1e6, 'schedule': 'constant', 'warmup': 0.0, 'rule': 4})", ("scale", "rate")),
    ("apply_rate schedule 'sine'", "result = apply_rate(lr, {'scale': 1.0, 'schedule': 'sine', 'warmup': 0.0, 'rule': 4})", ("schedule", "rate")),
]:
    case(f"rate {_n}", "race.stats.rate", "silent-wrong")(
        (lambda code, names: lambda tmp: judge_api_refusal(api(tmp, R + code), names))(_code, _names))


# ------------------------------------------------------------------ race.stats.forecast

FC = ("from race.stats.forecast import *\nimport race\nres = race.load_results(RES)\n")
for _n, _code, _names in [
    ("with_forecast budget 'nan'", "result = with_forecast(res, full_run_budget='nan')", ("full_run_budget",)),
    ("with_forecast budget -1", "result = with_forecast(res, full_run_budget=-1.0)", ("full_run_budget",)),
    ("with_forecast n_boot 0", "result = with_forecast(res, full_run_budget=6e12, n_boot=0)", ("n_boot",)),
    ("with_forecast n_boot 10**9", "result = with_forecast(res, full_run_budget=6e12, n_boot=10**9)", ("n_boot",)),
    ("with_forecast n_boot True", "result = with_forecast(res, full_run_budget=6e12, n_boot=True)", ("n_boot",)),
    ("with_forecast force 'false'", "result = with_forecast(res, full_run_budget=6e12, force='false')", ("force",)),
    ("with_forecast pool a string", "result = with_forecast(res, full_run_budget=6e12, pool='x.json')", ("pool",)),
    ("with_forecast pool [123]", "result = with_forecast(res, full_run_budget=6e12, pool=[123])", ("pool",)),
    ("with_forecast results 123", "result = with_forecast(123, full_run_budget=6e12)", ("results",)),
    ("forecast runs=[]", "result = forecast([], target='reward', full_run_budget=6e12, pilot_regime=race.Regime.BALANCED, "
                         "pilot_best_rho=0.5)", ("runs",)),
    ("forecast confidence_level 1.5", "result = forecast([(res.pilots, 6e11)], target='reward', full_run_budget=6e12, "
                                      "pilot_regime=race.Regime.BALANCED, pilot_best_rho=0.5, confidence_level=1.5)",
     ("confidence_level",)),
    ("forecast pilot_best_rho NaN", "result = forecast([(res.pilots, 6e11)], target='reward', full_run_budget=6e12, "
                                    "pilot_regime=race.Regime.BALANCED, pilot_best_rho=float('nan'))", ("pilot_best_rho",)),
]:
    def _mkf(code, names):
        def run(tmp):
            p = os.path.join(tmp, "res.json")
            with open(p, "w") as f:
                json.dump(json.load(gzip.open(RESULTS_GZ)), f)
            return judge_api_refusal(api(tmp, FC.replace("RES", repr(p)) + code, timeout=60), names)
        return run
    case(f"forecast {_n}", "race.stats.forecast", "silent-wrong")(_mkf(_code, _names))


# ------------------------------------------------------------------ race.diagnose(design=, share=)

DG = ("import race\nkw = dict(budget=6e11, grid=[0.3, 0.6, 0.85], seeds=1, workers=1, out_dir='o', quiet=True)\n"
      "kwd = dict(kw); kwd.pop('budget')\n")         # a sized design sets the budget itself
for _n, _code, _names in [
    ("design='fit' without a full-run budget", "result = race.diagnose(design='fit', share=0.1, **kwd)", ("full_run_budget", "full-run", "design")),
    ("share=0", "result = race.diagnose(design='fit', share=0.0, full_run_budget=1e12, **kwd)", ("share",)),
    ("share=nan", "result = race.diagnose(design='fit', share=float('nan'), full_run_budget=1e12, **kwd)", ("share",)),
    ("share='0.1' (a string)", "result = race.diagnose(design='fit', share='0.1', full_run_budget=1e12, **kwd)", ("share",)),
    ("share=1.0", "result = race.diagnose(design='fit', share=1.0, full_run_budget=1e12, **kwd)", ("share",)),
    ("share=True", "result = race.diagnose(design='fit', share=True, full_run_budget=1e12, **kwd)", ("share",)),
    ("design='bogus'", "result = race.diagnose(design='bogus', full_run_budget=1e12, **kwd)", ("design",)),
    ("design=True", "result = race.diagnose(design=True, full_run_budget=1e12, **kwd)", ("design",)),
    ("share without a design", "result = race.diagnose(share=0.3, **kwd)", ("share", "design")),
    ("design='flat', share too small", "result = race.diagnose(design='flat', share=0.01, full_run_budget=1e10, **kwd)", ("share", "flat", "pilot")),
    ("probe=True without a full-run budget", "result = race.diagnose(probe=True, **kw)", ("probe", "full_run_budget", "full-run")),
    ("probe='yes'", "result = race.diagnose(probe='yes', full_run_budget=1e12, **kw)", ("probe",)),
    ("probe, F = 10^30 x B", "result = race.diagnose(probe=True, full_run_budget=6e41, **kw)", ("full_run_budget", "full-run", "probe", "F")),
    ("probe, F < B", "result = race.diagnose(probe=True, full_run_budget=1e11, **kw)", ("full_run_budget", "full-run", "probe", "F")),
    ("probe, F past MAX_FACTOR (5000 x B)", "result = race.diagnose(probe=True, full_run_budget=3e15, **kw)", ("full_run_budget", "full-run", "probe", "F")),
    ("full_run_budget=-1e12", "result = race.diagnose(full_run_budget=-1e12, **kw)", ("full_run_budget", "full-run")),
]:
    case(f"diagnose {_n}", "race.diagnose", "late")(
        (lambda code, names: lambda tmp: judge_api_refusal(api(tmp, DG + code, timeout=30), names, fast=CLI_FAST,
                                                         hang_cls="late"))(_code, _names))


@case("recipe --full-run below B (answers)", "race recipe", "silent-wrong")
def _(tmp):
    return judge_ok(_recipe(tmp, "--full-run", "1e11"))


@case("report --full-run F, a probe record of another F (6e13) is not read at 6e12", "race report", "silent-wrong")
def _(tmp):
    r = _report(tmp, "--full-run", "6e12", mutate=_tampered(full_run_budget=6e13))
    o = judge_ok(r, forbid=())
    if o.verdict == "good" and "length probe at η" in r.out:
        return Outcome("bad", "silent-wrong", "the stability line at 6e12 cites the probe run at 6e13")
    return o


@case("report --full-run F, probe record with an empty curve", "race report", "silent-wrong")
def _(tmp):
    return _judge_tampered(tmp, {"curve": []})


@case("report --full-run F, probe record: 100 steps of 7780 but covers 1.0", "race report", "silent-wrong")
def _(tmp):
    curve = [{"fraction": 0.0, "step": 0, "mean": 0.4}, {"fraction": 1.0, "step": 100, "mean": 0.5}]
    return _judge_tampered(tmp, {"curve": curve, "steps": 100})


@case("config pilot_design: fit with full_run_budget: .nan", "config", "silent-wrong")
def _(tmp):
    return judge_refusal(cli(tmp, ["plan", config(tmp, "full_run_budget: .nan\npilot_design: fit\n")]))


# ------------------------------------------------------------------ runner

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="run the cases whose name holds this substring")
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    cases = [c for c in CASES if a.only is None or a.only in c.name]
    rows = []
    t0 = time.monotonic()
    for i, c in enumerate(cases, 1):
        tmp = tempfile.mkdtemp(prefix="race-heldout-")
        try:
            o = c.run(tmp)
        except Exception as e:                       # the harness's own failure: reported, never hidden
            o = Outcome("bad", "harness", f"{type(e).__name__}: {e}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rows.append((c, o))
        print(f"{i:3d} {o.verdict:4s} {o.cls or '-':14s} {c.surface:20s} {c.name} | {o.got}", flush=True)
    print()
    print(f"{'case':70s} {'surface':20s} {'expected':14s} {'verdict':7s} {'class':14s} got")
    for c, o in rows:
        print(f"{c.name[:70]:70s} {c.surface:20s} {c.expected:14s} {o.verdict:7s} {o.cls or '-':14s} {o.got}")
    good = sum(o.verdict == "good" for _, o in rows)
    print(f"\n{len(rows)} cases, {good} good, {len(rows) - good} bad ({time.monotonic() - t0:.0f} s)")
    by: dict[str, list[int]] = {}
    for c, o in rows:
        by.setdefault(c.expected, [0, 0])[o.verdict == "bad"] += 1
    print("by the class each case checks: " + ", ".join(f"{k} {v[0]} good / {v[1]} bad" for k, v in sorted(by.items())))
    bad: dict[str, int] = {}
    for _, o in rows:
        if o.verdict == "bad":
            bad[o.cls] = bad.get(o.cls, 0) + 1
    print("bad by what went wrong: " + (", ".join(f"{k} {v}" for k, v in sorted(bad.items())) or "none"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"case": c.name, "surface": c.surface, "expected": c.expected, "verdict": o.verdict,
                        "class": o.cls, "got": o.got} for c, o in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
