"""The third validation round (issue 48): the pilot design it scores, its freeze, and (after it) its scores.

    python research/scripts/validation.py --suite research/validation/round3.yaml status
    python research/scripts/validation.py --suite research/validation/round3.yaml queue --pin DIR
    python research/scripts/validation_round3.py design             # RACE's pilots per setting, from configs only
    python research/scripts/validation_round3.py freeze --rule C --drift C --probe C --rate C --design C

The batch (``research/validation/round3.yaml``) runs through round 1–2's machinery
(research/scripts/validation.py: a pinned checkout, storage outside the tree, compact records, sealed
kinds). What this module adds:

- **RACE's pilots per setting** (``design``): the user's config is the setting's base config with its
  overrides (its own pilot grid and seeds, as ``race init`` or a hand-written config gives them), the
  full run F of the suite, and ``race pilot --full-run F --design fit`` at the suite's share
  (race.run.sizing.size_pilots: the same function ``race pilot`` calls, held-out evaluation counted).
  It reads configs only: no run, sealed or not.
- **The freeze** (``freeze``): records once the commits of the regime rule, the drift model, the
  stability probe, the rate for F and the pilot design scored. Before it no sealed grid is read; after
  it a change is reported beside the frozen scores, never instead of them.

Invariant: nothing here opens a committed run of a sealed kind while the suite's ``freeze`` is null.
"""
from __future__ import annotations

import datetime as _dt
import re
import sys
from pathlib import Path
from typing import Any

FROZEN_KEYS = ("rule", "drift", "probe", "rate", "design")


def _v():
    import validation as v          # scripts/ is on sys.path when run as research/scripts/validation.py

    return v


def user_config(s: dict, suite: dict) -> Any:
    """The config a user of setting ``s`` runs ``race pilot`` on: the base config's own grid and seeds with the
    setting's overrides, and the full run F (a GridConfig)."""
    import yaml

    from race.config import presets
    from race.config.configfile import config_from_dict

    v = _v()
    raw = v.grid_config(s, "full10", 1, suite=suite)           # the base config with the overrides, at F
    base = dict(presets.DEFAULT) if s["base"] == "default" else yaml.safe_load((v.ROOT / s["base"]).read_text())
    raw.update(name=f"r3-{s['name']}-pilots", grid=list(base.get("grid", presets.DEFAULT["grid"])),
               seeds=int(base.get("seeds", presets.DEFAULT["seeds"])), full_run_budget=float(s["full_run"]))
    return config_from_dict(raw)


def design_rows(suite: dict) -> list[dict[str, Any]]:
    """Per setting: what ``race pilot --full-run F --design fit`` runs at the suite's share (or why none)."""
    from race.core.errors import RaceError
    from race.run.sizing import size_pilots

    rows = []
    for s in suite["settings"]:
        cfg = user_config(s, suite)
        row = {"setting": s["name"], "full_run": float(s["full_run"]), "grid": list(cfg.grid), "seeds": cfg.seeds}
        try:
            _, d = size_pilots(cfg, full_run=float(s["full_run"]), design="fit", share=float(suite["share"]))
            row.update(pilots=[tuple(p) for p in d["pilots"]], budget=d["budget"], factor=d["factor"],
                       eval_flops=d["eval_flops"], spent=d["spent"], why=d["why"])
        except RaceError as e:
            row.update(pilots=[], why=str(e))
        rows.append(row)
    return rows


def design_table(rows: list[dict[str, Any]]) -> str:
    out = ["| setting | F | config grid × seeds | RACE's pilots (ρ × seeds) | B per pilot | F / B | "
           "evaluation per pilot |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        grid = f"{', '.join(f'{x:g}' for x in r['grid'])} × {r['seeds']}"
        if not r["pilots"]:
            out.append(f"| {r['setting']} | {r['full_run']:.3g} | {grid} | none: the prior ρ 0.46 with the whole "
                       "compute | – | – | – |")
            continue
        count: dict[float, int] = {}
        for rho, _ in r["pilots"]:
            count[rho] = count.get(rho, 0) + 1
        pil = ", ".join(f"{rho:g}" + (f" ×{n}" if n > 1 else "") for rho, n in sorted(count.items()))
        out.append(f"| {r['setting']} | {r['full_run']:.3g} | {grid} | {pil} | {r['budget']:.3g} | "
                   f"{r['factor']:.3g} | {r['eval_flops']:.3g} |")
    return "\n".join(out) + "\n"


def freeze(suite_path: Path, commits: dict[str, str], *, date: str | None = None) -> dict:
    """Write the suite's ``freeze`` mapping once (the commits scored); refuse a second freeze."""
    text = suite_path.read_text(encoding="utf-8")
    if not re.search(r"^freeze: null\b", text, flags=re.M):
        raise SystemExit(f"{suite_path}: already frozen (its `freeze:` line is not null); a change after "
                         "the freeze is reported beside the frozen scores")
    for label in FROZEN_KEYS:
        if not re.fullmatch(r"[0-9a-f]{7,40}", commits.get(label) or ""):
            raise SystemExit(f"--{label} {commits.get(label)!r} is not a commit: expected 7–40 hex digits")
    f = {**{k: commits[k] for k in FROZEN_KEYS}, "date": date or _dt.datetime.now(_dt.timezone.utc).date().isoformat()}
    line = "freeze: {" + ", ".join(f"{k}: '{x}'" for k, x in f.items()) + "}"
    suite_path.write_text(re.sub(r"^freeze: null\b.*$", line, text, count=1, flags=re.M), encoding="utf-8")
    return f


def main(argv: list[str] | None = None) -> int:
    import argparse

    v = _v()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=str(v.ROOT / "research" / "validation" / "round3.yaml"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("design", help="RACE's pilots per setting (configs only; nothing sealed is read)")
    fz = sub.add_parser("freeze", help="record the commits of the rule, drift, probe, rate and design scored")
    for k in FROZEN_KEYS:
        fz.add_argument(f"--{k}", required=True)
    args = ap.parse_args(argv)
    suite = v.load_suite(Path(args.suite))
    if args.cmd == "design":
        sys.stdout.write(design_table(design_rows(suite)))
        return 0
    print(freeze(Path(args.suite), {k: getattr(args, k) for k in FROZEN_KEYS}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
