"""The TRL recipe's FLOP statement against FlopCounterMode, on the script race recipe --emit writes.

    python bench/trl_split.py [--mu 1 2] [--steps 2]

For each μ: the recipe of a tiny grid config (race/tiny-arith on arithmetic-easy, 2 prompts × 4
generations, ≤ 6 new tokens, completions of varying length) is emitted (race recipe --for trl
--emit), its train_trl.py runs ``--steps`` steps on CPU under FlopCounterMode, and the FLOPs inside
TRL's generation (search) and the rest (learning) are printed beside RACE's statement for TRL
(race.recipes.trainer_step_cost) at each step's padded lengths. docs/recipes.md shows the output.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(mu: int, steps: int) -> dict:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from race import recipes as R
    from race.config import config_from_dict
    from race.grid import CostModel
    from race.records import FlopBreakdown
    from race.specs import lora_spec, policy_arch, reward_spec

    torch.manual_seed(0)
    cfg = config_from_dict({"model": "race/tiny-arith", "budget": 1e12, "lengths": {"prompt": 6, "completion": 6},
                            "schedule": {"prompts_per_step": 2, "n_train": 4, "max_n_gen": 4, "mu": mu},
                            "grpo": {"max_completion_len": 6}, "learning_rate": {"ref": 1e-3, "ref_batch": 64}})
    rho = CostModel(cfg, policy_arch(cfg), reward_spec(cfg), 6, 6).cost(4, mu, 4).per_prompt.rho
    one = R.recipe(cfg, trainer="trl", rho=rho, full_run_budget=1e15).flops_per_step.total
    out = Path(tempfile.mkdtemp(prefix="race-trl-split-"))
    rec = R.recipe(cfg, trainer="trl", rho=rho, full_run_budget=(steps + 0.5) * one, emit_dir=str(out))
    spec = importlib.util.spec_from_file_location("train_trl", out / "train_trl.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    trainer = script.build(output_dir=str(out / "out"), disable_tqdm=True, seed=0)
    counter, calls, generate = FlopCounterMode(display=False), [], trainer._generate_single_turn

    def counted(prompt_ids, *a, **k):
        before = counter.get_total_flops()
        got = generate(prompt_ids, *a, **k)
        calls.append((counter.get_total_flops() - before, max(map(len, prompt_ids)), max(len(c) for c in got[0]),
                      sorted({len(c) for c in got[0]})))
        return got

    trainer._generate_single_turn = counted
    with counter:
        trainer.train()
    arch = policy_arch(cfg)
    s = rec.schedule
    want = FlopBreakdown()
    for _, P, C, _ in calls:
        want = want + R.trainer_step_cost(R.RUNS["trl"], arch, lora_spec(cfg, arch), None, prompt_len=P,
                                          completion_len=C, n=s.n_gen, mu=s.mu, beta=0.0,
                                          grad_checkpointing=False).scaled(s.prompts_per_step)
    search = float(sum(c[0] for c in calls))
    return {"mu": mu, "steps": len(calls), "lengths": [c[3] for c in calls], "search": search,
            "learning": counter.get_total_flops() - search, "want": want}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mu", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    print("| μ | completion lengths per step | search measured / stated | learning measured / stated | "
          "ρ measured | ρ stated |")
    print("|---|---|---|---|---|---|")
    for mu in args.mu:
        m = measure(mu, args.steps)
        w = m["want"]
        pct = lambda a, b: f"{(a / b - 1) * 100:+.2f} %"  # noqa: E731
        print(f"| {mu} | {m['lengths']} | {m['search']:,.0f} / {w.search:,.0f} ({pct(m['search'], w.search)}) | "
              f"{m['learning']:,.0f} / {w.learning:,.0f} ({pct(m['learning'], w.learning)}) | "
              f"{m['learning'] / (m['search'] + m['learning']):.4f} | {w.rho:.4f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
