"""Pausing a pilot at a FLOP mark and continuing it later, bit for bit: the base of budget halving
(issue 49, item 2), where the ρ that survive a rung continue from their state rather than restart.

``Continuation(config, schedule, seeds, stop_at=, state_dir=, resume=, device=)`` is what the one
pilot loop (race.engine.pilot.pilot_events) asks at three moments: before any compute (the arguments
checked and, when resuming, every seed's state file read and checked against the pilot), after the
engine is built (``restore``: each seed's state put back), and when a seed stops at the mark
(``pause``: its state saved, its held-out reading taken, a ``PilotPaused`` returned).

A seed's state file (``state_file``: ``pilot-rho<ρ target>-seed<seed>.state`` in the folder given)
holds everything its later steps depend on: the adapter tensors, the AdamW state, the learning-rate
schedule's position, its sampling generator, torch's, python's and numpy's global streams, its
``PilotLoop`` (prompt order, cursor and ``random.Random``, FLOPs spent by category, curve, steps,
reward errors, sync gaps), its held-out checkpoints and the next one due, its seconds per phase, and
the pauses it went through. The file is a header line (``RACE-PILOT-STATE 1 <sha256 of the rest>``)
and a ``torch.save`` payload read back with ``weights_only=True`` (tensors and plain values only).
``copy_state`` copies one into another folder, so a continuation (budget halving's next rung,
race.run.processes) saves its own pause there and leaves the state it started from whole.

Invariants:
- a pilot paused at a mark and resumed (in a new process, alone or in another lockstep group of
  seeds) ends with the ``PilotResult`` of the same pilot run straight through, bit for bit, but for
  its seconds (``wall_seconds``, checkpoints' ``seconds``) and ``extra["pauses"]`` (what the pauses
  were and what their readings cost); tests/test_continuation.py checks it on the lean and peft paths;
- a seed pauses where a pilot with the mark as its budget would stop (``PilotLoop``'s half-step
  rule); a seed whose budget ends first finishes as usual;
- the reading at a mark is the final evaluation's (every held-out prompt, its generator
  ``10_007 + seed``): what the pilot would report if it ended there, paired across ρ by seed; it
  touches no training stream, and its FLOPs are apart from the budget (``PilotPaused.eval_flops``);
- files are written through race.core.safeio.write_inside and read without following a link; a
  damaged file, one of another pilot (config, ρ schedule, seed, device) or of other library
  versions, and a mark not past the state, are one ``PilotStateError`` line before any model loads;
- the vLLM backend is refused: its engine's sampling state is not saved.
"""
from __future__ import annotations

import hashlib
import math
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping

from race.config.configfile import GridConfig
from race.core.errors import RaceError
from race.core.records import Checkpoint, FlopBreakdown, Record, Schedule
from race.core.safeio import quote, write_inside

MAGIC, FORMAT_VERSION = b"RACE-PILOT-STATE", b"1"
# config keys that choose or size pilots but change nothing inside one (its schedule, compared whole, carries
# what they decide), so a pilot planned in one grid may continue in another
PILOT_FREE_KEYS = ("grid", "seeds", "first_seed", "name", "full_run_budget", "models", "pilot_design",
                   "pilot_share", "gpu_memory")


class PilotStateError(RaceError):
    """A pause or a resume RACE refuses: a bad mark, a state file that is missing, a link, damaged, or
    of another pilot or other library versions. One line naming the file and what was expected."""


@dataclass(frozen=True)
class PilotPaused(Record):
    """A seed's pilot paused at a FLOP ``mark``: what it measured so far, and where its state is.

    ``evals``: the held-out reading at the mark, per prompt (the final evaluation's prompts,
    settings and seed: the numbers the pilot's ``PilotResult.evals`` would hold had it ended here);
    ``flops``: the training FLOPs spent (``steps`` steps); ``curve`` and ``checkpoints``: so far;
    ``eval_flops``: what the reading cost, apart from the budget; ``state_file``: where to resume."""

    rho_target: float
    seed: int
    mark: float
    flops: FlopBreakdown
    steps: int
    evals: Mapping[str, tuple[float, ...]]
    curve: tuple[tuple[float, float], ...] = ()
    checkpoints: tuple[Checkpoint, ...] = ()
    eval_flops: FlopBreakdown = FlopBreakdown()
    wall_seconds: Mapping[str, float] = field(default_factory=dict)
    state_file: str = ""

    def score(self, target: str) -> float:
        vals = self.evals[target]
        return sum(vals) / len(vals) if vals else float("nan")


def state_file(state_dir: str, schedule: Schedule, seed: int) -> str:
    """The path of seed ``seed``'s state file for the pilot of ``schedule`` in ``state_dir``."""
    return os.path.join(state_dir, f"pilot-rho{schedule.rho_target:.6g}-seed{int(seed)}.state")


def pilot_identity(config: GridConfig, schedule: Schedule, seed: int, device: str) -> dict:
    """What a state file must match to continue a pilot: the config (less ``PILOT_FREE_KEYS``), the
    schedule, the seed, the device and the library versions (plain values)."""
    import json

    from race.engine.loading import software_versions

    cfg = {k: v for k, v in config.to_dict().items() if k not in PILOT_FREE_KEYS}
    software = {k: v for k, v in software_versions().items() if k != "vllm"}   # vllm: refused anyway
    return json.loads(json.dumps({"seed": int(seed), "schedule": schedule.to_dict(), "config": cfg,
                                  "device": str(device), "software": software}))


def _difference(want: Any, got: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first (dotted key, expected, found) where ``got`` differs from ``want``; None if equal."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got), key=str):
            d = _difference(want.get(k, "(absent)"), got.get(k, "(absent)"), f"{path}.{k}" if path else str(k))
            if d:
                return d
        return None
    return None if want == got else (path, want, got)


def check_identity(found: Any, want: dict, path: str) -> None:
    """Refuse (one ``PilotStateError`` line) a state whose identity differs from ``want``: seed, ρ
    target, schedule, config, device, library versions, in that order, naming the first key that
    differs."""
    if not isinstance(found, dict):
        raise PilotStateError(f"pilot state {path!r} has no pilot identity: not a state RACE wrote")
    for part, sub in (("seed", None), ("schedule", "rho_target"), ("schedule", None), ("config", None),
                      ("device", None), ("software", None)):
        want_part, got_part = want[part], found.get(part, "(absent)")
        if sub is not None:
            got_part = got_part.get(sub, "(absent)") if isinstance(got_part, dict) else got_part
            want_part = want_part[sub]
        d = _difference(want_part, got_part, f"{part}.{sub}" if sub else part)
        if d:
            key, expected, got = d
            what = "library version " if part == "software" else ""
            raise PilotStateError(f"pilot state {path!r} is of another pilot: {what}{key} is {quote(got, 80)} in "
                                  f"the file, expected {quote(expected, 80)} (a state continues only the pilot "
                                  "that saved it)")


def write_state(state_dir: str, name: str, state: dict) -> str:
    """``state`` as a state file ``state_dir/name`` (header and checksum, then the torch payload),
    written through race.core.safeio.write_inside; returns its path."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    header = b" ".join((MAGIC, FORMAT_VERSION, hashlib.sha256(payload).hexdigest().encode())) + b"\n"
    return write_inside(state_dir, name, header + payload, what="pilot state")


def _read_bytes(path: str) -> bytes:
    """The bytes of ``path``, refused when missing, a symbolic link or not a regular file."""
    if os.path.islink(path):
        raise PilotStateError(f"pilot state {path!r} is a symbolic link: RACE never reads a state through a link")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise PilotStateError(f"pilot state {path!r} does not exist: pause the pilot first "
                              "(pilot_events(..., stop_at=FLOPS, state_dir=DIR))") from None
    except OSError as e:
        raise PilotStateError(f"pilot state {path!r} cannot be opened: {e.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise PilotStateError(f"pilot state {path!r} is not a regular file")
        return fh.read()


def copy_state(source_dir: str, state_dir: str, schedule: Schedule, seed: int) -> str:
    """Copy seed ``seed``'s state file of the pilot of ``schedule`` from ``source_dir`` into ``state_dir``
    (read without following a link, written through race.core.safeio.write_inside), so a continuation
    can save its own pause there and leave the state it started from whole; returns the new path."""
    path = state_file(source_dir, schedule, seed)
    return write_inside(state_dir, os.path.basename(path), _read_bytes(path), what="pilot state")


def read_state(path: str) -> dict:
    """The state saved in ``path``, refused (one ``PilotStateError`` line) when the file is missing,
    a link, not a state file, of another format version, or damaged (its checksum)."""
    import io

    import torch

    header, _, payload = _read_bytes(path).partition(b"\n")
    parts = header.split(b" ")
    if len(parts) != 3 or parts[0] != MAGIC:
        raise PilotStateError(f"pilot state {path!r} is not a RACE pilot state (no {MAGIC.decode()} header)")
    if parts[1] != FORMAT_VERSION:
        raise PilotStateError(f"pilot state {path!r} has format {quote(parts[1].decode(errors='replace'), 40)}, "
                              f"expected {FORMAT_VERSION.decode()}: pause the pilot again with this RACE")
    if hashlib.sha256(payload).hexdigest().encode() != parts[2]:
        raise PilotStateError(f"pilot state {path!r} is damaged: its checksum does not match its contents "
                              "(a partial copy or a changed byte); pause the pilot again")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — any unpickling failure is the same refusal
        raise PilotStateError(f"pilot state {path!r} cannot be read: {type(e).__name__}") from None
    if not isinstance(state, dict) or not {"identity", "adapter", "loop"} <= set(state):
        raise PilotStateError(f"pilot state {path!r} lacks a pilot's state (adapter, loop): not a state RACE wrote")
    return state


def check_mark(stop_at: Any, budget: float) -> float | None:
    """``stop_at`` as a FLOP mark below ``budget`` (None: no pause), else one ``PilotStateError`` line."""
    if stop_at is None:
        return None
    if isinstance(stop_at, bool) or not isinstance(stop_at, (int, float)) or not math.isfinite(stop_at):
        raise PilotStateError(f"stop_at {quote(stop_at, 60)} is not a number of FLOPs")
    if not 0 < stop_at < budget:
        raise PilotStateError(f"stop_at {stop_at:.4g} must lie between 0 and the pilot's budget {budget:.4g} FLOPs "
                              "(a pilot ends at its budget without pausing)")
    return float(stop_at)


def global_streams(device: str) -> dict:
    """torch's (and CUDA's on a GPU), python's and numpy's global random states, as plain values."""
    import random

    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    out = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    if str(device).startswith("cuda"):
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_global_streams(streams: dict, device: str) -> None:
    import random

    import numpy as np
    import torch

    torch.set_rng_state(streams["torch"])
    random.setstate(streams["python"])
    kind, keys, pos, has_gauss, cached = streams["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "cuda" in streams and str(device).startswith("cuda"):
        torch.cuda.set_rng_state(streams["cuda"], device)


class Continuation:
    """A pilot loop's pauses and resumes (module docstring). ``mark``: the FLOP mark where its seeds
    pause (None: they run to their budget); ``states``: each seed's loaded state when resuming
    (None: the pilots start fresh). Built before any model loads, so every refusal comes first."""

    def __init__(self, config: GridConfig, schedule: Schedule, seeds: list[int], *, stop_at: float | None = None,
                 state_dir: str | None = None, resume: bool = False, device: str = "cpu"):
        self.config, self.schedule, self.seeds, self.device = config, schedule, list(seeds), device
        self.mark, self.state_dir = check_mark(stop_at, config.budget), state_dir
        self.states: list[dict] | None = None
        self.pauses: list[list[dict]] = [[] for _ in self.seeds]
        if self.mark is None and not resume:
            return
        if not state_dir:
            raise PilotStateError("pausing or resuming a pilot needs state_dir, the folder of its state files")
        from race.engine.backends import resolve_backend

        if resolve_backend(config.backend) == "vllm":
            raise PilotStateError("a pilot on the vllm backend cannot pause or resume (its engine's sampling "
                                  "state is not saved): use backend hf")
        if resume:
            self.states = [self._load(seed) for seed in self.seeds]
            self.pauses = [list(s.get("pauses", [])) for s in self.states]

    def _load(self, seed: int) -> dict:
        path = state_file(self.state_dir, self.schedule, seed)
        state = read_state(path)
        check_identity(state["identity"], pilot_identity(self.config, self.schedule, seed, self.device), path)
        spent = sum(state["loop"]["spent"])
        if self.mark is not None and self.mark <= spent:
            raise PilotStateError(f"stop_at {self.mark:.4g} is not past pilot state {path!r}, which has spent "
                                  f"{spent:.4g} FLOPs: give a later mark, or none to run to the budget")
        return state

    def restore(self, engine, loops: list, checks: list) -> None:
        """Put each seed's saved state into a freshly built engine, its loops and checkpoints (no-op
        when starting fresh); the sampling weights are merged again from the restored adapters (FLOPs
        not counted: the paused run counted its own merge)."""
        if self.states is None:
            return
        import torch

        for k, state in enumerate(self.states):
            path = state_file(self.state_dir, self.schedule, self.seeds[k])
            params = engine.trainer.parameters_of(engine.seeds[k])
            saved = state["adapter"]
            if [tuple(p.shape) for p in params] != [tuple(t.shape) for t in saved]:
                raise PilotStateError(f"pilot state {path!r} holds an adapter of another shape than this pilot's")
            try:
                with torch.no_grad():
                    for p, t in zip(params, saved):
                        p.copy_(t)
                engine.optimizers[k].load_state_dict(state["optimizer"])
                if engine.lr_schedulers[k] is not None:
                    engine.lr_schedulers[k].load_state_dict(state["lr_schedule"])
                engine.generators[k].set_state(state["generator"])
                loops[k].load_state(state["loop"])
                checks[k].load_state(state["checkpoints"])
            except (KeyError, TypeError, ValueError, RuntimeError) as e:
                raise PilotStateError(f"pilot state {path!r} does not fit this pilot: {quote(str(e), 120)}") from None
            walls = dict(state["walls"])
            walls["setup"] = walls.get("setup", 0.0) + engine.walls[k]["setup"]
            engine.walls[k] = walls
        set_global_streams(self.states[0]["streams"], self.device)
        engine.backend.sync(engine.seeds)

    def pause(self, engine, k: int, view, data, loop, checks) -> PilotPaused:
        """Seed ``engine.seeds[k]`` stops at the mark: its held-out reading (race.engine.loop's
        ``held_out_evaluation``), then its state saved; returns the ``PilotPaused`` event."""
        import time

        from race.engine.loop import held_out_evaluation

        seed = engine.seeds[k]
        t = time.perf_counter()
        scores, cost = held_out_evaluation(view, view.backend, data, seed)
        seconds = time.perf_counter() - t
        engine.walls[k]["readings"] = engine.walls[k].get("readings", 0.0) + seconds
        self.pauses[k].append({"mark": self.mark, "step": loop.steps, "flops": loop.spent.total,
                               "eval_flops": cost.total})
        state = {"identity": pilot_identity(self.config, self.schedule, seed, self.device),
                 "adapter": [p.detach().clone() for p in engine.trainer.parameters_of(seed)],
                 "optimizer": engine.optimizers[k].state_dict(),
                 "lr_schedule": None if engine.lr_schedulers[k] is None else engine.lr_schedulers[k].state_dict(),
                 "generator": engine.generators[k].get_state(), "streams": global_streams(self.device),
                 "loop": loop.state(), "checkpoints": checks.state(), "walls": dict(engine.walls[k]),
                 "pauses": self.pauses[k]}
        name = os.path.basename(state_file(self.state_dir, self.schedule, seed))
        path = write_state(self.state_dir, name, state)
        return PilotPaused(rho_target=self.schedule.rho_target, seed=seed, mark=self.mark, flops=loop.spent,
                           steps=loop.steps, evals=scores, curve=tuple(loop.curve), checkpoints=tuple(checks.records),
                           eval_flops=cost, wall_seconds=dict(engine.walls[k]), state_file=path)

    def extra(self, k: int) -> dict:
        """What joins a finished pilot's ``extra``: ``pauses`` (mark, step, FLOPs spent, the reading's
        FLOPs) when it went through any."""
        return {"pauses": self.pauses[k]} if self.pauses[k] else {}
