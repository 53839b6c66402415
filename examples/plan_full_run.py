"""Embed RACE in a planning script: diagnose on the tiny policy, then size the full run.

    python examples/plan_full_run.py                 # the embedded default grid (~5 min on 2 cores)
    python examples/plan_full_run.py --budget 3e11   # a quicker, noisier look

It runs a real pilot grid with ``race.diagnose``, reads the verdict, and plans the
full run at the centre of the recommended ρ range with ``race.plan_grid``: the
schedule (B_p, n_gen, n_train, μ, steps) a team would launch, with its FLOP split.
"""
import argparse

import race
from race.config.configfile import config_from_dict
from race.config.presets import DEFAULT
from race.stats.report import render_diagnosis, render_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default=None, help="FLOPs per pilot (default: the preset's)")
    ap.add_argument("--full-run", type=float, default=5e13, help="FLOPs of the run being planned")
    ap.add_argument("--out", default="runs/example")
    args = ap.parse_args()

    diagnosis = race.diagnose(budget=args.budget, out_dir=args.out, quiet=False)
    print(render_diagnosis(diagnosis))

    rho = round(diagnosis.recommended_rho, 3)     # the range's centre, or the grid-edge point of an open range
    if diagnosis.regime is race.Regime.INCONCLUSIVE:
        print(f"inconclusive: planning at the pilot-best ρ={diagnosis.primary.best_rho:.2f} instead")
        rho = diagnosis.primary.best_rho
    full = config_from_dict({**DEFAULT, "budget": args.full_run, "grid": [rho], "seeds": 1})
    print(render_plan(race.plan_grid(full)))


if __name__ == "__main__":   # pilots run in child processes: keep the guard
    main()
