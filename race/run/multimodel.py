"""A grid over policies: one ρ grid per model at the same FLOPs per pilot, and their joint view.

The RACE paper's first finding is that the model and the allocation are chosen together: under
one budget a larger policy buys fewer rollouts and updates, which can move the best ρ. A config
with ``models: [A, B, …]`` (or ``race pilot --models A,B``) runs one ρ grid per policy and reads
them as one answer.

On disk (DIR: the grid's ``--out``)::

    DIR/LABEL/results.json   each policy's *part*: an ordinary grid folder (its own race.db unless
                             --storage names one storage for all), so race report, race compare,
                             race recipe and a resume work on a part unchanged
    DIR/models.json          the joint view (``kind: "models"``), rewritten after every part

Invariants:

- the parts share every setting but ``model`` and ``name`` (``NAME--LABEL``): the same budget per
  pilot, ρ grid, seeds, task and held-out prompts, so per-prompt scores are index-aligned across
  policies and the bootstrap pairs prompts across them (race.stats.fit.bootstrap_paired_grids);
- the joint view is a pure function of the parts' results files (``race report DIR`` recomputes
  it from them): per policy its verdict and range, its base accuracy and its costs (steps,
  rollouts, rollouts per 1e12 FLOPs); across policies the best (policy, ρ) with its CI and how
  often the bootstrap picks it, the gap between the best policy and each other, and whether the
  best ρ moved (disjoint recommended ranges of the smallest and the largest policy whose verdict
  is conclusive: an inconclusive grid locates no best ρ).

Pure: no torch, no optuna (the runner is race.run.api.run_models).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from race.config.configfile import GridConfig
from race.core.arguments import shown
from race.core.errors import RaceError
from race.core.records import PilotResult, format_rho_range, rho_bounds
from race.stats.report import SCHEMA_VERSION, check_format, heading, render_lines, render_table, fmt_flops
from race.stats.results import Results, diagnose_results, load_results, write_json_atomic

JOINT_FILE = "models.json"
PER_FLOPS = 1e12             # rollouts are reported per this many FLOPs


# ----------------------------------------------------------------------------- parts

def policy_label(model: str) -> str:
    """A short folder-safe name of a policy: ``race/tiny-arith-l`` → ``tiny-arith-l``,
    ``Qwen/Qwen2.5-7B`` → ``Qwen2.5-7B``, ``/data/ckpt/`` → ``ckpt``."""
    base = os.path.basename(os.path.normpath(model.rstrip("/"))) or "model"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", base).lstrip(".-") or "model"


def part_labels(models: Sequence[str]) -> list[str]:
    """One distinct label per policy (``#2``-style suffixes ``-2`` when two share a base name)."""
    out: list[str] = []
    for m in models:
        label, k = policy_label(m), 2
        while label in out:
            label, k = f"{policy_label(m)}-{k}", k + 1
        out.append(label)
    return out


def part_configs(config: GridConfig) -> list[tuple[str, GridConfig]]:
    """(label, config) of each policy of a grid over models: the same config with ``model`` set
    and ``name`` = ``NAME--LABEL`` (its study and results name)."""
    if not config.models:
        raise RaceError("config has no models: a grid over policies needs models: [A, B, …]")
    return [(label, config.with_overrides(model=m, name=f"{config.name}--{label}"[:128]))
            for label, m in zip(part_labels(config.models), config.models)]


# ----------------------------------------------------------------------------- the joint view

@dataclass(frozen=True)
class PointCost:
    """What one grid point of one policy bought with the budget (means over its complete seeds)."""

    rho_target: float
    score: float                 # mean held-out score of the target
    steps: float                 # rollout batches (outer steps) per pilot
    updates: float               # optimizer steps per pilot: steps × μ
    rollouts: float              # rollouts generated per pilot: steps × B_p × n_gen
    rollouts_per_1e12: float     # rollouts per 1e12 FLOPs spent
    flops: float                 # FLOPs spent per pilot


@dataclass(frozen=True)
class PolicySummary:
    """One policy's grid in the joint view."""

    label: str
    model: str
    parameters: int | None       # all parameters (race.flops.formulas.param_count); None: not readable
    base_pass_rate: float | None     # calibration: the base policy's sampled pass rate on training prompts
    base_accuracy: Mapping[str, Any]  # race_meta.json "accuracy" of a shipped asset (held-out), else {}
    base_heldout: float | None   # of those, the sampled (T=1) held-out accuracy on the grid's task, else None
    regime: str
    rho_range: tuple[float, float]
    confidence: float
    best_rho: float
    best_score: float
    slope: float
    slope_ci: tuple[float, float]
    best_share: float            # bootstrap share of replicates whose overall best is in this policy
    costs: tuple[PointCost, ...]
    open_side: str | None = None     # TargetVerdict.open_side: the range opens past the grid's edge

    @property
    def bounds(self) -> tuple[float, float]:
        return rho_bounds(self.rho_range, self.open_side)


@dataclass(frozen=True)
class JointView:
    """Several policies' grids at one budget per pilot, read as one answer."""

    target: str
    budget: float
    level: float                 # confidence level of every CI here (the parts' classify level)
    n_boot: int
    policies: tuple[PolicySummary, ...]
    best_label: str
    best_rho: float
    best_score: float
    best_ci: tuple[float, float]     # CI of the best (policy, ρ) point's mean score
    best_share: float                # share of replicates in which that point is the best of all
    gaps: tuple[tuple[str, float, float, float], ...]   # (other label, best-of-best minus best-of-other, CI lo, hi)
    lines: tuple[str, ...]           # the conclusions, one sentence each

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "models", **asdict(self)}


def _complete(results: Results) -> list[PilotResult]:
    return sorted((p for p in results.pilots if p.status == "complete"), key=lambda p: (p.rho_target, p.seed))


def point_costs(results: Results, target: str) -> tuple[PointCost, ...]:
    """Per grid point: mean score, steps, updates, rollouts, rollouts per 1e12 FLOPs, FLOPs."""
    by: dict[float, list[PilotResult]] = {}
    for p in _complete(results):
        by.setdefault(p.rho_target, []).append(p)
    out = []
    for rho, ps in sorted(by.items()):
        rows = []
        for p in ps:
            s = p.schedule
            steps = float(p.extra.get("steps", s.steps if s else 0))
            rollouts = steps * (s.prompts_per_step * s.n_gen if s else 0)
            rows.append((p.score(target), steps, steps * (s.mu if s else 1), rollouts, p.flops.total))
        m = np.mean(np.asarray(rows, dtype=float), axis=0)
        out.append(PointCost(rho_target=rho, score=float(m[0]), steps=float(m[1]), updates=float(m[2]),
                             rollouts=float(m[3]), rollouts_per_1e12=float(m[3] / m[4] * PER_FLOPS) if m[4] else 0.0,
                             flops=float(m[4])))
    return tuple(out)


def _parameters(model: str) -> int | None:
    from race.flops.formulas import param_count
    from race.flops.catalog import load_arch

    try:
        return int(param_count(load_arch(model, allow_approximate=True)))
    except (ValueError, OSError, KeyError):
        return None


def _asset_accuracy(model: str) -> dict[str, Any]:
    """The held-out accuracy a shipped asset records in its race_meta.json (pre-training, not
    part of the pilot budget); {} for other models."""
    from race.flops.catalog import resolve_model_path

    path = os.path.join(resolve_model_path(model), "race_meta.json")
    try:
        with open(path, encoding="utf-8") as fh:
            return dict(json.load(fh).get("accuracy") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def _base_heldout(accuracy: Mapping[str, Any], task: str) -> float | None:
    """The asset's sampled held-out accuracy on ``task`` (``arithmetic-easy`` → ``easy_sampled``):
    what the pilots' sampled evaluation measures before any RL step."""
    key = f"{task.split('-', 1)[1]}_sampled" if task.startswith("arithmetic-") else None
    value = accuracy.get(key) if key else None
    return float(value) if isinstance(value, (int, float)) else None


def _grid(results: Results, target: str):
    from race.stats.fit import grid_scores

    ps = _complete(results)
    return grid_scores(rho_targets=[p.rho_target for p in ps], pilot_seeds=[p.seed for p in ps],
                       pilot_rho=[p.rho for p in ps], scores=[p.evals[target] for p in ps])


def _check_parts(parts: Any, target: Any) -> None:
    """joint_view's arguments: at least two (label, Results) pairs, and a target name or None (RaceError, one line)."""
    if isinstance(parts, (str, bytes, Mapping)) or not isinstance(parts, Sequence) or not all(
            isinstance(p, (tuple, list)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], Results)
            for p in parts):
        raise RaceError(f"parts {shown(parts)} must be (label, race Results) pairs, one per policy")
    if target is not None and (not isinstance(target, str) or not target):
        raise RaceError(f"target {shown(target)} must be a target name (a string)")
    if len(parts) < 2:
        raise RaceError(f"a joint view needs at least 2 policies' grids, got {len(parts)}")


def joint_view(parts: Sequence[tuple[str, Results]], *, target: str | None = None,
               n_boot: int | None = None, seed: int = 0) -> JointView:
    """The joint view of ``parts`` ((label, results) per policy, each with a diagnosis or enough
    complete pilots for one). Raises ValueError (one line) when the parts do not share a budget,
    a target or the held-out prompts."""
    from race.stats.fit import bootstrap_paired_grids, percentile_ci
    from race.stats.regime import seed_scale

    _check_parts(parts, target)
    diags = [diagnose_results(r) for _, r in parts]
    name = target or diags[0].primary_target
    for (label, _), d in zip(parts, diags):
        if name not in d.verdicts:
            raise RaceError(f"policy {label!r} has no target {name!r}: expected one of {', '.join(d.verdicts)}")
    budgets = {float(r.config.get("budget") or 0) for _, r in parts}
    if len(budgets) != 1:
        raise RaceError(f"the policies' grids have budgets {sorted(budgets)} per pilot: a joint view compares "
                         "policies at one budget (race compare reads grids at several)")
    classify = dict(parts[0][1].classify)
    level = float(classify.get("confidence_level", 0.9))
    n_boot = int(n_boot or classify.get("n_boot", 1000))
    grids = [_grid(r, name) for _, r in parts]
    scale = [seed_scale(grid=g, level=level) for g in grids]
    reps = bootstrap_paired_grids(grids=grids, n_boot=n_boot, seed=seed, seed_scale=float(np.mean(scale)))
    observed = np.concatenate([g.point_means for g in grids])
    allreps = np.concatenate(reps, axis=1)                        # (n_boot, all points)
    owner = np.concatenate([[i] * g.n_points for i, g in enumerate(grids)])
    rhos = np.concatenate([g.rho_targets for g in grids])
    best = int(np.argmax(observed))
    winners = np.argmax(allreps, axis=1)
    per_policy_best = np.stack([r.max(axis=1) for r in reps], axis=1)   # (n_boot, n_policies)
    bi = int(owner[best])
    gaps = []
    for i, (label, _) in enumerate(parts):
        if i != bi:
            d = per_policy_best[:, bi] - per_policy_best[:, i]
            lo, hi = percentile_ci(samples=d, confidence_level=level)
            gaps.append((label, float(observed[owner == bi].max() - observed[owner == i].max()), lo, hi))
    summaries = []
    for i, ((label, res), d) in enumerate(zip(parts, diags)):
        v = d.verdicts[name]
        model = str(d.meta.get("model") or res.config.get("model") or label)
        cal = (res.plan or {}).get("calibration") or {}
        acc = _asset_accuracy(model)
        summaries.append(PolicySummary(
            label=label, model=model, parameters=_parameters(model),
            base_pass_rate=float(cal["pass_rate"]) if cal.get("pass_rate") is not None else None,
            base_accuracy=acc, base_heldout=_base_heldout(acc, str(res.config.get("task", ""))),
            regime=v.regime.value, rho_range=tuple(v.rho_range), open_side=v.open_side,
            confidence=v.confidence, best_rho=v.best_rho, best_score=v.best_reward, slope=v.slope,
            slope_ci=tuple(v.slope_ci), best_share=float(np.mean(owner[winners] == i)), costs=point_costs(res, name)))
    view = JointView(target=name, budget=budgets.pop(), level=level, n_boot=n_boot, policies=tuple(summaries),
                     best_label=parts[bi][0], best_rho=float(rhos[best]), best_score=float(observed[best]),
                     best_ci=percentile_ci(samples=allreps[:, best], confidence_level=level),
                     best_share=float(np.mean(winners == best)), gaps=tuple(gaps), lines=())
    return JointView(**{**view.__dict__, "lines": tuple(conclusions(view))})


def _by_size(view: JointView) -> list[PolicySummary]:
    """Policies from the smallest to the largest (parameters; unknown sizes keep their order, last)."""
    return sorted(view.policies, key=lambda p: (p.parameters is None, p.parameters or 0))


def conclusions(view: JointView) -> list[str]:
    """The joint view's sentences: the best (policy, ρ), which policy is the better buy, whether
    the best ρ moves with size, and what the larger policy gave up."""
    pct = int(round(100 * view.level))
    out = [f"best (policy, ρ): {view.best_label} at ρ={view.best_rho:.2f}, {view.target} {view.best_score:.4f} "
           f"({pct}% CI {view.best_ci[0]:.4f} … {view.best_ci[1]:.4f}); the best of all points in "
           f"{100 * view.best_share:.0f}% of {view.n_boot} paired bootstrap replicates"]
    for label, gap, lo, hi in view.gaps:
        resolved = lo > 0
        out.append(f"{view.best_label} vs {label}: best point {gap:+.4f} ({pct}% CI {lo:+.4f} … {hi:+.4f}); " + (
            f"{view.best_label} is the better buy at {fmt_flops(view.budget)} FLOPs per pilot" if resolved else
            "not resolved at this budget: add seeds or budget before choosing between them on this evidence"))
    ordered = _by_size(view)
    if len(ordered) > 1:
        moves = " → ".join(f"{p.label} {p.best_rho:.2f}" for p in ordered)
        out.append(f"best ρ by size (pilot-best): {moves}; recommended ranges "
                   + ", ".join(f"{p.label} {format_rho_range(p.rho_range, p.open_side)}" for p in ordered) + "; "
                   + size_trend(ordered))
        out.append(gave_up(ordered[0], ordered[-1], view.budget))
    return out


def size_trend(ordered: Sequence[PolicySummary]) -> str:
    """Whether the best ρ moves with size: only policies with a conclusive verdict locate their
    best ρ (an inconclusive grid's range is the pilot-best point, not a located optimum), and only
    disjoint ranges of the smallest and the largest of those count as a move."""
    located = [p for p in ordered if p.regime != "inconclusive"]
    vague = [p.label for p in ordered if p.regime == "inconclusive"]
    if len(located) < 2:
        return (f"no move of the best ρ with size is resolved at this budget: {', '.join(vague)} "
                f"{'is' if len(vague) == 1 else 'are'} inconclusive, so fewer than two policies locate their best ρ")
    small, large = located[0], located[-1]
    note = f" ({', '.join(vague)} inconclusive, left out)" if vague else ""
    if small.bounds[1] < large.bounds[0] or large.bounds[1] < small.bounds[0]:
        return (f"the ranges of {small.label} and {large.label} are disjoint: the best ρ moves with size at this "
                f"budget{note}")
    return f"the ranges of {small.label} and {large.label} overlap: no move of the best ρ with size is resolved{note}"


def gave_up(small: PolicySummary, large: PolicySummary, budget: float) -> str:
    """What the larger policy gave up at the same budget: steps and rollouts per pilot (ratios
    over the grid points both ran) and rollouts per 1e12 FLOPs."""
    s = {c.rho_target: c for c in small.costs}
    both = [(s[c.rho_target], c) for c in large.costs if c.rho_target in s]
    if not both:
        return f"{large.label} and {small.label} share no grid point: no cost comparison"

    def ratio(attr: str) -> float:
        return float(np.mean([getattr(a, attr) / getattr(b, attr) for a, b in both if getattr(b, attr)]))

    size = (f" ({large.parameters / small.parameters:.1f}× the parameters)"
            if large.parameters and small.parameters else "")
    per = np.mean([b.rollouts_per_1e12 for _, b in both]), np.mean([a.rollouts_per_1e12 for a, _ in both])
    return (f"what {large.label}{size} gave up at {fmt_flops(budget)} FLOPs per pilot: {ratio('steps'):.1f}× fewer "
            f"steps, {ratio('updates'):.1f}× fewer optimizer updates and {ratio('rollouts'):.1f}× fewer rollouts per "
            f"pilot than {small.label} ({per[0]:.0f} vs {per[1]:.0f} rollouts per 1e12 FLOPs, mean over the grid)")


# ----------------------------------------------------------------------------- files

def save_joint(out_dir: str, labels: Sequence[str], view: JointView | None, *, models: Sequence[str],
               config: Mapping[str, Any]) -> str:
    """Write ``out_dir/models.json``: the parts (label → folder), the joint config and the view
    (null until two parts have a diagnosis)."""
    path = os.path.join(out_dir, JOINT_FILE)
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "kind": "models", "models": list(models),
                             "parts": {label: label for label in labels}, "config": dict(config),
                             "view": view.to_dict() if view else None})
    return path


def is_joint(path: str) -> bool:
    """Whether ``path`` is a grid over models (a folder holding models.json, or that file)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, JOINT_FILE))
    return os.path.basename(path) == JOINT_FILE and os.path.isfile(path)


def load_parts(path: str) -> list[tuple[str, Results]]:
    """The parts of the grid over models at ``path`` (its folder or models.json), in config order."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise RaceError(f"a grid over models {str(path)[:60]!r} must be its folder or its {JOINT_FILE} (a path)")
    path = os.fspath(path)
    folder = os.path.dirname(path) if path.endswith(".json") else path
    joint = os.path.join(folder, JOINT_FILE)
    try:
        with open(joint, encoding="utf-8") as fh:
            raw = json.load(fh)
        parts = dict(raw["parts"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise RaceError(f"{joint!r} is not a RACE grid over models: {type(e).__name__}: {str(e)[:120]}") from None
    for label, sub in parts.items():        # each part is a folder beside models.json, as race pilot writes it
        if not isinstance(sub, str) or not re.fullmatch(r"[A-Za-z0-9_+][A-Za-z0-9._+-]*", sub):
            raise RaceError(f"{joint!r}: part {str(label)[:40]!r} names {str(sub)[:60]!r}: expected a folder beside "
                            f"{JOINT_FILE} (letters, digits, '.', '_', '+', '-')")
    return [(label, load_results(os.path.join(folder, sub))) for label, sub in parts.items()]


# ----------------------------------------------------------------------------- rendering

def render_joint(view: JointView, fmt: str = "text") -> str:
    """The joint view as text, Markdown, LaTeX or JSON: a row per policy, the cost table, the
    conclusions."""
    check_format(fmt)
    if fmt == "json":
        return json.dumps(view.to_dict(), indent=2) + "\n"
    pct = int(round(100 * view.level))
    rows = []
    for p in view.policies:
        rows.append([p.label, f"{p.parameters / 1e6:.2f} M" if p.parameters else "?",
                     "—" if p.base_pass_rate is None else f"{p.base_pass_rate:.3f}",
                     "—" if p.base_heldout is None else f"{p.base_heldout:.3f}",
                     "—" if p.base_heldout is None else f"{p.best_score - p.base_heldout:+.3f}", p.regime,
                     format_rho_range(p.rho_range, p.open_side), f"{p.confidence:.2f}",
                     f"{p.best_rho:.2f} ({p.best_score:.4f})",
                     f"{p.slope:+.4f} ({p.slope_ci[0]:+.4f} … {p.slope_ci[1]:+.4f})", f"{100 * p.best_share:.0f}%"])
    headers = ["policy", "params", "base pass (cal.)", "base held-out", "best − base", "verdict", "ρ range",
               "confidence", "best ρ (score)", f"slope per log ρ ({pct}% CI)", "best of all"]
    cost_rows = [[p.label, f"{c.rho_target:.2f}", f"{c.score:.4f}", f"{c.steps:.0f}", f"{c.updates:.0f}",
                  f"{c.rollouts:.0f}", f"{c.rollouts_per_1e12:.0f}"] for p in _by_size(view) for c in p.costs]
    cost_headers = ["policy", "ρ", view.target, "steps", "updates", "rollouts", "rollouts / 1e12 FLOPs"]
    parts = [heading(f"RACE grid over models: {len(view.policies)} policies at {fmt_flops(view.budget)} FLOPs "
                      f"per pilot ({view.target})", fmt),
             render_table(rows, headers, fmt), render_table(cost_rows, cost_headers, fmt), render_lines(list(view.lines), fmt)]
    return "\n\n".join(parts) + "\n"
