"""The study ↔ pilot mapping: a trial's params name its grid point and seed, a finished trial's
user attrs hold the whole ``PilotResult`` (evals and curve compact, race.run.store.codec). A stage of
budget halving (race.run.adaptive.budget) is a trial with the user attr ``rung`` set when it is
enqueued; one below the top ends PRUNED with its ``PilotPaused`` in ``paused`` (``paused_attrs``).
Invariants: ``pilot_from_attrs(pilot_attrs(r)) == r``; ``paused_from_attrs(paused_attrs(p)) == p``."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from optuna.trial import FrozenTrial

from race.core.records import PilotResult
from race.run.store.codec import ENCODED, get_chunked, json_blob, unjson_blob, decode_floats, encode_floats

Key = tuple[float, int]


def key_of(t: FrozenTrial) -> Key | None:
    p = t.params or t.system_attrs.get("fixed_params") or {}
    if "rho" not in p or "seed" not in p:
        return None
    return (float(p["rho"]), int(p["seed"]))


def rung_of(t: FrozenTrial) -> int | None:
    """The budget-halving rung of trial ``t`` (None: an ordinary pilot)."""
    rung = t.user_attrs.get("rung")
    return None if rung is None else int(rung)


def paused_attrs(paused: Any, primary_target: str) -> dict[str, Any]:
    """The user attrs of a stage that paused at its mark: the whole ``PilotPaused`` (compressed JSON)
    and its ``reading`` (mean ``primary_target`` score)."""
    return {"paused": json_blob(paused.to_dict()), "reading": paused.score(primary_target)}


def paused_from_attrs(attrs: Mapping[str, Any]) -> Any:
    from race.engine.continuation import PilotPaused

    return PilotPaused.from_dict(unjson_blob(get_chunked(attrs, "paused")))


def is_pilot_failure(t: FrozenTrial) -> bool:
    """A FAIL trial whose pilot itself failed (an exception, an out-of-memory kill), as opposed to
    one abandoned by a dead worker (failed by the heartbeat check or a local liveness check)."""
    return "error" in t.user_attrs and not t.user_attrs.get("stale")


def downsample(curve: Sequence[tuple[float, float]], n: int) -> list[tuple[float, float]]:
    if len(curve) <= n:
        return list(curve)
    idx = sorted({round(i * (len(curve) - 1) / (n - 1)) for i in range(n)})
    return [curve[i] for i in idx]


def pilot_attrs(result: PilotResult) -> dict[str, Any]:
    """The user attrs of a finished pilot's trial (see the module docstring)."""
    d = result.to_dict()
    rest = {k: v for k, v in d.items() if k not in ("evals", "curve", "checkpoints")}
    attrs: dict[str, Any] = {"result": rest, "flops": d["flops"], "rho_measured": result.rho,
                             "schedule": d["schedule"], "scores": {t: result.score(t) for t in result.evals},
                             "evals": sorted(result.evals), "steps": result.extra.get("steps"),
                             "curve": encode_floats(x for pair in result.curve for x in pair)}
    for target, values in result.evals.items():
        attrs[f"evals:{target}"] = encode_floats(values)
    if d["checkpoints"]:
        attrs["checkpoints"] = json_blob(d["checkpoints"])
    return attrs


def pilot_from_attrs(attrs: Mapping[str, Any]) -> PilotResult:
    d = dict(attrs["result"])
    flat = decode_floats(get_chunked(attrs, "curve") or ENCODED)
    d["curve"] = [flat[i:i + 2] for i in range(0, len(flat), 2)]
    d["evals"] = {t: decode_floats(get_chunked(attrs, f"evals:{t}")) for t in attrs.get("evals", [])}
    blob = get_chunked(attrs, "checkpoints")
    d["checkpoints"] = unjson_blob(blob) if blob else []
    return PilotResult.from_dict(d)
