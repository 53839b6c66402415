"""Render plans and diagnoses as text, Markdown, LaTeX (booktabs) or JSON.

The JSON form is RACE's stable machine interface (fields in docs/interfaces.md):
``render_json`` of a Diagnosis is ``{"schema_version", "kind": "diagnosis", ...}``
and of a Plan ``{"schema_version", "kind": "plan", ...}``. A diagnosis of pilots with
held-out checkpoints has a section in every format: unstable pilots per grid point (grid point
and seed of each), and what the evaluations cost apart from C_total. A diagnosis with a forecast
(race.stats.forecast) has one more: the prediction per ρ at the full-run budget with its CI, the
verdict there beside the pilot verdict, and the backtests; a refused forecast is one line.

Every line, table cell and heading is one line: text in them that comes from a file or a model (a
task or model name, a target, a warning, a note) has its newlines and control characters escaped
(race.core.safeio.one_line), so a results file can never forge a line of the report.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from race.core import records as _records
from race.core.records import (Diagnosis, FlopBreakdown, Forecast, Regime, Stability, TargetVerdict, format_rho_range,
                          format_rho_set)
from race.core.safeio import one_line

SCHEMA_VERSION = 1
FORMATS = ("text", "md", "latex", "json")
_TABLEFMT = {"text": "simple", "md": "github"}

_ADVICE = {
    Regime.SEARCH_HEAVY: "reward falls as ρ rises: spend more on rollouts (larger n_gen, more prompts), "
                         "fewer update iterations",
    Regime.UPDATE_HEAVY: "reward rises with ρ: spend more on updates (μ > 1 reuse, fewer rollouts per prompt)",
    Regime.REWARD_HEAVY: "feedback dominates the budget: try a proxy PRM, score fewer samples or steps, "
                         "or a rule-based reward before moving ρ",
    Regime.BALANCED: "the response peaks inside the grid: run at the recommended ρ range",
    Regime.INCONCLUSIVE: "noise dominates: keep the pilot-best point, add seeds or budget before trusting a ρ",
}


def fmt_flops(x: float) -> str:
    return f"{x:.3g}" if x else "0"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


# every character LaTeX reads as markup, and the report's symbols, each replaced in one pass (str.translate: a
# replacement's own braces and dollars are never escaped again), so a model path or a task name holding $ { } ~
# prints as itself
_LATEX = str.maketrans({"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
                        "ρ": r"$\rho$", "μ": r"$\mu$", "±": r"$\pm$", "≥": r"$\geq$", "≤": r"$\leq$", "√": r"$\surd$",
                        "×": r"$\times$", "→": r"$\to$", "∈": r"$\in$", "…": r"\ldots{}", "·": r"$\cdot$"})


def _escape(s: str, fmt: str) -> str:
    """``s`` as text in ``fmt``: LaTeX's special characters escaped; in Markdown a table cell's ``|`` (which
    would open a column) as ``\\|``, done by ``render_table``."""
    return s.translate(_LATEX) if fmt == "latex" else s


def render_table(rows: list[list[Any]], headers: list[str], fmt: str) -> str:
    rows = [[one_line(c) if isinstance(c, str) else c for c in r] for r in rows]    # a cell is one line
    headers = [one_line(h) for h in headers]
    if fmt == "latex":  # booktabs, written here: tabulate's latex_booktabs would escape the math
        cells = [[_escape(str(c), fmt) for c in r] for r in [headers] + rows]
        lines = [r"\begin{tabular}{" + "l" * len(headers) + "}", r"\toprule",
                 " & ".join(cells[0]) + r" \\", r"\midrule"]
        lines += [" & ".join(r) + r" \\" for r in cells[1:]]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"])
    from tabulate import tabulate

    if fmt == "md":                     # a | in a cell (a model path, a name from a file) would open a column
        rows = [[c.replace("|", "\\|") if isinstance(c, str) else c for c in r] for r in rows]
        headers = [h.replace("|", "\\|") for h in headers]
    return tabulate(rows, headers=headers, tablefmt=_TABLEFMT[fmt], disable_numparse=True)


def _breakdown_cells(f: FlopBreakdown) -> list[str]:
    sh = f.shares()
    return [fmt_flops(f.search), fmt_flops(f.learning), fmt_flops(f.reward), fmt_flops(f.total),
            f"{_pct(sh['search'])} / {_pct(sh['learning'])} / {_pct(sh['reward'])}"]


_FLOP_HEADERS = ["C_search", "C_learning", "C_reward", "C_total", "shares S/L/R"]


def heading(text: str, fmt: str) -> str:
    text = one_line(text)
    if fmt == "md":
        return f"### {text}"
    if fmt == "latex":
        return f"% {text}"
    return text


def render_lines(lines: list[str], fmt: str) -> str:
    """Each item of ``lines`` as one line (newlines inside an item escaped: it may hold a file's text)."""
    lines = [one_line(x) for x in lines]
    if fmt == "md":
        return "\n".join(f"- {_escape(x, fmt)}" for x in lines)
    if fmt == "latex":
        return "\\begin{itemize}\n" + "\n".join(f"  \\item {_escape(x, fmt)}" for x in lines) + "\n\\end{itemize}"
    return "\n".join(f"  {x}" for x in lines)


# ----------------------------------------------------------------------------- plans

def render_plan(plan, fmt: str = "text") -> str:
    """The grid table of a ``race.flops.grid.Plan``: per ρ the schedule and its FLOP breakdown."""
    check_format(fmt)
    if fmt == "json":
        return json.dumps({"schema_version": SCHEMA_VERSION, "kind": "plan", **plan.to_dict()}, indent=2)
    c = plan.config
    memory = (getattr(plan, "extra", None) or {}).get("memory")
    rows = [[f"{s.rho_target:.2f}", f"{s.rho:.3f}", s.prompts_per_step, s.n_gen, s.n_train, s.mu, s.steps,
             f"{s.learning_rate:.2e}", *_breakdown_cells(s.flops),
             f"{(s.flops.total / c.budget - 1) * 100:+.2f}%"] for s in plan.schedules]
    headers = ["ρ target", "ρ achieved", "B_p", "n_gen", "n_train", "μ", "steps", "lr", *_FLOP_HEADERS,
               "vs budget"]
    if memory:
        from race.core.units import fmt_bytes

        for row, m in zip(rows, memory):
            row.append(fmt_bytes(m["peak"]) + (" (vLLM sleeps)" if m.get("engine") == "asleep" else ""))
        headers.append("est. GPU mem")
    head = [f"model {c.model} · reward {c.reward.kind} · LoRA r={c.lora.rank} · "
            f"budget {fmt_flops(c.budget)} FLOPs per pilot",
            f"{len(plan.schedules)} points × {c.seeds} seeds = {len(plan.schedules) * c.seeds} pilots, "
            f"{fmt_flops(plan.grid_flops)} FLOPs for the grid · expected tokens: prompt "
            f"{plan.prompt_len:g}, completion {plan.completion_len:g}"]
    if memory:
        gpu = getattr(c, "gpu_memory", None)
        head.append("est. GPU mem: peak per pilot process with bf16 weights (docs/interfaces.md, race/flops/memory.py)"
                    + (f"; every schedule fits the stated {fmt_bytes(gpu)}" if gpu else "")
                    + ("; 'vLLM sleeps': with vLLM's sleep mode during the update (vllm_sleep)"
                       if any(m.get("engine") == "asleep" for m in memory) else ""))
    lr = getattr(c, "learning_rate", None)
    if lr is not None and (lr.schedule != "constant" or lr.warmup):
        head.append(f"learning rate: {lr.schedule}"
                    + (f" (stable, then decay to 0 over the last {lr.decay:.0%})" if lr.schedule == "wsd"
                       else " decay to 0" if lr.schedule != "constant" else "")
                    + (f" after a {lr.warmup:.0%} warm-up" if lr.warmup else "")
                    + " over each pilot's own optimizer steps (steps × μ); lr is the peak")
    if c.full_run_budget:
        head.append(f"the grid costs {_pct(plan.grid_flops / c.full_run_budget)} of the full-run budget "
                    f"{fmt_flops(c.full_run_budget)}")
    parts = [heading("RACE plan", fmt), render_lines(head, fmt), render_table(rows, headers, fmt)]
    if plan.notes:
        parts.append(render_lines(list(plan.notes), fmt))
    if getattr(plan, "warnings", ()):
        parts.append(render_lines([f"warning: {w}" for w in plan.warnings], fmt))
    return "\n\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- diagnoses

def _points_table(v: TargetVerdict, fmt: str) -> str:
    rows = []
    for p in v.points:
        s = p.schedule
        knobs = f"{s.prompts_per_step}×{s.n_gen}→{s.n_train}, μ={s.mu}, {s.steps} steps" if s else "—"
        half = (p.reward_ci[1] - p.reward_ci[0]) / 2
        rows.append([f"{p.rho_target:.2f}", f"{p.rho_measured:.3f}", p.n_seeds, knobs,
                     *_breakdown_cells(p.flops), f"{p.reward_mean:.4f} ± {half:.4f}"])
    headers = ["ρ target", "ρ measured", "seeds", "B_p×n_gen→n_train", *_FLOP_HEADERS, f"{v.target} ± CI"]
    if any(p.budget_seconds > 0 for p in v.points):   # diagnoses stored before 0.1.0's timing have none
        rows = [row + [f"{p.budget_seconds:.1f}"] for row, p in zip(rows, v.points)]
        headers.append("wall s")
    return render_table(rows, headers, fmt)


_PHASE_OF = {"search": "rollout", "learning": "update", "reward": "reward"}


def time_line(v: TargetVerdict) -> str:
    """Wall time beside FLOPs: seconds per pilot at the fastest and slowest grid point, and the
    FLOP rate of each phase as run (concurrent pilots included), so a reader can tell whether
    ranking by wall-clock would differ from the equal-FLOP comparison the verdict makes."""
    pts = [p for p in v.points if p.budget_seconds > 0]
    if len(pts) < 2:
        return ""
    rates = []
    for part, phase in _PHASE_OF.items():
        flops = sum(getattr(p.flops, part) for p in pts)
        sec = sum(p.seconds.get(phase, 0.0) for p in pts)
        if flops > 0 and sec > 0:
            rates.append(f"{phase} {fmt_flops(flops / sec)} FLOP/s")
    fast = min(pts, key=lambda p: p.budget_seconds)
    slow = max(pts, key=lambda p: p.budget_seconds)
    line = (f"wall time per pilot (as run): {fast.budget_seconds:.1f} s at ρ={fast.rho_target:.2f} … "
            f"{slow.budget_seconds:.1f} s at ρ={slow.rho_target:.2f}; " + ", ".join(rates))
    if slow.budget_seconds > TIME_SPREAD * fast.budget_seconds:
        line += ("; equal FLOPs took unequal time: under a wall-clock budget the slower points would "
                 "get fewer FLOPs than this IsoFLOP comparison gives them")
    evals = {k: sum(p.seconds.get(k, 0.0) for p in pts) / len(pts) for k in ("eval", "checkpoints")}
    if evals["checkpoints"] > 0:
        line += (f"; held-out evaluation, not in the budget: {evals['eval']:.1f} s final + "
                 f"{evals['checkpoints']:.1f} s checkpoints per pilot")
    return line


TIME_SPREAD = 1.25   # slowest / fastest pilot wall time above which the report says so


def _targets_table(verdicts: list[TargetVerdict], fmt: str) -> str:
    rows = []
    for v in verdicts:
        best = max(v.points, key=lambda p: p.reward_mean)
        rows.append([v.target, v.regime.value, v.range_text(),
                     f"{v.confidence:.2f}", f"{v.best_rho:.2f}", f"{best.reward_mean:.4f}",
                     f"{v.slope:+.4f} ({v.slope_ci[0]:+.4f} … {v.slope_ci[1]:+.4f})"])
    return render_table(rows, ["target", "verdict", "ρ range", "confidence", "best ρ", "best score",
                         "slope per log ρ (CI)"], fmt)


def _agreement_table(diag: Diagnosis, fmt: str) -> str:
    """race.stats.regime.target_agreement as a table: does each target (a downstream set's pass@1, a
    judge) pick the ρ the primary target picks?"""
    from race.stats.fit import target_agreement

    rows = [[r["target"], r["regime"], "—" if r["target"] == diag.primary_target else
             ("yes" if r["same_regime"] else "NO"), format_rho_range(r["rho_range"], r["open_side"]),
             "—" if r["target"] == diag.primary_target else ("yes" if r["ranges_overlap"] else "NO"),
             f"{r['best_rho']:.2f}", "n/a" if r["rank_corr"] is None else f"{r['rank_corr']:+.2f}"]
            for r in target_agreement(diag)]
    return render_table(rows, ["target", "verdict", f"same as {diag.primary_target}", "ρ range", "ranges overlap",
                         "best ρ", "rank corr."], fmt)


def _verdict_lines(v: TargetVerdict) -> list[str]:
    out = [f"verdict ({v.target}): {v.regime.value} · recommended {format_rho_set(v.rho_range, v.open_side)} · "
           f"confidence {v.confidence:.2f}",
           f"pilot-best: ρ={v.best_rho:.2f} with {v.target} {v.best_reward:.4f}",
           f"slope d{v.target}/dlog ρ = {v.slope:+.4f} (CI {v.slope_ci[0]:+.4f} … {v.slope_ci[1]:+.4f})"]
    if v.argmax_ci:
        out.append(f"concave fit: argmax ρ CI {v.argmax_ci[0]:.2f} … {v.argmax_ci[1]:.2f}")
    out.append("advice: " + ("nothing was learned: no grid point beat the base policy on held-out prompts, so this "
                             "grid says nothing about allocation; more budget per pilot, a larger learning rate or an "
                             "easier task first (more seeds will not help)"
                             if v.fits.get("learned") is False else _ADVICE[v.regime]))
    timing = time_line(v)
    if timing:
        out.append(timing)
    out += [f"warning: {w}" for w in v.warnings]
    return out


def _stability_parts(st: Stability, v: TargetVerdict, fmt: str) -> list[str]:
    """Unstable pilots per grid point, the evaluations' FLOPs beside the budget, each unstable
    pilot (grid point, seed, where it fell) and the rule."""
    spent = {p.rho_target: p.flops.total for p in v.points}
    rows = [[f"{p.rho_target:.2f}", p.pilots, f"{p.unstable} ({_pct(p.share)})", f"{p.checkpoints:.3g} × {p.prompts}",
             fmt_flops(p.eval_flops) + (f" ({_pct(p.eval_flops / spent[p.rho_target])} of C_total)"
                                        if spent.get(p.rho_target) else "")]
            for p in st.points]
    table = render_table(rows, ["ρ target", "pilots", "unstable", "checkpoints × prompts",
                          "eval FLOPs per pilot (not in C_total)"], fmt)
    lines = [f"unstable: ρ={u.rho_target:.2f} seed {u.seed}: {u.target} fell to {u.value:.3f} at "
             f"{_pct(u.fraction)} of the budget (step {u.step}, {fmt_flops(u.flops)} FLOPs) from {u.best:.3f} at "
             f"{_pct(u.best_fraction)} (base {u.base:.3f}; drop {u.best - u.value:.3f}, SE {u.drop_se:.3f}); "
             f"{u.final:.3f} at the end" for u in st.unstable]
    if not st.unstable:
        lines.append(f"no pilot fell back: 0 of {st.pilots} unstable")
    r = st.rule
    lines.append(f"rule: unstable when a checkpoint keeps ≤ {_pct(r['keep'])} of its best earlier gain over the "
                 f"base policy and falls ≥ {r['min_drop']:g} and ≥ {r['drop_se']:g} paired SEs below that best "
                 "(race/stats/instability.py)")
    return [heading(f"held-out checkpoints ({st.target})", fmt), table, render_lines(lines, fmt)]


def _params_cell(model: str | None, params: Mapping[str, float]) -> str:
    if model == "sigmoid" and params:
        return f"A={params['A']:.3f}, C_mid={fmt_flops(params['c_mid'])}, B={params['B']:.2f}"
    if model == "loglinear" and params:
        return f"{params['a']:+.3f} {params['b']:+.4f}·ln C"
    return "—"


def forecast_lines(fc: Forecast) -> list[str]:
    """The forecast's lines beside its tables: the range at F from the budget-drift model first
    (race.stats.drift, a second statement beside the verdict at B) and the prior-start recommendation beside
    it (race.stats.design.prior_start), then the forecast's one-line summary or refusal."""
    out = [range_at_budget_line(fc.range_at_budget)] if fc.range_at_budget else []
    start = prior_start_line(fc.range_at_budget) if fc.range_at_budget else None
    out += [start] if start else []
    if fc.stability_at_budget:
        out.append(str(fc.stability_at_budget.get("line", "")))
        if fc.stability_at_budget.get("rate"):
            out.append(str(fc.stability_at_budget["rate"]))
    out.append(fc.message)
    if not fc.predicts:
        return out + [f"warning: {w}" for w in fc.warnings]
    if fc.model == "sigmoid":
        out.append(f"model: sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), R0 = {fc.r0:.4f} (base policy), "
                   + ("one B for all ρ" if fc.shared_slope else "one B per ρ (lower AICc)"))
    else:
        out.append(f"model: loglinear R(C) = a + b·ln C per ρ (R0 = {fc.r0:.4f}, base policy, not fitted)")
    half = [b for b in fc.backtests if b.model == fc.model]
    rng = format_rho_set(fc.rho_range or (float("nan"), float("nan")), fc.open_side)
    out.append(f"verdict at {fmt_flops(fc.full_run_budget)} FLOPs: {fc.regime.value if fc.regime else '?'} · best ρ "
               f"{fc.best_rho:.2f} · {rng} · confidence {fc.confidence:.2f}; at the pilot budget "
               f"{fmt_flops(fc.pilot_budget)}: {fc.pilot_regime.value} · best ρ {fc.pilot_best_rho:.2f}"
               + (" · DIFFERS" if fc.differs else " · same"))
    if half:
        support = f"{fc.supported_factor:.2g}×" if fc.supported_factor else "no factor"
        out.append(f"backtests ({fc.model}) held up to {support}; this forecast extrapolates {fc.factor:.3g}× "
                   f"(CIs: {fc.settings.get('confidence_level', 0.9):.0%}, {fc.settings.get('n_boot')} bootstrap "
                   "refits over seeds and checkpoint prompts; they do not include the backtest error)")
    return out + [f"warning: {w}" for w in fc.warnings]


def range_at_budget_line(r: Mapping[str, Any]) -> str:
    """The one line of a stored range at F (race.stats.drift.RangeAtBudget.to_dict) or of its refusal."""
    return f"no range at F: {r['refused']}" if "refused" in r else str(r.get("line", ""))


def prior_start_line(r: Mapping[str, Any]) -> str | None:
    """The line of the prior-start recommendation stored beside a range at F (race.stats.design.prior_start),
    or None when the record holds none (a refusal, or results written before it)."""
    start = r.get("prior_start")
    return str(start["line"]) if isinstance(start, Mapping) and start.get("line") else None


def _forecast_parts(fc: Forecast, fmt: str, stability: Stability | None = None) -> list[str]:
    """The forecast at the full-run budget: per ρ the pilots' end, the fit there and the prediction
    with its CI; the verdict at F beside the pilot verdict; the backtests. Refused: one line. With
    unstable pilots (``stability``), a line saying their curves are fitted as they fell."""
    parts = [heading(f"forecast at {fmt_flops(fc.full_run_budget)} FLOPs per run ({fc.target})", fmt)]
    if fc.predicts:
        rows = [[f"{p.rho_target:.2f}", p.pilots, f"{p.pilot_score:.4f} at {fmt_flops(p.pilot_flops)}",
                 f"{p.fitted_end:.4f}",
                 f"{p.predicted:.4f} ({p.predicted_ci[0]:.4f} … {p.predicted_ci[1]:.4f})"
                 + (" FORCED" if fc.status == "forced" else ""),
                 _params_cell(fc.model, p.params)] for p in fc.points]
        parts.append(render_table(rows, ["ρ target", "pilots", "held-out at pilot end", "fit there",
                                   f"predicted at {fmt_flops(fc.full_run_budget)} (CI)", "fit"], fmt))
    lines = forecast_lines(fc)
    fell = [p for p in (stability.points if stability else ()) if p.unstable]
    if fc.predicts and fell:
        lines.append("collapses: " + ", ".join(f"ρ={p.rho_target:.2f} {p.unstable} of {p.pilots} pilots" for p in fell)
                     + " fell back towards the base policy (held-out checkpoints above); their curves are fitted as "
                       "they are, and no fit predicts a collapse: count it as a risk of that ρ at F")
    parts.append(render_lines(lines, fmt))
    if fc.backtests:
        rows = [[b.model, f"{b.cut_fraction:.3f}", f"{b.factor:.2f}×",
                 " ".join(f"{e:+.3f}" for e in b.errors), f"{b.mae:.4f}", f"{b.contrast_mae:.4f}",
                 f"{b.spread / 2:.4f}", "yes" if b.held else "no"]
                for b in sorted(fc.backtests, key=lambda b: (b.model != fc.model, b.model, b.factor))]
        parts.append(render_table(rows, ["backtest model", "fit up to (of budget)", "factor",
                                   "error per ρ (pred - obs)", "mae", "ρ-difference error", "half ρ spread", "held"],
                            fmt))
    return parts


def render_diagnosis(diag: Diagnosis, fmt: str = "text") -> str:
    """Per grid point ρ, schedule, C_search / C_learning / C_reward and shares, reward ± CI; then verdicts."""
    check_format(fmt)
    if fmt == "json":
        return json.dumps(diagnosis_json(diag), indent=2)
    meta = diag.meta
    head = [f"{k}: {fmt_flops(meta[k]) if isinstance(meta[k], float) else meta[k]}"
            for k in ("model", "task", "reward", "backend", "engine", "budget_per_pilot", "seeds", "adaptive",
                      "budget_halving", "software")
            if k in meta]
    parts = [heading("RACE diagnosis", fmt)]
    if head:
        parts.append(render_lines(head, fmt))
    v = diag.primary
    parts.append(heading(f"primary target: {v.target}", fmt))
    parts.append(_points_table(v, fmt))
    parts.append(render_lines(_verdict_lines(v), fmt))
    if diag.stability is not None:
        parts += _stability_parts(diag.stability, v, fmt)
    if diag.forecast is not None:
        parts += _forecast_parts(diag.forecast, fmt, diag.stability)
    others = [diag.verdicts[t] for t in diag.verdicts if t != diag.primary_target]
    if others:
        parts.append(heading("other targets", fmt))
        parts.append(_targets_table(others, fmt))
        parts.append(heading("agreement across targets", fmt))
        parts.append(_agreement_table(diag, fmt))
    calibration = [meta[k] for k in _records.CALIBRATION_WARNINGS if meta.get(k)]
    notes = list(meta.get("flop_warnings") or []) + calibration + list(diag.warnings)
    if notes:
        parts.append(render_lines([f"warning: {w}" for w in notes], fmt))
    return "\n\n".join(parts) + "\n"


def diagnosis_json(diag: Diagnosis) -> dict[str, Any]:
    """The diagnosis as JSON; with more than one target, ``agreement`` holds the disagreement table
    (race.stats.regime.target_agreement)."""
    out = {"schema_version": SCHEMA_VERSION, "kind": "diagnosis", **diag.to_dict()}
    if len(diag.verdicts) > 1:
        from race.stats.fit import target_agreement

        out["agreement"] = target_agreement(diag)
    return out


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is unknown: expected one of {', '.join(FORMATS)}")


RENDERERS: dict[str, Callable[..., str]] = {"plan": render_plan, "diagnosis": render_diagnosis}

_records.RENDERERS.update(RENDERERS)     # print(diagnosis) renders through this module (race.core.records)
