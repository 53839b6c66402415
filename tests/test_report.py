import json
from dataclasses import replace

import pytest

from race.core.records import (Diagnosis, FlopBreakdown, PilotResult, PointSummary, Regime, Schedule,
                          TargetVerdict)
from race.stats.report import render_diagnosis, render_plan
from race.stats.results import Results, diagnose_results, load_results, save_results, ResultsError


def _sched(rho):
    per = FlopBreakdown(1e9 * (1 - rho), 1e9 * rho, 0.0)
    return Schedule(rho, 8, 8, 8, 1, 10, 1e-3, 8, per, per.scaled(10))


def _diag():
    pts = tuple(PointSummary(r, r + 0.005, 2, FlopBreakdown(1e12 * (1 - r), 1e12 * r, 0), 0.5 - 0.1 * r,
                             (0.49 - 0.1 * r, 0.51 - 0.1 * r), _sched(r)) for r in (0.3, 0.6, 0.85))
    v = TargetVerdict("reward", Regime.SEARCH_HEAVY, (0.3, 0.45), 0.93, 0.3, 0.47, -0.09, (-0.12, -0.05),
                      None, pts, {"loglinear": {"a": 0.4, "b": -0.09}}, ("best at grid boundary (ρ=0.30)",),
                      open_side="below")      # search-heavy with the best at the lowest ρ: race.stats.regime opens it
    return Diagnosis("reward", {"reward": v}, ("targets disagree",), {"model": "tiny", "backend": "hf"})


@pytest.mark.parametrize("fmt", ["text", "md", "latex"])
def test_render_diagnosis_formats(fmt):
    out = render_diagnosis(_diag(), fmt)
    assert "search-heavy" in out and "0.4700" in out and "best at grid boundary" in out
    assert ("ρ ≤ 0.45" if fmt != "latex" else r"$\rho$ $\leq$ 0.45") in out   # the open range, as the rule gives it
    assert "[0.30, 0.45]" not in out
    if fmt == "text":
        assert "recommended ρ ≤ 0.45 · confidence 0.93" in out
    assert "70.0% / 30.0% / 0.0%" in out.replace(r"\%", "%")  # shares of the ρ=0.3 point
    if fmt == "latex":
        assert r"\toprule" in out and r"\bottomrule" in out and "_" not in out.replace(r"\_", "")
    if fmt == "md":
        assert "|" in out and "### RACE diagnosis" in out


def test_render_diagnosis_json_roundtrip():
    d = json.loads(render_diagnosis(_diag(), "json"))
    assert d["schema_version"] == 1 and d["kind"] == "diagnosis" and d["regime"] == "search-heavy"
    back = Diagnosis.from_dict(d)
    assert back == _diag()


def test_results_roundtrip_and_errors(tmp_path):
    pilots = tuple(PilotResult(r, s, FlopBreakdown(1e12 * (1 - r), 1e12 * r), {"reward": (0.5, 0.25)},
                               _sched(r), ((0.0, 0.1), (1e12, 0.5))) for r in (0.3, 0.6) for s in (0, 1))
    path = save_results(str(tmp_path), Results(pilots=pilots, diagnosis=_diag()))
    assert path.endswith("results.json")
    res = load_results(str(tmp_path))
    assert res.pilots == pilots and res.diagnosis == _diag()
    assert diagnose_results(res) == _diag()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultsError, match="not valid JSON"):
        load_results(str(tmp_path / "bad.json"))
    (tmp_path / "v9.json").write_text('{"schema_version": 9}')
    with pytest.raises(ResultsError, match="schema_version 9"):
        load_results(str(tmp_path / "v9.json"))
    with pytest.raises(ResultsError, match="does not exist"):
        load_results(str(tmp_path / "missing.json"))
    import gzip                                  # docs/runs keeps results gzip-compressed: read as they are
    with open(path, "rb") as src, gzip.open(tmp_path / "r.json.gz", "wb") as dst:
        dst.write(src.read())
    assert load_results(str(tmp_path / "r.json.gz")).pilots == pilots
    (tmp_path / "bin.json").write_bytes(b"\x00\xff\xfe binary")
    with pytest.raises(ResultsError, match="is not a JSON text file"):
        load_results(str(tmp_path / "bin.json"))


def test_render_plan_formats():
    from conftest import TINY_MODEL
    from race.config.configfile import GridConfig
    from race.flops.grid import plan_grid

    plan = plan_grid(GridConfig(model=TINY_MODEL, budget=1.5e12, prompt_len=6, completion_len=4, grid=(0.5, 0.6, 0.75, 0.85, 0.92),
                                full_run_budget=1e15))
    text = render_plan(plan, "text")
    assert "ρ achieved" in text and "of the full-run budget" in text
    data = json.loads(render_plan(plan, "json"))
    assert data["kind"] == "plan" and len(data["schedules"]) == 5
    for s in data["schedules"]:
        assert abs(s["rho"] - s["rho_target"]) <= 0.02
    assert r"\toprule" in render_plan(plan, "latex")


def test_the_report_names_the_backend_and_software_the_pilots_ran():
    """pilots_meta: backends and version sets of the complete pilots, in first-seen order; the
    report prints them in its head."""
    from dataclasses import replace

    from race.stats.results import pilots_meta

    sw = {"race": "0.1.0", "python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.19.0", "peft": "0.21.2"}
    other = {**sw, "torch": "2.11.0+cu130", "transformers": "5.17.0"}
    base = PilotResult(0.3, 0, FlopBreakdown(1.0, 1.0), {"reward": (0.5,)}, _sched(0.3))
    pilots = [replace(base, extra={"backend": "hf", "software": sw}),
              replace(base, seed=1, extra={"backend": "hf", "software": sw}),
              replace(base, seed=2, extra={"backend": "vllm (sleep mode)", "software": {**other, "vllm": "0.32.0"}}),
              replace(base, seed=3, status="failed", extra={"backend": "lean", "software": {**sw, "torch": "x"}})]
    meta = pilots_meta({"model": "tiny", "backend": "auto"}, pilots)
    assert meta == {"model": "tiny", "backend": "hf, vllm (sleep mode)",
                    "software": "torch 2.13.0+cpu, transformers 5.19.0, peft 0.21.2; "
                                "torch 2.11.0+cu130, transformers 5.17.0, peft 0.21.2, vllm 0.32.0"}
    assert pilots_meta({"backend": "hf"}, [base]) == {"backend": "hf"}      # old pilots: no software recorded
    assert pilots_meta({}, pilots, adaptive={"policy": "informative", "rungs": 2}, full_grid=12)["adaptive"] \
        == "informative, 3 of 12 pilots"                                      # complete pilots only
    out = render_diagnosis(replace(_diag(), meta=meta), "text")
    assert "software: torch 2.13.0+cpu, transformers 5.19.0, peft 0.21.2; torch 2.11.0+cu130" in out


def _timed(seconds_by_rho):
    """_diag() with wall seconds per phase at each grid point (ρ → (rollout, update))."""
    d = _diag()
    v = d.primary
    pts = tuple(replace(p, seconds={"setup": 5.0, "rollout": seconds_by_rho[p.rho_target][0], "reward": 0.5,
                                    "update": seconds_by_rho[p.rho_target][1], "sync": 0.5, "eval": 9.0})
                for p in v.points)
    return replace(d, verdicts={"reward": replace(v, points=pts)})


def test_wall_time_column_and_line_by_hand():
    # search FLOPs 1e12·(1−ρ): 0.7e12, 0.4e12, 0.15e12 over rollouts of 7, 4, 1.5 s → 1e11 FLOP/s;
    # learning 1e12·ρ: 0.3e12, 0.6e12, 0.85e12 over updates of 1, 2, 2.5 s → 1.75e12 / 5.5 s
    d = _timed({0.3: (7.0, 1.0), 0.6: (4.0, 2.0), 0.85: (1.5, 2.5)})
    assert [p.budget_seconds for p in d.primary.points] == [9.0, 7.0, 5.0]   # setup and eval left out
    out = render_diagnosis(d)
    head = next(line for line in out.splitlines() if line.startswith("ρ target"))
    assert head.rstrip().endswith("wall s")
    assert "9.0" in next(line for line in out.splitlines() if line.startswith("0.30"))
    line = next(line for line in out.splitlines() if "wall time per pilot" in line)
    assert "5.0 s at ρ=0.85 … 9.0 s at ρ=0.30" in line
    assert "rollout 1e+11 FLOP/s" in line and f"update {1.75e12 / 5.5:.3g} FLOP/s" in line
    assert "reward" not in line.split(";")[1]      # rule reward: no FLOPs, no rate
    assert "equal FLOPs took unequal time" in line  # 9.0 > 1.25 × 5.0


def test_wall_time_within_the_spread_says_nothing_more_and_untimed_diagnoses_have_no_column():
    d = _timed({0.3: (4.0, 1.0), 0.6: (3.5, 1.5), 0.85: (3.0, 2.0)})   # 6.0, 6.0, 6.0 s
    out = render_diagnosis(d)
    assert "wall time per pilot" in out and "unequal time" not in out
    plain = render_diagnosis(_diag())
    assert "wall s" not in plain and "wall time per pilot" not in plain


def test_point_seconds_roundtrip_and_older_files_without_them():
    p = _timed({0.3: (7.0, 1.0), 0.6: (4.0, 2.0), 0.85: (1.5, 2.5)}).primary.points[0]
    assert PointSummary.from_dict(p.to_dict()) == p
    old = p.to_dict()
    del old["seconds"]
    assert PointSummary.from_dict(old).seconds == {} and PointSummary.from_dict(old).budget_seconds == 0.0


def test_a_regime_prints_as_the_report_names_it():
    assert str(Regime.SEARCH_HEAVY) == "search-heavy" and f"{Regime.BALANCED}" == "balanced"
    assert Regime("update-heavy") is Regime.UPDATE_HEAVY and Regime.UPDATE_HEAVY == "update-heavy"


def test_a_diagnosis_prints_as_its_report():
    assert str(_diag()) == render_diagnosis(_diag()) and _diag()._repr_markdown_() == render_diagnosis(_diag(), "md")


def test_latex_and_markdown_escape_text_from_files():
    """A model path or a name read from a results file prints as itself: LaTeX's $ { } ~ are escaped in one pass
    (the report's own $\\rho$ is not escaped again), and a Markdown cell's | does not open a column (a review of
    session 39)."""
    from race.stats.report import _escape, render_table

    assert _escape("a_b$c{d}~e\\f ρ ≤ 0.5", "latex") == \
        r"a\_b\$c\{d\}\textasciitilde{}e\textbackslash{}f $\rho$ $\leq$ 0.5"
    table = render_table([["models/a|b", "1"]], ["model", "n"], "md").splitlines()
    assert table[2].count("|") - table[2].count("\\|") == 3 and "models/a\\|b" in table[2]
