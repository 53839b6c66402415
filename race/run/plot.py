"""Figures of a pilot grid: how reward responds to ρ, where the FLOPs went, reward against FLOPs.

One figure, three panels (four with a forecast), for a paper or a planning note (``race report RESULTS --plot fig.pdf``,
``race pilot --plot fig.png``, or :func:`plot_results`):

1. **response**: the target's held-out score against measured ρ (log axis): every pilot (grey
   dots), each grid point's mean with its bootstrap CI (error bars), the fit the verdict rests on
   (solid; when no fit is decisive, the best fit by AICc, dashed), the recommended ρ range
   (shaded, or a line when it is one point); the verdict in the title;
2. **compute split**: C_search / C_learning / C_reward shares of each grid point (stacked bars);
3. **training curves**: mean batch reward against FLOPs spent, every seed's steps pooled into
   FLOP bins, one line per grid point; with held-out checkpoints (race.stats.instability), the
   target's held-out score at each checkpoint, averaged over seeds, as dots on a dashed line.
4. **forecast** (only when the diagnosis has one, race.stats.forecast): held-out score against FLOPs per
   ρ, the checkpoints (mean over seeds) and the fitted model, solid up to the pilot budget and
   dashed to the full-run budget, the prediction there with its CI, both budgets marked.
5. **drift** (with a range at F, race.stats.drift): ρ*(C), the best grid point's measured ρ at each
   checkpoint budget (the pilots' own IsoFLOP grids, 1/64 … 1 of B), the range at B, the shrunk
   drift extrapolated to F with its 90 % band, and the range at F.

matplotlib is optional (``pip install "race-rl[plot]"``) and imported only here. The figure is a
bare ``matplotlib.figure.Figure`` (no pyplot, no backend switch), so a headless node needs no
display and a notebook's own backend is left alone.
"""
from __future__ import annotations

import math
import os
from typing import Any, Sequence

import numpy as np

from race.core.records import Forecast, PilotResult, TargetVerdict
from race.stats.report import fmt_flops
from race.stats.results import Results, diagnose_results, load_results
from race.core.errors import RaceError

PLOT_SUFFIXES = (".png", ".pdf", ".svg")
SPLIT_COLORS = {"search": "#4c72b0", "learning": "#dd8452", "reward": "#55a868"}
CURVE_BINS = 40


class PlotError(RaceError):
    """A figure that cannot be drawn (file type, missing matplotlib, unknown target): one line."""


def check_plot_path(path: str) -> str:
    """``path`` when its suffix is one RACE writes and matplotlib is importable; else PlotError.

    Called before any pilot runs, so a bad ``--plot`` never costs a grid."""
    if not isinstance(path, (str, os.PathLike)):
        raise PlotError(f"plot file {str(path)[:80]!r} must be a file path ending in {', '.join(PLOT_SUFFIXES)}")
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in PLOT_SUFFIXES:
        raise PlotError(f"plot file {path!r} has suffix {suffix or '(none)'!r}: "
                        f"expected one of {', '.join(PLOT_SUFFIXES)}")
    if os.path.islink(path):
        raise PlotError(f"plot file {path!r} is a symbolic link (to {os.readlink(path)!r}): RACE never writes through a "
                        "link nor replaces one; remove it or choose another file")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise PlotError(f"plot file {path!r} exists and is not a regular file: choose another file")
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(folder) and os.path.dirname(folder) != folder:      # the folders it would make
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        why = "is not a folder" if not os.path.isdir(folder) else "is not writable"
        raise PlotError(f"plot file {path!r} cannot be written: {folder!r} {why}; choose another file")
    _figure_class()
    return path


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError('plots need matplotlib, which is not installed: pip install "race-rl[plot]"') from None
    return Figure


def binned_curve(runs: Sequence[Sequence[tuple[float, float]]], *, n_bins: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Pool the ``(flops_spent, mean_reward)`` points of several runs into ``n_bins`` equal FLOP
    bins over [0, largest FLOPs]; returns (bin centres, mean reward per bin), NaN where a bin is
    empty. Pooling averages over seeds and smooths the noisy per-step batch means at once.
    Default ``n_bins``: half a run's points (median run), between 5 and ``CURVE_BINS``."""
    pts = np.array([p for run in runs for p in run], dtype=float).reshape(-1, 2)
    if not len(pts):
        return np.zeros(0), np.zeros(0)
    if n_bins is None:
        n_bins = int(np.clip(np.median([len(r) for r in runs]) // 2, 5, CURVE_BINS))
    edges = np.linspace(0.0, float(pts[:, 0].max()), n_bins + 1)
    idx = np.clip(np.searchsorted(edges, pts[:, 0], side="right") - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    total = np.bincount(idx, weights=pts[:, 1], minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return (edges[:-1] + edges[1:]) / 2, mean


def checkpoint_curve(pilots: Sequence[PilotResult], target: str) -> tuple[np.ndarray, np.ndarray]:
    """Held-out ``target`` at the pilots' checkpoints: per checkpoint index, the mean FLOPs spent
    and the mean score over the pilots (those with the most common checkpoint count: a pilot
    whose last step crossed two fractions has one fewer). Empty arrays without checkpoints."""
    runs = [[(c.flops.total, c.score(target)) for c in p.checkpoints if target in c.evals] for p in pilots]
    runs = [r for r in runs if r]
    if not runs:
        return np.zeros(0), np.zeros(0)
    lengths = [len(r) for r in runs]
    n = max(set(lengths), key=lambda k: (lengths.count(k), k))
    pts = np.array([r for r in runs if len(r) == n], dtype=float)          # [pilots, n, 2]
    return pts[:, :, 0].mean(axis=0), pts[:, :, 1].mean(axis=0)


def fit_curve(v: TargetVerdict, *, n: int = 200) -> tuple[str, bool, np.ndarray, np.ndarray] | None:
    """The fit to draw: (name, decisive, ρ, fitted score). The chosen fit when the verdict rests
    on one, else the best by AICc; None when the diagnosis stored no fits."""
    fits = v.fits
    name = fits.get("chosen") or fits.get("best_by_aicc")
    if not name or name not in fits or not fits.get("rho_measured"):
        return None
    rho = np.asarray(fits["rho_measured"], dtype=float)
    dense = np.exp(np.linspace(math.log(rho.min()), math.log(rho.max()), n))
    coef = np.asarray(fits[name]["coef"], dtype=float)
    return name, bool(fits.get("chosen")), dense, np.polynomial.polynomial.polyval(np.log(dense), coef)


def plot_results(results: Results | str, path: str | None = None, *, target: str | None = None,
                 refit: bool = False) -> Any:
    """Draw the three panels (four with a forecast) for ``target`` (default: the primary target) and save them to
    ``path`` (.png, .pdf or .svg) when given; returns the ``matplotlib.figure.Figure``.

    ``results``: a :class:`Results` or the path of a results file / its folder."""
    if path is not None:
        check_plot_path(path)
    res = load_results(results) if isinstance(results, (str, os.PathLike)) else results
    if not isinstance(res, Results):
        raise PlotError(f"results {str(results)[:80]!r} must be a race Results (race.load_results) or the path of a "
                        "results file")
    if not isinstance(refit, bool):
        raise PlotError(f"refit {str(refit)[:40]!r} must be True or False")
    if target is not None and not isinstance(target, str):
        from race.core.arguments import shown

        raise PlotError(f"target {shown(target)} must be a target name (a string), or None for the primary one")
    diag = diagnose_results(res, refit=refit)
    name = target or diag.primary_target
    if name not in diag.verdicts:
        raise PlotError(f"target {name!r} is not in this diagnosis: expected one of {', '.join(diag.verdicts)}")
    v = diag.verdicts[name]
    done = [p for p in res.pilots if p.status == "complete"]
    fc = diag.forecast if diag.forecast is not None and diag.forecast.target == name else None
    rab = fc.range_at_budget if fc is not None and fc.range_at_budget and "refused" not in fc.range_at_budget else None
    if fc is None:
        fig = _figure_class()(figsize=(14, 4.2), layout="constrained")
        ax_r, ax_s, ax_c = fig.subplots(1, 3, width_ratios=[1.35, 1, 1.35])
    elif rab is None:
        fig = _figure_class()(figsize=(19, 4.2), layout="constrained")
        ax_r, ax_s, ax_c, ax_f = fig.subplots(1, 4, width_ratios=[1.35, 1, 1.35, 1.5])
        _forecast(ax_f, fc)
    else:
        fig = _figure_class()(figsize=(23, 4.2), layout="constrained")
        ax_r, ax_s, ax_c, ax_f, ax_d = fig.subplots(1, 5, width_ratios=[1.35, 1, 1.35, 1.5, 1.3])
        _forecast(ax_f, fc)
        _drift(ax_d, rab, done, name)
    _response(ax_r, v, done)
    _split(ax_s, v)
    _curves(ax_c, v, done)
    meta = diag.meta
    fig.suptitle(" · ".join(str(meta[k]) for k in ("model", "task", "reward") if meta.get(k)) or "RACE diagnosis",
                 fontsize=11)
    if path is not None:
        save_figure(fig, path)
    return fig


def save_figure(fig: Any, path: str) -> str:
    """``fig`` written to ``path`` through race.core.safeio.write_inside (the format from its extension)."""
    from race.core.safeio import write_inside

    fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    try:
        return write_inside(os.path.dirname(os.path.abspath(path)), os.path.basename(path),
                            lambda fh: fig.savefig(fh, dpi=150, format=fmt), what="figure")
    except OSError as e:            # the folder changed since check_plot_path, or the disk is full
        raise PlotError(f"plot file {path!r} cannot be written: {e.strerror or type(e).__name__}") from None


def drift_points(pilots: Sequence[PilotResult], pilot_budget: float, target: str) -> list[tuple[float, float]]:
    """(budget / B, ρ of the best grid point) at each checkpoint budget of the pilots (race.stats.drift's data)."""
    from race.stats.drift import observations_from_pilots

    by: dict[int, list] = {}
    for o in observations_from_pilots(pilots, pilot_budget, target):
        by.setdefault(o.level, []).append(o)
    return [(10 ** os_[0].x, max(os_, key=lambda o: o.y).rho) for _, os_ in sorted(by.items()) if len(os_) > 1]


def _drift(ax: Any, r: Any, pilots: Sequence[PilotResult], target: str) -> None:
    """ρ*(C) across the pilots' checkpoint budgets, the ranges at B and at F, the drift between."""
    B, F = float(r["pilot_budget"]), float(r["full_run_budget"])
    pts = drift_points(pilots, B, target)
    if pts:
        ax.plot([B * x for x, _ in pts], [y for _, y in pts], "o", color="0.45", ms=4,
                label="best grid point at each checkpoint budget")
    lo_b, hi_b = r["range_at_b"] or (r["recommended_rho"], r["recommended_rho"])
    lo_f, hi_f = r["rho_range"]
    cs = np.geomspace(B, F, 40)
    dx = np.log10(cs / B)
    centre = (lo_b + hi_b) / 2 + r["drift"] * dx
    half = 1.6449 * r["drift_se"] * dx
    ax.fill_between(cs, centre - half, centre + half, color="C0", alpha=0.15, label="drift, 90% band")
    ax.plot(cs, centre, color="C0", lw=1.5)
    ax.vlines([B], lo_b, hi_b, color="C2", lw=6, alpha=0.7, label=f"range at B [{lo_b:.2f}, {hi_b:.2f}]")
    ax.vlines([F], lo_f, hi_f, color="C3", lw=6, alpha=0.7, label=f"range at F [{lo_f:.2f}, {hi_f:.2f}]")
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs per run")
    ax.set_ylabel("ρ")
    ax.set_ylim(0, 1)
    ax.set_title(f"ρ*(C): {r['drift']:+.3f} per decade" + ("" if r.get("validated", True) else " (PAST validated)"),
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower left")


def _response(ax: Any, v: TargetVerdict, pilots: Sequence[PilotResult]) -> None:
    rho = np.array([p.rho_measured for p in v.points])
    mean = np.array([p.reward_mean for p in v.points])
    ci = np.array([p.reward_ci for p in v.points]).reshape(-1, 2)
    level = float(v.fits.get("confidence_level", 0.9))
    mine = [p for p in pilots if v.target in p.evals]
    ax.scatter([p.rho for p in mine], [p.score(v.target) for p in mine], s=14, color="0.65",
               label="pilots (one per seed)", zorder=2)
    ax.errorbar(rho, mean, yerr=[mean - ci[:, 0], ci[:, 1] - mean], fmt="o", color="k", capsize=3,
                label=f"grid point mean, {level:.0%} CI", zorder=3)
    curve = fit_curve(v)
    if curve:
        fit, decisive, x, y = curve
        ax.plot(x, y, "-" if decisive else "--", color="tab:red", zorder=4,
                label=f"{fit} fit in log ρ" + ("" if decisive else " (best AICc, not decisive)"))
    lo, hi = v.rho_range
    label = (f"recommended {v.range_text()}" if v.open_side else
             f"recommended ρ {lo:.2f}–{hi:.2f}" if hi > lo else f"recommended ρ {lo:.2f}")
    ax.set_xscale("log")
    if v.open_side:        # the range runs on past the grid's edge: shade to the axis' end
        left, right = ax.get_xlim()
        lo, hi = (min(left, lo), hi) if v.open_side == "below" else (lo, max(right, hi))
        ax.axvspan(lo, hi, color="tab:green", alpha=0.15, label=label, zorder=1)
        ax.set_xlim(left, right)
    elif hi > lo:
        ax.axvspan(lo, hi, color="tab:green", alpha=0.15, label=label, zorder=1)
    else:
        ax.axvline(lo, color="tab:green", alpha=0.6, label=label, zorder=1)
    ax.set_xticks(rho, [f"{r:.2f}" for r in rho])
    ax.minorticks_off()
    ax.set_xlabel("ρ = C_learning / C_total (measured)")
    ax.set_ylabel(f"held-out {v.target}")
    ax.set_title(f"verdict ({v.target}): {v.regime.value} · confidence {v.confidence:.2f}", fontsize=10)
    ax.legend(fontsize=7, loc="best")


def _split(ax: Any, v: TargetVerdict) -> None:
    labels = [f"{p.rho_target:.2f}" for p in v.points]
    bottom = np.zeros(len(labels))
    for part, color in SPLIT_COLORS.items():
        share = np.array([p.flops.shares()[part] for p in v.points]) * 100
        if part != "reward" or share.any():
            ax.bar(labels, share, bottom=bottom, color=color, label=f"C_{part}")
        bottom += share
    ax.set_ylim(0, 100)
    ax.set_xlabel("ρ target")
    ax.set_ylabel("% of pilot FLOPs")
    per_pilot = float(np.mean([p.flops.total for p in v.points])) if v.points else 0.0
    ax.set_title(f"compute split ({fmt_flops(per_pilot)} FLOPs per pilot)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")


def _curves(ax: Any, v: TargetVerdict, pilots: Sequence[PilotResult]) -> None:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    n, held = len(v.points), False
    for i, point in enumerate(v.points):
        runs = [p.curve for p in pilots if math.isclose(p.rho_target, point.rho_target) and p.curve]
        x, y = binned_curve(runs)
        keep = ~np.isnan(y)
        color = cmap(0.85 * i / max(1, n - 1))
        if keep.any():
            ax.plot(x[keep], y[keep], color=color, label=f"ρ {point.rho_target:.2f} ({len(runs)} seeds)")
        cx, cy = checkpoint_curve([p for p in pilots if math.isclose(p.rho_target, point.rho_target)], v.target)
        if cx.size:
            held = True
            ax.plot(cx, cy, "o--", color=color, markersize=3, linewidth=0.8,
                    label=f"held-out {v.target}, checkpoints" if i == 0 else f"_held-out ρ {point.rho_target:.2f}")
    ax.set_xlabel("FLOPs spent")
    ax.set_ylabel("mean batch reward (training)" + (f"; held-out {v.target} (dots)" if held else ""))
    ax.set_title("training curves (seeds pooled per FLOP bin)" + ("; held-out checkpoints" if held else ""),
                 fontsize=10)
    ax.legend(fontsize=7, loc="lower right")


def _forecast(ax: Any, fc: Forecast) -> None:
    """Held-out score against FLOPs per ρ: the checkpoints (dots, mean over seeds), the fit (solid
    to the pilot budget, dashed beyond), the prediction at the full-run budget with its CI, the
    pilot and full-run budgets marked; a refused forecast draws data and fits up to the pilots."""
    from matplotlib import colormaps

    from race.stats.curvefit import model_value

    cmap = colormaps["viridis"]
    n = len(fc.points)
    top = max(fc.full_run_budget, fc.pilot_budget) if fc.predicts else fc.pilot_budget
    for i, p in enumerate(fc.points):
        color = cmap(0.85 * i / max(1, n - 1))
        if p.curve:
            c = np.array(p.curve)
            ax.scatter(c[:, 0], c[:, 1], s=12, color=color, zorder=3)
            lo = float(c[:, 0].min())
        else:
            lo = fc.pilot_budget / 64
        if p.params and fc.model:
            inside = np.exp(np.linspace(math.log(lo), math.log(fc.pilot_budget), 60))
            ax.plot(inside, model_value(fc.model, p.params, fc.r0, inside), "-", color=color,
                    label=f"ρ {p.rho_target:.2f}")
            if top > fc.pilot_budget:
                beyond = np.exp(np.linspace(math.log(fc.pilot_budget), math.log(top), 40))
                ax.plot(beyond, model_value(fc.model, p.params, fc.r0, beyond), "--", color=color)
        if p.predicted is not None and p.predicted_ci is not None:
            x = fc.full_run_budget * math.exp(0.04 * (i - (n - 1) / 2))     # side by side, not on top
            ax.errorbar([x], [p.predicted], yerr=[[p.predicted - p.predicted_ci[0]],
                                                                   [p.predicted_ci[1] - p.predicted]],
                        fmt="s", color=color, capsize=3, zorder=4)
    if fc.r0 is not None:
        ax.axhline(fc.r0, color="0.6", linestyle=":", label=f"base policy {fc.r0:.3f}")
    ax.axvline(fc.pilot_budget, color="0.4", linestyle=":", label=f"pilot budget {fmt_flops(fc.pilot_budget)}")
    ax.axvline(fc.full_run_budget, color="tab:red", alpha=0.7,
               label=f"full run {fmt_flops(fc.full_run_budget)}" + ("" if fc.status == "predicted" else f" ({fc.status})"))
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs spent (C_total)")
    ax.set_ylabel(f"held-out {fc.target} (checkpoint prompts)")
    if fc.predicts:
        title = (f"{'FORCED ' if fc.status == 'forced' else ''}forecast ({fc.model}): best ρ {fc.best_rho:.2f}, "
                 f"{fc.regime.value if fc.regime else '?'}, {fc.factor:.3g}× the pilots")
    else:
        title = f"forecast refused at {fc.factor:.3g}× the pilots" + (
            f" (backtests hold to {fc.supported_factor:.2g}×)" if fc.supported_factor else " (no backtest held)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="best")


def plot_models(path_or_parts: str | Sequence[tuple[str, Results]], path: str | None = None, *,
                target: str | None = None) -> Any:
    """The figure of a grid over policies (race.run.multimodel): the policies' responses to ρ side by
    side on one axis (grid point means with their CIs, each policy's recommended range shaded in
    its colour, the best (policy, ρ) starred), and what each bought: rollouts per pilot against ρ.

    ``path_or_parts``: the grid's folder (or models.json), or its (label, results) parts."""
    from race.run.multimodel import joint_view, load_parts

    if path is not None:
        check_plot_path(path)
    parts = load_parts(path_or_parts) if isinstance(path_or_parts, (str, os.PathLike)) else path_or_parts
    view = joint_view(parts, target=target)           # checks the parts and the target (one RaceError line)
    fig = _figure_class()(figsize=(14, 4.4), layout="constrained")
    ax_r, ax_c = fig.subplots(1, 2, width_ratios=[1.4, 1])
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    ticks: set[float] = set()
    for i, ((label, res), p) in enumerate(zip(parts, view.policies)):
        v = diagnose_results(res).verdicts[view.target]
        color = colors[i % len(colors)]
        rho = np.array([q.rho_target for q in v.points])
        mean = np.array([q.reward_mean for q in v.points])
        ci = np.array([q.reward_ci for q in v.points]).reshape(-1, 2)
        size = f", {p.parameters / 1e6:.2f} M" if p.parameters else ""
        ax_r.errorbar(rho, mean, yerr=[mean - ci[:, 0], ci[:, 1] - mean], fmt="o-", color=color, capsize=3,
                      label=f"{label}{size}: {p.regime}")
        if p.base_heldout is not None:        # the policy before any RL step (pre-training is not in the budget)
            ax_r.axhline(p.base_heldout, color=color, ls=":", lw=1, label=f"{label} base {p.base_heldout:.3f}")
        lo, hi = p.rho_range
        if hi > lo:
            ax_r.axvspan(lo, hi, color=color, alpha=0.08)
        ticks |= set(rho.tolist())
        costs = sorted(p.costs, key=lambda c: c.rho_target)
        ax_c.plot([c.rho_target for c in costs], [c.rollouts for c in costs], "o-", color=color, label=label)
        if label == view.best_label:
            ax_r.plot([view.best_rho], [view.best_score], "*", color=color, markersize=16, markeredgecolor="k",
                      label=f"best (policy, ρ): {label}, {view.best_rho:.2f}")
    for ax in (ax_r, ax_c):
        ax.set_xscale("log")
        ax.set_xticks(sorted(ticks), [f"{r:.2f}" for r in sorted(ticks)])
        ax.minorticks_off()
        ax.set_xlabel("ρ target = C_learning / C_total")
    ax_r.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))    # beside the curves, never over them
    ax_c.legend(fontsize=7, loc="best")
    ax_r.set_ylabel(f"held-out {view.target} (grid point mean, {view.level:.0%} CI)")
    ax_r.set_title("response to ρ per policy, same FLOPs per pilot", fontsize=10)
    ax_c.set_yscale("log")
    ax_c.set_ylabel("rollouts per pilot")
    ax_c.set_title("what each policy bought", fontsize=10)
    fig.suptitle(f"grid over models at {fmt_flops(view.budget)} FLOPs per pilot", fontsize=11)
    if path is not None:
        save_figure(fig, path)
    return fig
