"""Hardening campaign, round 4 (issue 50): about 120 cases over the newest surfaces, as a new user and a
careless script would use them, each run and its outcome classified.

Surfaces: ``race probe``, ``race pilot --probe``, ``race report --full-run``, ``race recipe --emit``,
``race.fullrun.watch`` (Watch, check_scores, check_means, verl_history, trl_callback), and the Python
API of ``race.stats.drift``, ``race.stats.rate`` and ``race.stats.forecast``. Inputs: bad numbers
(NaN, inf, negative, huge, strings, booleans), wrong files (missing, a folder, binary, truncated or
tampered JSON, duplicated keys, a planted symlink, a read-only folder, a FIFO, /dev/zero), concurrent
writers, absurd budgets.

No pilot grid runs: every command runs through a wrapper that replaces calibration and the pilot
(race.engine.calibration.calibrate, race.engine.pilot.run_pilot) by a marker and exit 97 (so compute
that starts before a refusal is seen: "late refusal"), or, for a probe that should run, by a stored
pilot of the committed results file (docs/runs/tiny-steps-sparse.results.json). A case runs in its
own folder beside an ``outside/`` folder holding a victim file; a read-only folder is tried as the
unprivileged user ``nobody`` (setpriv), since root ignores permissions.

Classes: ``good`` (the answer, checked, or a one-line RaceError / ``Error:`` line with exit 2);
``traceback``, ``raw exception``, ``multi-line error``, ``write outside``, ``lost file``, ``hang``
(past the case's timeout), ``silent wrong`` (an answer where a refusal was due, or a wrong one),
``late refusal`` (compute started before a refusal that the config alone decides).

    python bench/hardening_campaign.py                 # every case, the table at the end
    python bench/hardening_campaign.py --only probe    # cases whose name holds 'probe'
    python bench/hardening_campaign.py --json out.json # and every case's outcome
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the checkout whose race package is tried (--race DIR: another one, e.g. `git archive` of an older commit);
# the fixtures always come from this one
RACE = os.environ.get("CAMPAIGN_RACE", ROOT)
if RACE not in sys.path:
    sys.path.insert(0, RACE)
RESULTS = os.path.join(ROOT, "docs", "runs", "tiny-steps-sparse.results.json")      # a verdict, no checkpoints
CHECKPOINTS = os.path.join(ROOT, "tests", "data", "tiny-grid-2e10.json")            # checkpoints, no verdict
B = 3e11                      # RESULTS' budget per pilot
DEFAULT_B = 6e11              # the embedded default grid's (race pilot with no CONFIG)

GOOD = "good"
BAD = ("traceback", "raw exception", "multi-line error", "write outside", "lost file", "hang", "silent wrong",
       "late refusal")

# the wrapper every command runs in: compute replaced by a marker (or a stored pilot), then the CLI
WRAPPER = textwrap.dedent(r"""
    import os, sys, time
    mode = os.environ.get("CAMPAIGN_COMPUTE", "mark")
    mark = os.environ["CAMPAIGN_MARK"]

    def marker(what):
        def f(*a, **k):
            with open(mark, "a") as fh:
                fh.write(what + "\n")
            os._exit(97)
        return f

    if mode != "none":
        import race.engine.calibration as C
        import race.engine.pilot as P
        C.calibrate = marker("calibrate")
        if mode == "fake":
            from race.stats.results import load_results
            stored = next(p for p in load_results(os.environ["CAMPAIGN_RESULTS"]).pilots if p.status == "complete")

            def fake(*a, **k):
                time.sleep(float(os.environ.get("CAMPAIGN_SLEEP", "0")))
                return stored
            P.run_pilot = fake
        else:
            P.run_pilot = marker("run_pilot")
    from race.run.cli import main
    sys.argv = ["race"] + sys.argv[1:]
    main()
""")


@dataclass
class Case:
    name: str
    surface: str
    kind: str                                  # cli | api | custom
    expect: str = "refuse"                     # refuse | ok | compute
    args: Any = None                           # cli: list (templated with {w} {run} {res} {out}) or f(ctx)
    call: Callable | None = None               # api: f(ctx) -> value; custom: f(ctx) -> (class, note)
    setup: Callable | None = None              # f(ctx): files for the case
    check: Callable | None = None              # f(ctx, value_or_proc) -> None | (class, note)
    compute: str = "mark"                      # cli: mark | fake | none
    user: str | None = None                    # cli: "nobody" for the read-only folder
    timeout: float = 120.0
    env: dict = field(default_factory=dict)


@dataclass
class Ctx:
    w: str                                     # the case's folder
    out: str                                   # outside/, with victim.txt
    run: str                                   # w/run: a copy of RESULTS as results.json
    mark: str

    @property
    def res(self) -> str:
        return os.path.join(self.run, "results.json")

    @property
    def victim(self) -> str:
        return os.path.join(self.out, "victim.txt")


def _snapshot(folder: str) -> dict[str, str]:
    out = {}
    for base, dirs, files in os.walk(folder):
        for f in files + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            p = os.path.join(base, f)
            try:
                with open(p, "rb") as fh:
                    out[os.path.relpath(p, folder)] = hashlib.sha256(fh.read()).hexdigest()
            except OSError:
                out[os.path.relpath(p, folder)] = "?"
    return out


def _fmt(args: Any, ctx: Ctx) -> list[str]:
    if callable(args):
        return [str(a) for a in args(ctx)]
    return [str(a).format(w=ctx.w, run=ctx.run, res=ctx.res, out=ctx.out, B=B) for a in args]


def _one_line_refusal(stderr: str) -> tuple[bool, str]:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    errs = [i for i, ln in enumerate(lines) if ln.startswith("Error:")]
    if not errs:
        return False, "no Error: line"
    if "Traceback" in stderr:
        return False, "traceback"
    if errs[-1] != len(lines) - 1 or len(errs) > 1:
        return False, "the Error: line is not the last and only one"
    return True, lines[errs[-1]][:160]


def run_cli(case: Case, ctx: Ctx) -> tuple[str, str]:
    env = {**os.environ, "PYTHONPATH": RACE, "CAMPAIGN_MARK": ctx.mark, "CAMPAIGN_COMPUTE": case.compute,
           "CAMPAIGN_RESULTS": RESULTS, "OMP_NUM_THREADS": "1", **case.env}
    cmd = [sys.executable, "-c", WRAPPER, *_fmt(case.args, ctx)]
    if case.user == "nobody":
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ctx.w, env=env, timeout=case.timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return "hang", f"no answer in {case.timeout:g} s"
    err = proc.stderr
    if proc.returncode == 97:
        what = open(ctx.mark).read().split()[0] if os.path.exists(ctx.mark) else "compute"
        if case.expect == "compute":
            return GOOD, f"reached {what}: not refused before compute"
        return "late refusal", f"{what} started"
    if "Traceback" in err or proc.returncode not in (0, 2):
        return "traceback", f"exit {proc.returncode}: " + (err.strip().splitlines() or [""])[-1][:160]
    if case.expect == "refuse":
        if proc.returncode == 0:
            return "silent wrong", "exit 0 where a refusal was due: " + (proc.stdout.strip().splitlines() or [""])[0][:120]
        ok, note = _one_line_refusal(err)
        if not ok:
            return "multi-line error", note
        extra = case.check(ctx, proc) if case.check else None
        return extra if extra else (GOOD, note)
    if case.expect == "compute":
        return "silent wrong" if proc.returncode == 0 else GOOD, (err.strip().splitlines() or [""])[-1][:160]
    if proc.returncode != 0:
        ok, note = _one_line_refusal(err)
        return ("silent wrong" if ok else "multi-line error"), f"refused a valid case: {note}"
    extra = case.check(ctx, proc) if case.check else None
    return extra if extra else (GOOD, "ok")


def _api_child(case: Case, ctx: Ctx, conn) -> None:
    from race.core.errors import RaceError

    try:
        value = case.call(ctx)
    except RaceError as e:
        conn.send(("race", type(e).__name__, str(e)))
        return
    except BaseException as e:  # noqa: BLE001 — that is what the campaign counts
        conn.send(("raw", type(e).__name__, str(e)[:300]))
        return
    try:
        extra = case.check(ctx, value) if case.check else None
    except BaseException as e:  # noqa: BLE001
        extra = ("silent wrong", f"check failed: {type(e).__name__}: {e}"[:200])
    conn.send(("value", extra, repr(value)[:160]))


def run_api(case: Case, ctx: Ctx) -> tuple[str, str]:
    parent, child = mp.Pipe(duplex=False)
    p = mp.get_context("fork").Process(target=_api_child, args=(case, ctx, child))
    p.start()
    child.close()
    if not parent.poll(case.timeout):
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        return "hang", f"no answer in {case.timeout:g} s"
    try:
        got = parent.recv()
    except EOFError:
        p.join()
        return "raw exception", f"the call ended its process (exit {p.exitcode})"
    p.join()
    kind = got[0]
    if kind == "raw":
        return "raw exception", f"{got[1]}: {got[2]}"
    if kind == "race":
        if "\n" in got[2]:
            return "multi-line error", got[2][:160]
        if case.expect == "refuse":
            return GOOD, f"{got[1]}: {got[2][:150]}"
        return "silent wrong", f"refused a valid call: {got[1]}: {got[2][:140]}"
    extra, shown = got[1], got[2]
    if extra:
        return extra
    if case.expect == "refuse":
        return "silent wrong", f"answered where a refusal was due: {shown}"
    return GOOD, shown


def run_case(case: Case, base: str) -> tuple[str, str]:
    w = tempfile.mkdtemp(prefix="case-", dir=base)
    os.chmod(w, 0o755)
    out = os.path.join(w, "outside")
    os.makedirs(out)
    with open(os.path.join(out, "victim.txt"), "w") as fh:
        fh.write("precious\n")
    run = os.path.join(w, "run")
    os.makedirs(run)
    shutil.copy(RESULTS, os.path.join(run, "results.json"))
    ctx = Ctx(w=w, out=out, run=run, mark=os.path.join(w, "computed"))
    if case.setup:
        case.setup(ctx)
    before = _snapshot(out)
    t0 = time.monotonic()
    if case.kind == "cli":
        cls, note = run_cli(case, ctx)
    elif case.kind == "api":
        cls, note = run_api(case, ctx)
    else:
        cls, note = case.call(ctx)
    if _snapshot(out) != before and cls not in ("hang",):
        cls, note = "write outside", f"outside/ changed ({note})"
    return cls, f"{note} [{time.monotonic() - t0:.1f} s]"


# ----------------------------------------------------------------------------- helpers for the cases

def _doc(ctx: Ctx) -> dict:
    with open(ctx.res) as fh:
        return json.load(fh)


def _write(path: str, text: str | bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(text, bytes) else "w") as fh:
        fh.write(text)


def tamper(edit: Callable[[dict], None]) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        doc = _doc(ctx)
        edit(doc)
        _write(ctx.res, json.dumps(doc))
    return setup


def raw_results(text: str | bytes) -> Callable[[Ctx], None]:
    return lambda ctx: _write(ctx.res, text)


def unchanged(ctx: Ctx, proc: Any) -> tuple[str, str] | None:
    """results.json as the committed file (a refusal writes nothing)."""
    with open(ctx.res, "rb") as a, open(RESULTS, "rb") as b:
        return None if a.read() == b.read() else ("silent wrong", "a refusal changed results.json")


def probes_kept(n: int) -> Callable[[Ctx, Any], tuple[str, str] | None]:
    def check(ctx: Ctx, proc: Any) -> tuple[str, str] | None:
        got = len(_doc(ctx).get("probes") or [])
        return None if got == n else ("lost file", f"{got} probe record(s) stored, {n} expected")
    return check


def symlink_victim(rel: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        path = os.path.join(ctx.w, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink(ctx.victim, path)
    return setup


def readonly(sub: str) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        folder = os.path.join(ctx.w, sub)
        os.makedirs(folder, exist_ok=True)
        for base, dirs, files in os.walk(folder):
            for f in files:
                os.chmod(os.path.join(base, f), 0o444)
            os.chmod(base, 0o555)
    return setup


def emitted(ctx: Ctx, proc: Any) -> tuple[str, str] | None:
    emit = os.path.join(ctx.w, "emit")
    need = ["race_reward.py", "recipe.json", os.path.join("data", "train.jsonl")]
    missing = [n for n in need if not os.path.isfile(os.path.join(emit, n))]
    if missing:
        return "silent wrong", f"exit 0 but {missing} not written"
    try:
        json.load(open(os.path.join(emit, "recipe.json")))
    except ValueError:
        return "lost file", "recipe.json is not whole JSON"
    return None


def user_file_kept(ctx: Ctx, proc: Any) -> tuple[str, str] | None:
    with open(os.path.join(ctx.w, "emit", "notes.txt")) as fh:
        return None if fh.read() == "mine\n" else ("lost file", "the user's notes.txt changed")


def nothing_at(rel: str) -> Callable[[Ctx, Any], tuple[str, str] | None]:
    def check(ctx: Ctx, proc: Any) -> tuple[str, str] | None:
        return ("silent wrong", f"{rel} was made by a refused command") if os.path.exists(os.path.join(ctx.w, rel)) \
            else None
    return check


def both(*checks: Callable) -> Callable:
    def check(ctx: Ctx, value: Any) -> Any:
        for c in checks:
            r = c(ctx, value)
            if r:
                return r
        return None
    return check


# ----------------------------------------------------------------------------- the cases

def cases() -> list[Case]:
    out: list[Case] = []
    add = out.append
    bad_numbers = [("nan", "nan"), ("inf", "inf"), ("negative", "-3e12"), ("zero", "0"), ("string", "lots"),
                   ("overflow", "1e400"), ("boolean", "true"), ("empty", "")]

    # ---- race probe (30)
    for label, F in bad_numbers:
        add(Case(f"probe --full-run {label}", "race probe", "cli", args=["probe", "{run}", "--full-run", F],
                 check=unchanged))
    for label, F in (("F = B", f"{B:g}"), ("F < B", f"{B / 2:g}"), ("1e30 × B", f"{B * 1e30:g}"),
                     ("2000 × B", f"{B * 2000:g}"), ("900 × B, covers 2.7 %", f"{B * 900:g}")):
        add(Case(f"probe absurd budget: {label}", "race probe", "cli", args=["probe", "{run}", "--full-run", F],
                 check=unchanged))
    for label, extra in (("--rho 1.5", ["--rho", "1.5"]), ("--rho nan", ["--rho", "nan"]),
                         ("--rho -0.1", ["--rho", "-0.1"]), ("--lr 0", ["--lr", "0"]), ("--lr 5", ["--lr", "5"]),
                         ("--lr nan", ["--lr", "nan"]), ("--lr text", ["--lr", "fast"]),
                         ("--device cuda:7", ["--device", "cuda:7"]), ("--device gpu", ["--device", "gpu"])):
        add(Case(f"probe {label}", "race probe", "cli", args=["probe", "{run}", "--full-run", f"{2 * B:g}", *extra],
                 check=unchanged))
    F2 = f"{2 * B:g}"
    add(Case("probe missing results", "race probe", "cli", args=["probe", "{w}/nope", "--full-run", F2]))
    add(Case("probe a folder without results.json", "race probe", "cli", args=["probe", "{out}", "--full-run", F2]))
    add(Case("probe binary results.json", "race probe", "cli", args=["probe", "{run}", "--full-run", F2],
             setup=raw_results(os.urandom(4096))))
    add(Case("probe truncated results.json", "race probe", "cli", args=["probe", "{run}", "--full-run", F2],
             setup=lambda ctx: _write(ctx.res, open(RESULTS).read()[:5000])))
    add(Case("probe duplicated keys", "race probe", "cli", args=["probe", "{run}", "--full-run", F2],
             setup=lambda ctx: _write(ctx.res, open(RESULTS).read().replace('"kind":', '"kind": "x", "kind":', 1))))
    add(Case("probe tampered budget (string)", "race probe", "cli", args=["probe", "{run}", "--full-run", F2],
             setup=tamper(lambda d: d["config"].__setitem__("budget", "big"))))
    add(Case("probe tampered probe record", "race probe", "cli", args=["probe", "{run}", "--full-run", F2],
             setup=tamper(lambda d: d.__setitem__("probes", [{"full_run_budget": 6e11, "covers": "all"}]))))
    add(Case("probe a .gz results file", "race probe", "cli",
             args=["probe", os.path.join(ROOT, "docs", "runs", "default.results.json.gz"), "--full-run", F2]))
    add(Case("probe results without a verdict", "race probe", "cli",
             args=["probe", "{w}/nov.json", "--full-run", "4e10"], setup=lambda ctx: shutil.copy(CHECKPOINTS, os.path.join(ctx.w, "nov.json"))))
    add(Case("probe /dev/zero as results", "race probe", "cli", args=["probe", "/dev/zero", "--full-run", F2], timeout=60))
    add(Case("probe a FIFO as results.json", "race probe", "cli", args=["probe", "{w}/fifo.json", "--full-run", F2],
             setup=lambda ctx: os.mkfifo(os.path.join(ctx.w, "fifo.json")), timeout=60))
    add(Case("probe results.json a planted symlink to a victim", "race probe", "cli", compute="fake",
             args=["probe", "{w}/link/results.json", "--full-run", F2],
             setup=lambda ctx: (os.makedirs(os.path.join(ctx.w, "link")),
                                shutil.copy(RESULTS, ctx.victim),
                                os.symlink(ctx.victim, os.path.join(ctx.w, "link", "results.json")))))
    add(Case("probe in a read-only folder", "race probe", "cli", compute="fake", user="nobody",
             args=["probe", "{run}", "--full-run", F2], setup=readonly("run"), check=unchanged))
    add(Case("probe that runs (a stored pilot)", "race probe", "cli", expect="ok", compute="fake",
             args=["probe", "{run}", "--full-run", F2, "--quiet"], check=probes_kept(1)))
    out.append(Case("two probes on one folder at once", "race probe", "custom", call=_two_probes, timeout=300))

    # ---- race pilot --probe (14): every one refused before calibration, or let through to it
    for label, F in (("F = B", f"{DEFAULT_B:g}"), ("F < B", "1e3"), ("1e30 × B", f"{DEFAULT_B * 1e30:g}"),
                     ("2000 × B", f"{DEFAULT_B * 2000:g}"), ("600 × B, covers 4 %", f"{DEFAULT_B * 600:g}"),
                     ("900 × B, covers 2.7 %", f"{DEFAULT_B * 900:g}")):
        add(Case(f"pilot --probe {label}", "race pilot --probe", "cli",
                 args=["pilot", "--probe", "--full-run", F, "--out", "{w}/grid"], check=nothing_at("grid")))
    for label, F in (("nan", "nan"), ("negative", "-1"), ("string", "big"), ("inf", "inf")):
        add(Case(f"pilot --probe --full-run {label}", "race pilot --probe", "cli",
                 args=["pilot", "--probe", "--full-run", F, "--out", "{w}/grid"], check=nothing_at("grid")))
    add(Case("pilot --probe without a full run", "race pilot --probe", "cli",
             args=["pilot", "--probe", "--out", "{w}/grid"], check=nothing_at("grid")))
    add(Case("pilot --probe 600 × B, --adaptive-share 0.2", "race pilot --probe", "cli",
             args=["pilot", "--probe", "--full-run", f"{DEFAULT_B * 600:g}", "--adaptive-share", "0.2", "--out",
                   "{w}/grid"], check=nothing_at("grid")))
    add(Case("pilot --probe 100 × B (covers 24 %): runs", "race pilot --probe", "cli", expect="compute",
             args=["pilot", "--probe", "--full-run", f"{DEFAULT_B * 100:g}", "--out", "{w}/grid"]))
    add(Case("pilot --probe 600 × B, --budget 2e12: runs", "race pilot --probe", "cli", expect="compute",
             args=["pilot", "--probe", "--full-run", f"{DEFAULT_B * 600:g}", "--budget", "2e12", "--out", "{w}/grid"]))

    # ---- race report --full-run (22)
    for label, F in bad_numbers:
        add(Case(f"report --full-run {label}", "race report", "cli", args=["report", "{run}", "--full-run", F],
                 check=unchanged))
    add(Case("report --full-run 2 × B", "race report", "cli", expect="ok", args=["report", "{run}", "--full-run", F2],
             check=unchanged))
    add(Case("report --full-run 1e30 × B: no range, no forecast", "race report", "cli", expect="ok",
             args=["report", "{run}", "--full-run", f"{B * 1e30:g}"],
             check=lambda ctx, p: None if ("no range at F" in p.stdout and "no forecast" in p.stdout) else
             ("silent wrong", "a range or forecast at 1e30 × B")))
    add(Case("report forecast at F far below the first checkpoint", "race report", "cli", expect="ok",
             args=["report", CHECKPOINTS, "--full-run", "1e3"],
             check=lambda ctx, p: ("silent wrong", "a forecast 'interpolated' at 5e-8 × B, below every checkpoint")
             if "interpolated inside the pilot budget" in p.stdout else None))
    add(Case("report missing file", "race report", "cli", args=["report", "{w}/nope.json", "--full-run", F2]))
    add(Case("report a folder without results", "race report", "cli", args=["report", "{out}", "--full-run", F2]))
    add(Case("report binary file", "race report", "cli", args=["report", "{run}", "--full-run", F2],
             setup=raw_results(b"\x00\xff" * 3000)))
    add(Case("report empty file", "race report", "cli", args=["report", "{run}", "--full-run", F2], setup=raw_results("")))
    add(Case("report a JSON list", "race report", "cli", args=["report", "{run}", "--full-run", F2],
             setup=raw_results("[1, 2, 3]")))
    add(Case("report truncated JSON", "race report", "cli", args=["report", "{run}", "--full-run", F2],
             setup=lambda ctx: _write(ctx.res, open(RESULTS).read()[:-200])))
    add(Case("report duplicated keys", "race report", "cli", args=["report", "{run}", "--full-run", F2],
             setup=lambda ctx: _write(ctx.res, open(RESULTS).read().replace('"config":', '"config": {}, "config":', 1))))
    add(Case("report budget 1e999 in the file", "race report", "cli", args=["report", "{run}", "--full-run", F2],
             setup=lambda ctx: _write(ctx.res, open(RESULTS).read().replace('"budget": 300000000000.0', '"budget": 1e999', 1))))
    add(Case("report tampered probe record", "race report", "cli", args=["report", "{run}", "--full-run", F2],
             setup=tamper(lambda d: d.__setitem__("probes", [{"full_run_budget": 6e11, "status": "held",
                                                             "learning_rate": "fast", "steps": 3}]))))
    add(Case("report --pool a missing file", "race report", "cli",
             args=["report", "{run}", "--full-run", F2, "--pool", "{w}/nope.json"]))
    add(Case("report --pool another setup", "race report", "cli",
             args=["report", "{run}", "--full-run", F2, "--pool", CHECKPOINTS]))
    add(Case("report --plot through a planted symlink", "race report", "cli",
             args=["report", "{run}", "--full-run", F2, "--plot", "{w}/fig.png"], setup=symlink_victim("fig.png")))
    add(Case("report --plot into a missing folder (made, as mkdir -p)", "race report", "cli", expect="ok",
             args=["report", "{run}", "--full-run", F2, "--plot", "{w}/no/such/fig.png"],
             check=lambda ctx, p: None if os.path.getsize(os.path.join(ctx.w, "no", "such", "fig.png")) > 1000 else
             ("silent wrong", "no figure")))
    add(Case("report --force-forecast without F", "race report", "cli", args=["report", "{run}", "--force-forecast"]))

    # ---- race recipe --emit (20)
    base = ["recipe", "{run}", "--for", "trl", "--full-run", F2]
    add(Case("recipe --emit into a new folder", "race recipe --emit", "cli", expect="ok", compute="none",
             args=[*base, "--emit", "{w}/emit"], check=emitted))
    add(Case("recipe --emit into a folder in use", "race recipe --emit", "cli", compute="none",
             args=[*base, "--emit", "{w}/emit"], setup=lambda ctx: _write(os.path.join(ctx.w, "emit", "notes.txt"), "mine\n"),
             check=user_file_kept))
    add(Case("recipe --emit --force into a folder in use", "race recipe --emit", "cli", expect="ok", compute="none",
             args=[*base, "--emit", "{w}/emit", "--force"],
             setup=lambda ctx: _write(os.path.join(ctx.w, "emit", "notes.txt"), "mine\n"), check=both(emitted, user_file_kept)))
    for rel in ("emit/race_reward.py", "emit/recipe.json", "emit/data/train.jsonl", "emit/data/test.jsonl"):
        add(Case(f"recipe --emit --force, {rel.split('/', 1)[1]} a planted symlink", "race recipe --emit", "cli",
                 compute="none", args=[*base, "--emit", "{w}/emit", "--force"], setup=symlink_victim(rel)))
    add(Case("recipe --emit --force, data/ a symlink to a folder elsewhere", "race recipe --emit", "cli", compute="none",
             args=[*base, "--emit", "{w}/emit", "--force"],
             setup=lambda ctx: (os.makedirs(os.path.join(ctx.w, "emit")), os.symlink(ctx.out, os.path.join(ctx.w, "emit", "data")))))
    add(Case("recipe --emit onto a file", "race recipe --emit", "cli", compute="none", args=[*base, "--emit", "{w}/f"],
             setup=lambda ctx: _write(os.path.join(ctx.w, "f"), "x")))
    add(Case("recipe --emit into a read-only folder", "race recipe --emit", "cli", compute="none", user="nobody",
             args=[*base, "--emit", "{w}/ro/emit"], setup=readonly("ro")))
    for label, F in (("nan", "nan"), ("negative", "-1"), ("1e400", "1e400"), ("text", "huge")):
        add(Case(f"recipe --emit --full-run {label}", "race recipe --emit", "cli", compute="none",
                 args=["recipe", "{run}", "--for", "trl", "--full-run", F, "--emit", "{w}/emit"], check=nothing_at("emit")))
    for label, extra in (("--rho 1.5", ["--rho", "1.5"]), ("--rho nan", ["--rho", "nan"]), ("--gpus 0", ["--gpus", "0"]),
                         ("--for megatron", ["--for", "megatron"])):
        add(Case(f"recipe --emit {label}", "race recipe --emit", "cli", compute="none",
                 args=[*base, *extra, "--emit", "{w}/emit"], check=nothing_at("emit")))
    add(Case("recipe --force without --emit", "race recipe --emit", "cli", compute="none", args=[*base, "--force"]))
    add(Case("recipe --emit from a missing file", "race recipe --emit", "cli", compute="none",
             args=["recipe", "{w}/nope.json", "--for", "trl", "--full-run", F2, "--emit", "{w}/emit"], check=nothing_at("emit")))
    out.append(Case("two --emit into one new folder at once", "race recipe --emit", "custom", call=_two_emits, timeout=300))

    # ---- race.fullrun.watch (26)
    from race.fullrun import watch as W

    def api(name: str, call: Callable, expect: str = "refuse", check: Callable | None = None, setup=None,
            timeout: float = 60, surface: str = "race.fullrun.watch") -> None:
        add(Case(name, surface, "api", expect=expect, call=call, check=check, setup=setup, timeout=timeout))

    nan, inf = float("nan"), float("inf")
    for label, v in (("'100'", "100"), ("0", 0), ("nan", nan), ("True", True), ("10**5000", 10 ** 5000), ("2.5", 2.5)):
        api(f"Watch(total_steps={label})", lambda ctx, v=v: W.Watch(total_steps=v))
    for label, v in (("[0.5, 2]", [0.5, 2]), ("'8'", "8"), ("-1", -1), ("[nan]", [nan])):
        api(f"Watch(checkpoints={label})", lambda ctx, v=v: W.Watch(total_steps=100, checkpoints=v))
    api("Watch.due('x')", lambda ctx: W.Watch(total_steps=10).due("x"))
    api("Watch.record(0, 'abc')", lambda ctx: W.Watch(total_steps=10).record(0, "abc"))
    api("Watch.record(0, [nan])", lambda ctx: W.Watch(total_steps=10).record(0, [nan]))
    api("check_scores(None)", lambda ctx: W.check_scores(None))
    api("check_scores([(0, [True])])", lambda ctx: W.check_scores([(0, [True])]))
    api("check_means(prompts='100')", lambda ctx: W.check_means([(0, 0.5)], prompts="100"))
    api("check_means(mean 1.5)", lambda ctx: W.check_means([(0, 0.5), (3, 1.5)], prompts=100))
    api("verl_history(missing folder)", lambda ctx: W.verl_history(os.path.join(ctx.w, "none")))
    api("verl_history(a file)", lambda ctx: W.verl_history(ctx.res))
    api("verl_history(binary dump)", lambda ctx: W.verl_history(os.path.join(ctx.w, "d")),
        setup=lambda ctx: _write(os.path.join(ctx.w, "d", "0.jsonl"), os.urandom(2000)))
    api("verl_history(score 1e999)", lambda ctx: W.verl_history(os.path.join(ctx.w, "d")),
        setup=lambda ctx: _write(os.path.join(ctx.w, "d", "0.jsonl"), '{"input": "a", "score": 1e999}\n'))
    api("verl_history(score NaN)", lambda ctx: W.verl_history(os.path.join(ctx.w, "d")),
        setup=lambda ctx: _write(os.path.join(ctx.w, "d", "0.jsonl"), '{"input": "a", "score": NaN}\n'))
    api("verl_history(0.jsonl -> /dev/zero)", lambda ctx: W.verl_history(os.path.join(ctx.w, "d")),
        setup=lambda ctx: (os.makedirs(os.path.join(ctx.w, "d")), os.symlink("/dev/zero", os.path.join(ctx.w, "d", "0.jsonl"))))
    api("verl_history(max_bytes=-1)", lambda ctx: W.verl_history(ctx.w, max_bytes=-1))
    api("trl_callback(prompts a string)", lambda ctx: W.trl_callback("1+1=", lambda **k: [1.0]))
    api("trl_callback(reward_func 'exact')", lambda ctx: W.trl_callback(["1+1="], "exact"))
    api("trl_callback(timeout nan)", lambda ctx: W.trl_callback(["1+1="], lambda **k: [1.0], timeout=nan))
    api("trl_callback(samples 0)", lambda ctx: W.trl_callback(["1+1="], lambda **k: [1.0], samples=0))
    api("trl_callback(columns short)", lambda ctx: W.trl_callback(["a", "b"], lambda **k: [1.0], columns={"answer": ["1"]}))
    for label, checker in (("hangs", _hangs), ("raises", _raises), ("calls sys.exit", _exits), ("calls os._exit", _os_exits),
                           ("returns nonsense", _nonsense), ("busy-loops", _busy)):
        api(f"TRL watch: a checker that {label}", lambda ctx, c=checker: _train_with(c), expect="ok",
            check=_trained_on, timeout=120)

    # ---- race.stats.drift and race.stats.rate (18)
    from race.stats import drift as D
    from race.stats import rate as R

    def ra(**kw):
        args = {"pilot_budget": 1e12, "full_run_budget": 1e13, **kw}
        rng = args.pop("rng", (0.3, 0.6))
        rec = args.pop("rec", 0.5)
        return lambda ctx: D.range_at(rng, rec, **args)

    for label, kw in (("inverted range", {"rng": (0.6, 0.3)}), ("nan ρ", {"rec": nan}), ("ρ outside", {"rec": 0.9}),
                      ("string range", {"rng": "0.3-0.6"}), ("F < B", {"full_run_budget": 1e11}),
                      ("F 1e300", {"full_run_budget": 1e300}), ("B 0", {"pilot_budget": 0}),
                      ("drift inf", {"drift": inf}), ("drift_se -1", {"drift_se": -1}), ("B True", {"pilot_budget": True})):
        api(f"range_at: {label}", ra(**kw), surface="race.stats.drift")
    api("shrink(spread=0)", lambda ctx: D.shrink(0.1, 0.1, spread=0), surface="race.stats.drift")
    api("shrink(nan): the population's drift, as documented", lambda ctx: D.shrink(nan, 0.1), expect="ok",
        surface="race.stats.drift", check=lambda ctx, r: None if r == (D.POPULATION_DRIFT, D.POPULATION_SPREAD) else
        ("silent wrong", f"{r}"))
    from race.config.configfile import LearningRate

    for label, kw in (("full_lr nan", {"full_lr": nan}), ("full_lr -1e-3", {"full_lr": -1e-3}),
                      ("status 'fine'", {"status": "fine"}), ("factor -1", {"factor": -1}),
                      ("factor '10'", {"factor": "10"}), ("probe lr 'fast'", {"probe": {"status": "held", "learning_rate": "fast"}})):
        args = {"status": "at risk", "factor": 10, "full_lr": 1e-3, **kw}
        api(f"full_run_rate: {label}", lambda ctx, a=args: R.full_run_rate(LearningRate(), **a), surface="race.stats.rate")
    api("configured_lr(fixed 'false')", lambda ctx: R.configured_lr({"learning_rate": {"fixed": "false"}}),
        surface="race.stats.rate")
    api("apply_rate(scale 3)", lambda ctx: R.apply_rate(LearningRate(), {"scale": 3.0, "schedule": "cosine", "warmup": 0.05}),
        surface="race.stats.rate")

    # ---- race.stats.forecast (16)
    from race.core.records import Regime
    from race.stats import curvefit as CF
    from race.stats import forecast as FC
    from race.stats.results import load_results

    def fc(**kw):
        args = {"target": "reward", "full_run_budget": 4e10, "pilot_regime": Regime.BALANCED, "pilot_best_rho": 0.5,
                "n_boot": 20, **kw}
        runs = args.pop("runs", None)
        return lambda ctx: FC.forecast(runs if runs is not None else [(load_results(CHECKPOINTS).pilots, 2e10)], **args)

    for label, kw in (("F nan", {"full_run_budget": nan}), ("F '4e10' string", {"full_run_budget": "4e10"}),
                      ("F 10**5000", {"full_run_budget": 10 ** 5000}), ("regime 'balanced'", {"pilot_regime": "balanced"}),
                      ("best ρ 1.5", {"pilot_best_rho": 1.5}), ("force 'no'", {"force": "no"}),
                      ("n_boot 0", {"n_boot": 0}), ("level 1.0", {"confidence_level": 1.0}),
                      ("runs a dict", {"runs": {"a": 1}}), ("runs budget -1", {"runs": [([], -1.0)]})):
        api(f"forecast: {label}", fc(**kw), surface="race.stats.forecast")
    api("forecast at F below every checkpoint", fc(full_run_budget=1e3), expect="ok", surface="race.stats.forecast",
        check=lambda ctx, f: ("silent wrong", f"status {f.status} at 5e-8 × B, below every checkpoint: {f.message[:80]}")
        if f.status != "refused" else None)
    api("forecast: n_boot 10**9 (absurd)", fc(n_boot=10 ** 9), surface="race.stats.forecast", timeout=60)
    api("with_forecast(results a path)", lambda ctx: FC.with_forecast(ctx.res, full_run_budget=6e11),
        surface="race.stats.forecast")
    api("with_forecast(F -1)", lambda ctx: FC.with_forecast(load_results(RESULTS), full_run_budget=-1),
        surface="race.stats.forecast")
    api("with_forecast(pool 'x')", lambda ctx: FC.with_forecast(load_results(RESULTS), full_run_budget=6e11, pool="x"),
        surface="race.stats.forecast")
    api("with_forecast(n_boot 10**9)", lambda ctx: FC.with_forecast(load_results(CHECKPOINTS), full_run_budget=4e10,
                                                                    n_boot=10 ** 9), surface="race.stats.forecast")
    api("model_value(negative FLOPs)", lambda ctx: CF.model_value("sigmoid", {"A": 0.5, "c_mid": 1e10, "B": 1}, 0.3, -1e9),
        surface="race.stats.forecast")
    api("model_value(missing param)", lambda ctx: CF.model_value("loglinear", {"a": 1}, 0.3, 1e10),
        surface="race.stats.forecast")
    api("fit_surface(model 'cubic')", lambda ctx: CF.fit_surface("cubic", [([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])], 0.1,
                                                                 unit=True), surface="race.stats.forecast")
    api("budget_range(schedule 'exp')", lambda ctx: FC.budget_range(load_results(RESULTS), None, 6e11, "exp"),
        surface="race.stats.forecast")
    return out


# ----------------------------------------------------------------------------- custom cases

def _two_probes(ctx: Ctx) -> tuple[str, str]:
    """Two race probe runs on one folder at once (a stored pilot, 2 s each, then both store): both records kept."""
    env = {**os.environ, "PYTHONPATH": RACE, "CAMPAIGN_MARK": ctx.mark, "CAMPAIGN_COMPUTE": "fake",
           "CAMPAIGN_RESULTS": RESULTS, "CAMPAIGN_SLEEP": "2", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WRAPPER, "probe", ctx.run, "--full-run", f"{2 * B:g}", "--lr", lr,
                               "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ctx.w)
             for lr in ("3e-4", "2e-4")]
    try:
        outs = [p.communicate(timeout=280) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return "hang", "the two probes did not finish"
    if any("Traceback" in e for _, e in outs):
        return "traceback", outs[0][1][-160:] + outs[1][1][-160:]
    codes = [p.returncode for p in procs]
    lrs = sorted(p.get("learning_rate") for p in (_doc(ctx).get("probes") or []))
    if codes == [0, 0] and lrs == [2e-4, 3e-4]:
        return GOOD, "both records kept"
    if 2 in codes and len(lrs) == codes.count(0):
        return GOOD, "one refused in one line, the other kept"
    return "lost file", f"exit codes {codes}, records {lrs}"


def _two_emits(ctx: Ctx) -> tuple[str, str]:
    """Two race recipe --emit into one new folder at once: both succeed or one refuses; the files are whole."""
    env = {**os.environ, "PYTHONPATH": RACE, "CAMPAIGN_MARK": ctx.mark, "CAMPAIGN_COMPUTE": "none",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WRAPPER, "recipe", ctx.run, "--for", t, "--full-run", f"{2 * B:g}",
                               "--emit", os.path.join(ctx.w, "emit")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=ctx.w) for t in ("trl", "trl")]
    try:
        outs = [p.communicate(timeout=280) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return "hang", "the two emits did not finish"
    if any("Traceback" in e for _, e in outs):
        return "traceback", (outs[0][1] + outs[1][1])[-200:]
    codes = sorted(p.returncode for p in procs)
    bad = emitted(ctx, None)
    if bad:
        return bad
    if codes in ([0, 0], [0, 2]):
        return GOOD, f"exit codes {codes}, the files whole"
    return "silent wrong", f"exit codes {codes}"


# checkers for the TRL watch (module level: the forked worker and the campaign's child see them)
def _hangs(prompts, completions, **kw):
    time.sleep(3600)


def _busy(prompts, completions, **kw):
    while True:
        pass


def _raises(prompts, completions, **kw):
    raise ValueError("boom")


def _exits(prompts, completions, **kw):
    sys.exit(1)


def _os_exits(prompts, completions, **kw):
    os._exit(5)


def _nonsense(prompts, completions, **kw):
    return ["lots"] * len(prompts)


def _train_with(checker: Callable) -> dict:
    """The hooks a trainer calls, on a stand-in model (tests/test_hardening.py's), with ``checker``
    under a 1 s timeout; what reaches the trainer, the lines logged and the processes left."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_hardening import _train

    from race.fullrun.watch import trl_callback

    lines: list[str] = []
    before = _children()
    t0 = time.monotonic()
    control = _train(trl_callback(["1+1=", "2+5="], checker, timeout=1.0, log=lines.append))
    time.sleep(0.3)
    import threading

    threads = [t.name for t in threading.enumerate() if t.name.startswith("race-watch") and t.is_alive()]
    return {"stopped": control.should_training_stop, "lines": lines, "seconds": time.monotonic() - t0,
            "left": sorted(_children() - before), "threads": threads}


def _children() -> set[int]:
    """Live (not zombie) processes whose parent is this one or whose session this one leads'
    children lead: what a checker left running."""
    me, out = os.getpid(), set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] not in ("Z", "X") and int(stat[1]) == me:
            out.add(int(name))
    return out


def _trained_on(ctx: Ctx, got: dict) -> tuple[str, str] | None:
    if got["stopped"]:
        return "silent wrong", "the checker's failure stopped the training"
    if got["left"] or got["threads"]:
        return "hang", f"the checker is still running in the background ({got['left'] or got['threads']})"
    if not got["lines"] or any("\n" in ln for ln in got["lines"]):
        return "multi-line error", f"lines: {got['lines'][:2]}"
    if got["seconds"] > 30:
        return "hang", f"the training waited {got['seconds']:.0f} s"
    return None


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="run the cases whose name or surface holds this text")
    ap.add_argument("--json", default=None, help="write every case's outcome here")
    ap.add_argument("--race", default=None, help="the checkout whose race package is tried (default: this one)")
    args = ap.parse_args(argv)
    if args.race and os.path.abspath(args.race) != RACE:      # start again with that checkout's race first
        env = {**os.environ, "CAMPAIGN_RACE": os.path.abspath(args.race)}
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--race")
        return subprocess.call([sys.executable, os.path.abspath(__file__), *rest[:i], *rest[i + 2:]], env=env)
    todo = [c for c in cases() if not args.only or args.only in c.name or args.only in c.surface]
    base = tempfile.mkdtemp(prefix="race-campaign-")
    os.chmod(base, 0o755)
    rows = []
    t0 = time.monotonic()
    try:
        for i, case in enumerate(todo, 1):
            cls, note = run_case(case, base)
            rows.append({"case": case.name, "surface": case.surface, "class": cls, "note": note})
            flag = "  " if cls == GOOD else "!!"
            print(f"{flag} {i:3d} {case.surface:20s} {case.name[:58]:58s} {cls:16s} {note[:110]}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"\n{len(rows)} cases in {time.monotonic() - t0:.0f} s\n")
    surfaces = sorted({r["surface"] for r in rows}, key=lambda s: [r["surface"] for r in rows].index(s))
    classes = [GOOD, *BAD]
    head = f"| {'surface':20s} | cases | " + " | ".join(classes) + " |"
    print(head)
    print("|" + "---|" * (len(classes) + 2))
    for s in [*surfaces, "all"]:
        mine = [r for r in rows if s == "all" or r["surface"] == s]
        counts = [sum(r["class"] == c for r in mine) for c in classes]
        name = f"**{s}**" if s == "all" else s
        print(f"| {name:20s} | {len(mine)} | " + " | ".join(str(n) for n in counts) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0 if all(r["class"] == GOOD for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
