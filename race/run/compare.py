"""``race compare``: several pilot grids side by side (reward systems, models, budgets).

Each run is a results file (or its folder). One row per run says what was piloted (model,
reward, budget per pilot, grid) and what RACE concluded for one target (verdict, recommended ρ
range, confidence, pilot-best point, slope per log ρ with its CI, reward-model share at the best
point, wall time per pilot).

Runs that share model, task and reward but differ in budget per pilot also get a **budget
line**: does the response to ρ move with compute? It compares the slope CIs at the smallest and
the largest budget; only disjoint CIs count as a change. Two budgets are no scaling law, so the
line never extrapolates; it says whether a change is resolved at all (a pilot budget far below
the full run's is the first thing to suspect when it is).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Sequence

from race.core.records import BUDGET_PHASES, TargetVerdict, format_rho_range
from race.stats.report import SCHEMA_VERSION, check_format, heading, render_lines, render_table, fmt_flops
from race.stats.results import Results, diagnose_results, load_results


@dataclass(frozen=True)
class RunSummary:
    """One pilot grid's row in a comparison."""

    label: str
    model: str
    task: str
    reward: str
    budget: float                       # FLOPs per pilot
    points: int                         # grid points
    seeds: int                          # most seeds at any point
    target: str
    regime: str
    rho_range: tuple[float, float]
    confidence: float
    best_rho: float
    best_score: float
    slope: float
    slope_ci: tuple[float, float]
    reward_share: float                 # C_reward / C_total at the pilot-best point
    wall_seconds: tuple[float, float]   # fastest, slowest grid point (0, 0: not recorded)
    open_side: str | None = None        # TargetVerdict.open_side: the range opens past the grid's edge


def summarize_run(results: Results, *, label: str, target: str | None = None) -> RunSummary:
    """The comparison row of one run, for ``target`` (default: the run's primary target)."""
    diag = diagnose_results(results)
    name = target or diag.primary_target
    if name not in diag.verdicts:
        raise ValueError(f"run {label!r} has no target {name!r}: expected one of {', '.join(diag.verdicts)}")
    v: TargetVerdict = diag.verdicts[name]
    meta = diag.meta
    best = min(v.points, key=lambda p: abs(p.rho_target - v.best_rho))
    timed = _point_seconds(results)
    budget = meta.get("budget_per_pilot") or results.config.get("budget") or best.flops.total
    return RunSummary(
        label=label, model=str(meta.get("model", "?")), task=str(meta.get("task", "?")),
        reward=str(meta.get("reward", "?")), budget=float(budget), points=len(v.points),
        seeds=max(p.n_seeds for p in v.points), target=name, regime=v.regime.value,
        rho_range=tuple(v.rho_range), open_side=v.open_side, confidence=v.confidence, best_rho=v.best_rho, best_score=v.best_reward,
        slope=v.slope, slope_ci=tuple(v.slope_ci), reward_share=best.flops.shares()["reward"],
        wall_seconds=(min(timed), max(timed)) if timed else (0.0, 0.0))


def _point_seconds(results: Results) -> list[float]:
    """Mean budgeted wall seconds per pilot at each grid point, from the pilots themselves (so
    results written before diagnoses carried timings have them too); points without timings
    are left out."""
    by_point: dict[float, list[float]] = {}
    for p in results.pilots:
        sec = sum(p.wall_seconds.get(k, 0.0) for k in BUDGET_PHASES)
        if p.status == "complete" and sec > 0:
            by_point.setdefault(p.rho_target, []).append(sec)
    return [sum(v) / len(v) for v in by_point.values()]


def load_runs(paths: Sequence[str], *, target: str | None = None) -> list[RunSummary]:
    """Summaries of the results files (or folders) at ``paths``, labelled by config name (or file
    name); runs sharing a name get ``@budget`` when that tells them apart, else ``#2``, ``#3`` …"""
    if len(paths) < 2:
        raise ValueError(f"compare needs at least 2 results files, got {len(paths)}")
    runs = []
    for path in paths:
        res = load_results(path)
        base = str(res.config.get("name") or os.path.splitext(os.path.basename(os.path.normpath(path)))[0])
        runs.append(summarize_run(res, label=base, target=target))
    return _unique_labels(runs)


def _unique_labels(runs: list[RunSummary]) -> list[RunSummary]:
    names = [r.label for r in runs]
    keyed = [f"{r.label}@{fmt_flops(r.budget)}" if names.count(r.label) > 1 else r.label for r in runs]
    out, seen = [], {}
    for r, label in zip(runs, keyed):
        seen[label] = seen.get(label, 0) + 1
        out.append(replace(r, label=label if seen[label] == 1 else f"{label}#{seen[label]}"))
    return out


def budget_trends(runs: Sequence[RunSummary]) -> list[str]:
    """One line per (model, task, reward, target) group piloted at ≥ 2 budgets."""
    groups: dict[tuple[str, str, str, str], list[RunSummary]] = {}
    for r in runs:
        groups.setdefault((r.model, r.task, r.reward, r.target), []).append(r)
    out = []
    for (model, task, reward, target), group in groups.items():
        if len({r.budget for r in group}) < 2:
            continue
        group = sorted(group, key=lambda r: r.budget)
        lo, hi = group[0], group[-1]
        steps = " → ".join(f"{r.slope:+.3f} ({r.slope_ci[0]:+.3f} … {r.slope_ci[1]:+.3f}) at {fmt_flops(r.budget)}"
                           for r in group)
        moved = lo.slope_ci[1] < hi.slope_ci[0] or hi.slope_ci[1] < lo.slope_ci[0]
        verdicts = " → ".join(r.regime for r in group)
        tail = ("the slope CIs at the smallest and largest budget are disjoint: the response to ρ changes with "
                "budget, so pilot nearer the full run's budget before trusting either verdict" if moved else
                "the slope CIs at the smallest and largest budget overlap: no change with budget is resolved")
        out.append(f"budget ({model} · {task} · {reward}, {target}): slope per log ρ {steps}; "
                   f"best ρ {' → '.join(f'{r.best_rho:.2f}' for r in group)}; verdict {verdicts}; {tail}")
    return out


def render_comparison(runs: Sequence[RunSummary], fmt: str = "text") -> str:
    """The runs as one table (text, md, latex) or JSON, then the budget lines."""
    check_format(fmt)
    trends = budget_trends(runs)
    if fmt == "json":
        return json.dumps({"schema_version": SCHEMA_VERSION, "kind": "comparison",
                           "runs": [asdict(r) for r in runs], "budget_trends": trends}, indent=2) + "\n"
    rows = []
    for r in runs:
        wall = "—" if not r.wall_seconds[1] else f"{r.wall_seconds[0]:.1f}–{r.wall_seconds[1]:.1f}"
        rows.append([r.label, r.model, r.reward, fmt_flops(r.budget), f"{r.points}×{r.seeds}", r.target, r.regime,
                     format_rho_range(r.rho_range, r.open_side), f"{r.confidence:.2f}",
                     f"{r.best_rho:.2f} ({r.best_score:.4f})",
                     f"{r.slope:+.4f} ({r.slope_ci[0]:+.4f} … {r.slope_ci[1]:+.4f})",
                     f"{100 * r.reward_share:.1f}%", wall])
    headers = ["run", "model", "reward", "FLOPs/pilot", "points×seeds", "target", "verdict", "ρ range",
               "confidence", "best ρ (score)", "slope per log ρ (CI)", "C_reward at best", "wall s/pilot"]
    parts = [heading("RACE comparison", fmt), render_table(rows, headers, fmt)]
    if trends:
        parts.append(render_lines(trends, fmt))
    return "\n\n".join(parts) + "\n"
