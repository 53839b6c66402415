"""The live check of the replay (issue 49; research/scripts/live_design.py, research/validation/live49.yaml):
docs/pilot.md's "Live check of the replay" table is what the committed records give, and every record was
made by the plan's design. Reads committed records only (no run)."""
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

PLAN = Path(ROOT) / "research" / "validation" / "live49.yaml"


def _records():
    plan = yaml.safe_load(PLAN.read_text(encoding="utf-8"))
    out = []
    for s in plan["settings"]:
        path = Path(ROOT) / plan["records"] / f"{s['name']}.json.gz"
        if path.is_file():
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                out.append(json.load(fh))
    return plan, out


def test_every_record_ran_the_planned_design():
    plan, recs = _records()
    assert recs, "no live record committed"
    lad = plan["design"]["ladder"]
    for rec in recs:
        flags = f"--halving-eta {lad['eta']} --halving-rungs {lad['rungs']} --halving-keep {lad['keep']}"
        assert "--adaptive-policy budget-halving" in rec["command"] and flags in rec["command"], rec["setting"]
        bh = rec["budget_halving"]
        assert (bh["eta"], bh["rungs"], bh["keep"]) == (lad["eta"], lad["rungs"], lad["keep"])
        assert bh["marks"] == pytest.approx([rec["budget"] / lad["eta"], rec["budget"]], rel=1e-5)   # 6 digits kept
        top = {p["rho_target"] for p in rec["pilots"] if "budget_halving" not in p["extra"]}
        assert len(top) == (len(rec["grid"]) + 1) // 2                  # the best half reached B
        assert len(rec["pilots"]) == len(rec["grid"]) * plan["design"]["seeds"]


def test_the_docs_table_is_the_committed_records():
    r = subprocess.run([sys.executable, "research/scripts/live_design.py", "tables", "--check", "docs/pilot.md"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_every_share_record_ran_what_race_sizes_at_the_planned_share():
    """The plan's addendum 2 (``at_share``): each record ran ``race pilot --full-run F --design D --share S``
    and its budget is what race.run.sizing sizes for that grid (research/scripts/live_share.py)."""
    plan = yaml.safe_load(PLAN.read_text(encoding="utf-8"))["at_share"]
    paths = sorted((Path(ROOT) / plan["records"]).glob("*.json.gz"))
    assert paths, "no at-share record committed"
    sys.path.insert(0, str(Path(ROOT) / "research" / "scripts"))
    import live_share

    planned = {live_share.key_of(i, d): (i, d) for i in live_share.planned_grids() for d in plan["designs"]}
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            rec = json.load(fh)
        i, d = planned[path.name[:-len(".json.gz")]]
        assert f"--design {d} --share {plan['share']:g}" in rec["command"] and f"--full-run {rec['F']:.6g}" in rec["command"]
        want, _ = live_share.sized(i, d, Path(ROOT))
        assert rec["budget"] == pytest.approx(want["budget"], rel=1e-6) and len(rec["pilots"]) == len(want["pilots"])


def test_the_share_tables_are_the_committed_records():
    r = subprocess.run([sys.executable, "research/scripts/live_share.py", "tables", "--check", "docs/pilot.md"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
