"""The validation suite as research/scripts/validation.py reads it (issue 16): the suite file, a
setting, the grids it plans (kinds, budgets, ρ grids, seeds), the ``race pilot`` config of one grid,
and what a committed record keeps of a pilot (``compact_pilot``). Moved out of validation.py
unchanged (issue 52); validation.py re-exports every name and keeps what reads the committed data
(``RUNS``) and runs the grids."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SUITE = ROOT / "research" / "validation" / "suite.yaml"
KINDS = {"pilot": 1, "full10": 10, "full30": 30, "full100": 100}
ROUND1_KINDS = ("pilot", "full10", "full30")   # the grids the first round's tables show
EXTENDED = "pilot-x1"        # the pilot grid after race pilot --extend 1 (run_extension); budget factor 1
N_BOOT = 1000


# ---------------------------------------------------------------- the suite

def load_suite(path: Path = SUITE) -> dict[str, Any]:
    import yaml

    suite = yaml.safe_load(path.read_text())
    names = [s["name"] for s in suite["settings"]]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: setting names repeat")
    return suite


def setting(suite: dict, name: str) -> dict[str, Any]:
    for s in suite["settings"]:
        if s["name"] == name:
            return s
    raise SystemExit(f"unknown setting {name!r}: expected one of {', '.join(s['name'] for s in suite['settings'])}")


GRID_KEYS = {"pilot": "pilot_grid", "full10": "full_grid", "full30": "long_grid", "full100": "longest_grid"}


def planned(s: dict, kind: str, suite: dict | None = None) -> bool:
    """Whether the suite plans grid ``kind`` for setting ``s``: every setting has a pilot and a 10 × B
    grid, only those with a ``long_grid`` a 30 × B one, and a ``longest_grid`` a 100 × B one. A suite
    with its own ``kinds`` (round 3) plans a kind for every setting, or for those holding its ``when`` key."""
    if (s.get("replaced_by") or s.get("dropped")) and kind != "pilot":   # round 2's replacement rule: pilots only
        return False
    if suite is not None and suite.get("kinds"):
        spec = suite["kinds"].get(kind)
        return spec is not None and (not spec.get("when") or bool(s.get(spec["when"])))
    return kind in ("pilot", "full10") or bool(s.get(GRID_KEYS[kind]))


def kinds_of(suite: dict) -> list[str]:
    """The grid kinds of a suite, in queue order: its own ``kinds`` (round 3: budgets stated by the full
    run F), else pilot and the 10 ×, 30 × and 100 × B grids."""
    if suite.get("kinds"):
        return list(suite.get("order") or suite["kinds"])
    return list(KINDS)


def budget_of(s: dict, kind: str, suite: dict | None = None) -> float:
    """FLOPs per run of grid ``kind`` of setting ``s``: B × the kind's factor (rounds 1–2), or, in a suite
    with its own ``kinds``, the setting's full run F × the kind's factor (round 3: C = F_r + P)."""
    if suite is not None and suite.get("kinds"):
        return float(s["full_run"]) * float(suite["kinds"][kind]["factor"])
    return float(s["pilot_budget"]) * KINDS.get(kind, 1)


def grid_of(s: dict, kind: str, suite: dict | None = None) -> list[float]:
    """The ρ targets of grid ``kind`` of setting ``s``: a grid key of the setting, or one point
    (round 3's baselines: ``on_policy``, or ``prior``, the suite's ``prior_rho``)."""
    if suite is not None and suite.get("kinds"):
        spec = suite["kinds"][kind]
        if "grid" in spec:
            return list(s.get(spec["grid"]) or [])
        return [float(suite["prior_rho"]) if spec["point"] == "prior" else float(s[spec["point"]])]
    return list(s.get(GRID_KEYS[kind]) or [])


def seeds_of(suite: dict, kind: str, s: dict | None = None) -> int:
    """Seeds per point of grid ``kind``: the setting's ``more_seeds`` for that kind where it has one
    (round 2: seeds added where the rule's seeds-needed advice on a full grid asked for them), else
    the suite's ``seeds``, one number or a mapping by kind."""
    more = (s or {}).get("more_seeds") or {}
    if kind in more:
        return int(more[kind])
    seeds = suite.get("seeds", 3)
    return int(seeds.get(kind, 3) if isinstance(seeds, dict) else seeds)


def sealed(suite: dict, kind: str) -> bool:
    """Whether grid ``kind`` of this suite is sealed: listed under ``sealed`` while ``freeze`` is unset.
    A sealed grid's results stay out of every table, summary and printout (research/scripts/validation_round2.py)."""
    return kind in (suite.get("sealed") or ()) and not suite.get("freeze")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def grid_config(s: dict, kind: str, seeds: int, *, root: Path | None = None, suite: dict | None = None) -> dict:
    """The config mapping of one grid of setting ``s`` (its budget per pilot: B × the kind's factor).
    Paths in the base config that start ``./`` or ``../`` (a downstream file) are made absolute
    against the base config's folder in ``root`` (the pinned checkout; default this one), since the
    written config lives in the grid's storage."""
    import yaml

    from race.config import presets

    root = Path(root or ROOT)
    base = dict(presets.DEFAULT) if s["base"] == "default" else yaml.safe_load((ROOT / s["base"]).read_text())
    if s["base"] != "default":
        here = (root / s["base"]).parent

        def near(v):
            return str((here / v).resolve()) if isinstance(v, str) and v.startswith(("./", "../")) else v
        for key in ("model", "task"):
            if key in base:
                base[key] = near(base[key])
        tasks = (base.get("eval") or {}).get("tasks")
        if tasks:
            base["eval"]["tasks"] = [near(t) if isinstance(t, str) else {**t, "path": near(t.get("path"))}
                                     for t in tasks]
    cfg = _merge(base, s.get("overrides") or {})
    fn = (cfg.get("reward") or {}).get("function")
    if isinstance(fn, str) and fn.startswith("RACE_ROOT/"):     # a suite's own reward file, in the pinned checkout
        cfg["reward"] = {**cfg["reward"], "function": str(root / fn[len("RACE_ROOT/"):])}
    budget = budget_of(s, kind, suite)
    grid = grid_of(s, kind, suite)
    if not grid:
        raise SystemExit(f"setting {s['name']!r} has no grid for {kind}")
    cfg.update(name=f"val-{s['name']}-{kind}", budget=budget, grid=list(grid), seeds=seeds)
    return cfg


# ---------------------------------------------------------------- compact data

def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else x
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def compact_pilot(p: dict) -> dict:
    """A results.json pilot, floats at 6 significant digits, ``extra`` trimmed to what the study reads."""
    out = dict(p)
    extra = p.get("extra") or {}
    out["extra"] = {k: extra[k] for k in ("steps", "reward_errors", "reward_first_error", "software", "error")
                    if k in extra}
    return _round(out)
