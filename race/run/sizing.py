"""Pilots sized from the full run: a config, a full-run budget F and a pilot design become the grid
that runs (issue 49, item 1).

``race plan --full-run F`` states the design before anything runs; ``race pilot`` and
``race.diagnose`` run exactly what it states, because both go through ``size_pilots``:

- the design ``grid`` (the default of a config that names none) runs the config as written: its
  points × seeds at its budget per pilot;
- ``fit``, ``flat``, ``prior`` and ``halving`` (race.stats.pilotdesign.DESIGNS) spend ``share`` of F, held-out
  evaluation counted (race.flops.grid.eval_flops, at the config's expected lengths, as ``race plan``
  counts it): the config's budget is replaced by the design's, its grid by the design's points, and
  the pilots that run are the design's (ρ, seed index) pairs (``RunOptions.design``); where ``fit``
  thinned the held-out evaluation (race.stats.pilotdesign.EvalCut: fewer checkpoint evaluations, the
  final pass kept), the config's ``eval.checkpoints`` and ``eval.checkpoint_prompts`` become the cut's,
  so the pilots spend on evaluation what the design counted;
- ``halving`` sizes the top budget B of budget halving's ladder (every pilot to B/11, the best half on to
  B): the sized config's budget is B, and the record's ``halving`` (η, rungs, keep) is what
  ``RunOptions.design`` turns into ``--adaptive-policy budget-halving`` with that ladder
  (race.run.options.RunOptions.design_ladder), so ``race pilot --design halving`` runs what ``race plan``
  states and results.json's ``design`` and ``budget_halving`` both say so.

Invariants: a sized grid never spends more than its share of F on planned compute and evaluation
estimates; a design that runs no pilots is refused in one line that says what to run instead (the
prior ρ with the whole compute), before calibration; the same config, F, design and share always size
the same grid, so a stopped study resumes; a sized config reads as written (``grid``), so it is never sized
twice.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from race.config.configfile import GridConfig
from race.config.rules import AS_WRITTEN, DEFAULT_PILOT_SHARE
from race.core.errors import RaceError


class SizingError(RaceError):
    """A design that cannot run here: no full-run budget to size from, or no pilots within the share."""


def size_pilots(cfg: GridConfig, *, full_run: float | None, design: str | None = None,
                share: float | None = None) -> tuple[GridConfig, dict[str, Any] | None]:
    """``cfg`` sized by ``design`` (default: the config's ``pilot_design``) within ``share`` (default: the
    config's ``pilot_share``) of ``full_run``, and the design's record (race.stats.pilotdesign.DesignPlan
    .to_dict(); None for ``grid``, the config as written)."""
    name = cfg.pilot_design if design is None else design
    s = cfg.pilot_share if share is None else share
    if name == AS_WRITTEN:
        if share is not None:           # given and unused would be a silent no-op, whatever its value
            raise SizingError(f"share {share!r} sizes pilots from the full run: give a design too (--design fit)")
        return cfg, None
    from race.flops.grid import eval_flops, plan_grid, policy_arch
    from race.stats.pilotdesign import choose, design_named

    design_named(name)                               # an unknown design: one line, naming the choices
    if not full_run:
        raise SizingError(f"pilot design {name!r} sizes the pilots from the full run: give --full-run F "
                          "(full_run_budget), or --design grid to run the config as written")
    if cfg.models:
        raise SizingError(f"pilot design {name!r} sizes one policy's grid: run a grid over models with --design grid")
    planned = plan_grid(cfg)
    ev = eval_flops(cfg, policy_arch(cfg), planned.prompt_len, planned.completion_len)
    chosen = choose(planned, full_run=full_run, share=s, eval_flops=ev, design=name)
    if not chosen.pilots:
        raise SizingError(f"{chosen.line()} (no pilots run; race plan CONFIG --full-run {full_run:.3g} shows why; "
                          f"race recipe CONFIG --rho {chosen.prior:g} --full-run {full_run:.3g} --for TRAINER writes "
                          "that run)")
    seeds = 1 + max(k for _, k in chosen.pilots)
    # the sized grid reads as written (its design's record goes with the run: RunOptions.design, results.json's
    # meta), so sizing it again, or a worker reading it, never sizes twice
    cut = chosen.eval_cut
    ev_cfg = cfg.eval if cut is None else replace(cfg.eval, checkpoints=cut.checkpoints,
                                                  checkpoint_prompts=cut.checkpoint_prompts)
    sized = replace(cfg, budget=chosen.budget, grid=chosen.points, seeds=seeds, pilot_design=AS_WRITTEN,
                    pilot_share=DEFAULT_PILOT_SHARE, full_run_budget=full_run, eval=ev_cfg)
    return sized, chosen.to_dict()



OVERRUN_TOLERANCE = 0.01     # a sized grid whose spend at the calibrated lengths exceeds its share by more warns


def overrun_line(design: dict[str, Any], run_cfg: GridConfig, prompt_len: float, completion_len: float) -> str | None:
    """The warning ``race pilot`` gives after calibration when a sized design's pilots will spend more than their
    share of F: the design counted held-out evaluation at the config's expected lengths, and the calibrated
    ones make it costlier (on round 1's ``hard`` setting: 8.0 and 4.6 tokens against 5.9 and 3.5 expected, the
    evaluation 1.4 × its estimate, 0.114 of F spent at a 0.10 share; docs/pilot.md). Training is metered to B
    whatever the lengths, so only the evaluation is rescaled (race.stats.pilotdesign.DesignPlan.spent_at). None
    when the spend stays within the share (to ``OVERRUN_TOLERANCE``), or for a config run as written (``design``
    empty)."""
    if not design or not design.get("pilots"):
        return None
    from race.flops.grid import eval_flops, policy_arch
    from race.stats.pilotdesign import DesignPlan

    arch = policy_arch(run_cfg)
    before = eval_flops(run_cfg, arch, run_cfg.prompt_len, run_cfg.completion_len)     # the lengths sizing used
    ratio = eval_flops(run_cfg, arch, prompt_len, completion_len) / before if before > 0 else 1.0
    spend = DesignPlan.from_dict(design).spent_at(ratio)
    F, share = float(design["full_run"]), float(design["share"])
    if spend <= share * F * (1 + OVERRUN_TOLERANCE):
        return None
    return (f"held-out evaluation at the calibrated lengths ({prompt_len:.3g} prompt and {completion_len:.3g} "
            f"completion tokens; {run_cfg.prompt_len:.3g} and {run_cfg.completion_len:.3g} expected) costs "
            f"{ratio:.2f} × its estimate: the pilots will spend about {spend / F:.1%} of F, over the {share:.0%} "
            f"share; put the calibrated lengths in the config (lengths: prompt, completion) or give a smaller --share "
            f"to stay within it")
