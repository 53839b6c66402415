"""The recipes end to end on a GPU (issue 51): for each trainer, ``race recipe --emit`` for a 0.5B
policy at a full-run budget F of ``--steps`` of the trainer's own steps, then the trainer started from
the emitted folder as the recipe prints it, and what it ran compared with what the recipe promised.

    python bench/recipe_gpu_e2e.py --trainers trl                                  # one CUDA GPU
    python bench/recipe_gpu_e2e.py --verl-python ~/verl-env/bin/python --openrlhf-python ~/orl/bin/python
    python bench/recipe_gpu_e2e.py --model ~/Qwen2.5-0.5B-Instruct --reward math  # a real 0.5B policy
    python bench/recipe_gpu_e2e.py --dry-run                                       # no GPU: recipes and commands only

Marked for a GPU: without CUDA it stops in one line (exit 2) unless ``--dry-run``, which writes the
recipes and prints the commands it would run (what CI can check on CPU). It has not run on a GPU yet.

- **The policy.** ``--model PATH`` (a local folder; the device machines have no network), else Qwen2.5-0.5B's
  shipped config (race/assets/configs) with random bf16 weights and race/tiny-reasoner's tokenizer
  (ChatML, ``"\\n"`` one token, 702 ids, all valid in Qwen's vocabulary): enough to check that a recipe
  starts, trains and stops where it should, not that the reward moves (a random policy scores ~0).
- **The config.** race/tiny-reasoner's word problems, LoRA r 16 on all linear modules, 8 prompts per
  step, completions ≤ ``--max-new`` tokens; F = (``--steps`` + 0.5) × one step's FLOPs as RACE states the
  trainer's step (race.fullrun.recipes), so the recipe's own step count is ``--steps``.
- **The trainers**, each in the environment its users install (their pins conflict with RACE's:
  docs/recipes.md): TRL in this interpreter (``train_trl.py``'s ``build``, logging every step); verl with
  ``--verl-python`` (the recipe's ``python3 -m verl.trainer.main_ppo`` command, plus ``trainer.logger=[console]``
  and no W&B); OpenRLHF with ``--openrlhf-python`` (its command; Ray starts a local cluster). A trainer
  without its interpreter is skipped with a line.
- **What it checks**, per trainer: exit status 0; the steps it ran, counted from its own log (TRL's
  ``log_history``, verl's ``step:N`` console lines, OpenRLHF's ``Global step N`` lines) equal the
  recipe's (TRL: optimizer steps = steps × μ); a mean reward logged at every step; the wall time.
  The table goes to stdout and ``--json``; each trainer's log to ``OUT/<trainer>.log``.

Exit status: 0 when every trainer run passed, 1 when one failed, 2 on bad input or no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

QWEN_05B = os.path.join(ROOT, "race", "assets", "configs", "Qwen--Qwen2.5-0.5B-Instruct.json")
TOKENIZER_FROM = os.path.join(ROOT, "race", "assets", "tiny-reasoner")
STEP_LINES = {"verl": re.compile(r"(?:^|\s)step:(\d+)\b"), "openrlhf": re.compile(r"Global step (\d+)")}
REWARD_LINES = {"verl": re.compile(r"critic/score/mean:(-?[0-9.eE+-]+)"),
                "openrlhf": re.compile(r"'reward': (-?[0-9.eE+-]+)")}


def random_policy(out: str, weights: bool = True) -> str:
    """Qwen2.5-0.5B's architecture with random bf16 weights and race/tiny-reasoner's tokenizer, saved in
    ``out`` (without ``weights``: its config and tokenizer only, which is all a recipe reads)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with open(QWEN_05B, encoding="utf-8") as fh:
        raw = json.load(fh)
    tok = AutoTokenizer.from_pretrained(TOKENIZER_FROM)
    raw.update(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    config = AutoConfig.for_model(**{k: v for k, v in raw.items() if k not in ("architectures", "transformers_version")})
    config.architectures = raw.get("architectures")
    tok.save_pretrained(out)
    if not weights:
        config.save_pretrained(out)
        return out
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.save_pretrained(out)
    return out


def race_config(model: str, reward: str, max_new: int):
    """The pilot config the recipes are made from (the budget is the pilots'; F is set per trainer)."""
    from race.config.configfile import config_from_dict

    kind = {"kind": "mix", "mix": {"math": 0.9, "format": 0.1}} if reward == "math" else {"kind": reward}
    return config_from_dict({
        "model": model, "task": "word-problems", "budget": 1e14, "reward": kind,
        "lora": {"rank": 16, "alpha": 32, "targets": "all"}, "lengths": {"prompt": 60, "completion": max_new // 2},
        "schedule": {"prompts_per_step": 8, "n_train": 8, "max_n_gen": 8, "mu": 1},
        "grpo": {"max_completion_len": max_new}, "learning_rate": {"ref": 1e-4, "ref_batch": 64, "fixed": True}})


def make_recipe(cfg, trainer: str, steps: int, out: str):
    """(the recipe whose F pays for ``steps`` of the trainer's steps, emitted into ``out``; F)."""
    from race.flops.grid import CostModel
    from race.flops.specs import policy_arch, reward_spec
    from race.fullrun.recipes import recipe

    n = cfg.schedule.n_train                       # on-policy: n generated = n trained, μ = 1
    rho = CostModel(cfg, policy_arch(cfg), reward_spec(cfg), cfg.prompt_len, cfg.completion_len).cost(n, 1, n) \
        .per_prompt.rho
    probe = recipe(cfg, trainer=trainer, rho=rho, full_run_budget=1e20, gpus=1)
    full = (steps + 0.5) * probe.flops_per_step.total
    return recipe(cfg, trainer=trainer, rho=rho, full_run_budget=full, gpus=1, emit_dir=out), full


def command(rec, python: str, log_dir: str) -> list[str]:
    """The recipe's printed command line (race recipe --format text) for ``python``, with what this
    bench adds: verl's console logger (the machine has no network for W&B) and checkpoint folder, OpenRLHF's checkpoint folders."""
    from race.fullrun.recipes import render_recipe

    text = "\n".join(x for x in render_recipe(rec, "text").splitlines() if x.strip() and not x.startswith("#"))
    argv = shlex.split(text.replace("\\\n", " "))
    if argv[0] != "python3":
        raise SystemExit(f"recipe_gpu_e2e: the {rec.trainer} recipe does not start with python3: {argv[:3]}")
    if rec.trainer == "verl":
        argv += ["trainer.logger=[console]", f"trainer.default_local_dir={os.path.join(log_dir, 'verl-ckpt')}",
                 "trainer.save_freq=-1"]
    else:
        argv += ["--ckpt.path", os.path.join(log_dir, "openrlhf-ckpt"), "--ckpt.output_dir", os.path.join(log_dir, "openrlhf-out")]
    return [python] + argv[1:]


def run_trl(rec, emit: str, log: str) -> dict:
    """train_trl.py's trainer, every step logged; (status, steps, rewards) from its log history."""
    code = (f"import json, sys; sys.path.insert(0, {emit!r}); import train_trl\n"
            f"t = train_trl.build(output_dir={os.path.join(emit, 'out')!r}, logging_steps=1)\nt.train()\n"
            f"json.dump(t.state.log_history, open({log + '.json'!r}, 'w'))\n")
    status, wall = _run([sys.executable, "-c", code], emit, log)
    history = json.load(open(log + ".json")) if status == 0 else []
    rewards = [h["reward"] for h in history if "reward" in h]
    return {"status": status, "wall_s": wall, "steps": max([h.get("step", 0) for h in history] or [0]),
            "rewards": rewards, "want": rec.settings["max_steps"]}


def run_cli(rec, python: str, emit: str, log: str) -> dict:
    """verl's or OpenRLHF's command from the recipe; steps and rewards read from its log."""
    status, wall = _run(command(rec, python, emit), emit, log)
    text = open(log, encoding="utf-8", errors="replace").read()
    steps = {int(m) for m in STEP_LINES[rec.trainer].findall(text)}
    rewards = [float(m) for m in REWARD_LINES[rec.trainer].findall(text)]
    want = rec.settings.get("trainer.total_training_steps") or rec.schedule.steps
    return {"status": status, "wall_s": wall, "steps": max(steps or {0}), "rewards": rewards, "want": want}


def _run(argv: list[str], cwd: str, log: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "PYTHONWARNINGS": "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"}
    env.pop("PYTHONPATH", None)                 # the trainer's environment, not RACE's checkout
    start = time.time()
    with open(log, "w", encoding="utf-8") as fh:
        fh.write("$ " + shlex.join(argv) + "\n")
        fh.flush()
        done = subprocess.run(argv, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    return done.returncode, round(time.time() - start, 1)


def _passed(r: dict) -> bool:
    return r["status"] == 0 and r["steps"] == r["want"] and len(r["rewards"]) >= r["want"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainers", default="trl,verl,openrlhf")
    ap.add_argument("--model", default=None, help="a local policy folder (default: random Qwen2.5-0.5B)")
    ap.add_argument("--reward", default="math", choices=("math", "sparse"),
                    help="math: math-verify 0.9 + format 0.1 (needs math-verify where the trainer runs)")
    ap.add_argument("--steps", type=int, default=12, help="the trainer's steps F pays for (≥ 10)")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--verl-python", default=None)
    ap.add_argument("--openrlhf-python", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT") or "recipe-e2e")
    ap.add_argument("--json", default=None)
    ap.add_argument("--dry-run", action="store_true", help="write the recipes and print the commands; run nothing")
    a = ap.parse_args(argv)
    trainers = [t.strip() for t in a.trainers.split(",") if t.strip()]
    bad = [t for t in trainers if t not in ("trl", "verl", "openrlhf")]
    if bad or a.steps < 1 or a.max_new < 8:
        print(f"recipe_gpu_e2e: bad input: trainers {bad or trainers}, --steps {a.steps}, --max-new {a.max_new}",
              file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available() and not a.dry_run:
        print("recipe_gpu_e2e: needs a CUDA GPU (run with --dry-run to write the recipes only)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    model = os.path.abspath(a.model) if a.model else random_policy(os.path.join(a.out, "policy"), not a.dry_run)
    cfg = race_config(model, a.reward, a.max_new)
    pythons = {"trl": sys.executable, "verl": a.verl_python, "openrlhf": a.openrlhf_python}
    rows = []
    for t in trainers:
        emit = os.path.abspath(os.path.join(a.out, t))
        shutil.rmtree(emit, ignore_errors=True)
        rec, full = make_recipe(cfg, t, a.steps, emit)
        log = os.path.join(os.path.abspath(a.out), f"{t}.log")
        row = {"trainer": t, "recipe_steps": rec.schedule.steps, "mu": rec.schedule.mu,
               "flops": rec.flops.total, "F": full}
        if a.dry_run or not pythons[t]:
            row["skipped"] = "dry run" if a.dry_run else f"no --{t}-python"
            print(f"# {t}: {row['skipped']}:", shlex.join(command(rec, pythons[t] or "python3", emit))
                  if t != "trl" else f"python {os.path.join(emit, 'train_trl.py')}")
        else:
            row.update(run_trl(rec, emit, log) if t == "trl" else run_cli(rec, pythons[t], emit, log))
            row["passed"] = _passed(row)
        rows.append(row)
    print(f"{'trainer':<9} {'recipe steps':>12} {'ran':>5} {'want':>5} {'rewards':>8} {'mean reward':>11} "
          f"{'wall s':>7}  result")
    for r in rows:
        rw = r.get("rewards") or []
        print(f"{r['trainer']:<9} {r['recipe_steps']:>12} {r.get('steps', '-'):>5} {r.get('want', '-'):>5} "
              f"{len(rw):>8} {(sum(rw) / len(rw) if rw else float('nan')):>11.4f} {r.get('wall_s', '-'):>7}  "
              + (r.get("skipped") or ("passed" if r["passed"] else f"FAILED (exit {r['status']})")))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    return 0 if all(r.get("passed", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
