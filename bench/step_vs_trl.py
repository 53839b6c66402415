"""Wall time of one LoRA GRPO step: RACE's ``SeedAxisEngine`` (one seed) against TRL's ``GRPOTrainer``.

    python bench/step_vs_trl.py                          # 3 rounds x 30 steps each, 2 torch threads
    python bench/step_vs_trl.py --threads 2 1 --json out.json

Both systems train the shipped tiny policy (race/tiny-arith) on ``arithmetic-easy``
training prompts with the same recipe: 4 prompts x 8 rollouts per step, every rollout
trained on (n_gen = n_train = 8, mu = 1), LoRA r=8 / alpha=16 / dropout 0 on the 7
linear modules, completions <= 6 tokens, temperature 1.0, AdamW lr 1e-3 (constant,
no weight decay, grad-norm clip 1.0), fp32 on CPU, no KL (beta = 0), DAPO loss
aggregation, exact-match (sparse) reward.

Both live in this one process and take turns: after a warm-up, ``--rounds`` rounds of
``--steps`` steps of each (the order alternates between rounds), so load from other
jobs on the machine hits both alike. A TRL block is one ``trainer.train()`` call with
``max_steps = --steps``; its steps are timed by a ``TrainerCallback`` (``on_step_begin``
to ``on_step_end``: generation, reward, loss, backward, clip and optimizer step; the
dataloader fetch falls outside, and is reported separately as the end-to-end
interval). TRL's generation is timed by wrapping ``GRPOTrainer._generate_single_turn``
(its ``model.generate`` call plus padding) and its rollout+score phase by wrapping
``_generate_and_score_completions``. RACE's step is timed around ``engine.step`` and
split by ``engine.walls[0]``. A torch fp32 matmul peak is measured in the same run, at the
same thread count, so RACE's metered FLOP/s can be read as a fraction of it.

Nothing in race/ is modified: the benchmark only wraps instance attributes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "race/tiny-arith"
TASK = "arithmetic-easy"
PROMPTS, N_GEN, MAX_COMPLETION, LR, RANK, ALPHA, TEMPERATURE = 4, 8, 6, 1e-3, 8, 16, 1.0
MATMUL_SHAPES = [(32, 128, 512), (128, 128, 512), (256, 512, 512), (512, 512, 512), (1024, 1024, 1024),
                 (2048, 2048, 2048)]


# ----------------------------------------------------------------------------- small helpers

def quartiles(xs: list[float]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(xs, dtype=float)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "iqr": float(q3 - q1), "mean": float(a.mean()),
            "n": int(a.size)}


def loadavg() -> tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except OSError:
        return (float("nan"),) * 3  # type: ignore[return-value]


def matmul_peak(threads: int, seconds_per_shape: float = 0.25) -> dict:
    """Best fp32 GFLOP/s of ``torch.mm`` per shape (m×k @ k×n) at ``threads`` threads.

    Each sample times a batch of back-to-back products (≥ ~2 ms of work) and the best
    sample counts: a peak, which other jobs on the machine can only lower.
    """
    import torch

    torch.set_num_threads(threads)
    rows = []
    for m, k, n in MATMUL_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        flop = 2.0 * m * k * n
        batch = max(1, int(4e8 // flop))            # ~2 ms at 200 GFLOP/s
        for _ in range(2):
            torch.mm(a, b)
        best, samples, t_end = float("inf"), 0, time.perf_counter() + seconds_per_shape
        while time.perf_counter() < t_end or samples < 3:
            t = time.perf_counter()
            for _ in range(batch):
                torch.mm(a, b)
            best = min(best, (time.perf_counter() - t) / batch)
            samples += 1
        rows.append({"shape": f"{m}x{k}x{n}", "gflops": flop / best / 1e9, "samples": samples, "batch": batch})
    return {"threads": threads, "shapes": rows, "max_gflops": max(r["gflops"] for r in rows)}


def best_per_shape(peaks: list[dict]) -> dict:
    """Per shape, the best of several ``matmul_peak`` measurements."""
    shapes = {}
    for pk in peaks:
        for row in pk["shapes"]:
            shapes[row["shape"]] = max(shapes.get(row["shape"], 0.0), row["gflops"])
    return {"shapes": [{"shape": k, "gflops": v} for k, v in shapes.items()], "max_gflops": max(shapes.values()),
            "measurements": peaks}


# ----------------------------------------------------------------------------- RACE

class RaceRunner:
    """A one-seed ``SeedAxisEngine`` with the benchmark's schedule; ``run(n)`` times n steps."""

    def __init__(self, seed: int):
        from race.run.api import build_config
        from race.flops.grid import CostModel, reward_spec
        from race.flops.catalog import load_arch
        from race.engine.seed_axis import SeedAxisEngine
        from race.config.presets import DEFAULT
        from race.core.records import Schedule
        from race.tasks import load_task

        cfg = dict(DEFAULT)
        cfg.update({
            "model": MODEL, "task": TASK, "reward": {"kind": "sparse"},
            "lora": {"rank": RANK, "alpha": ALPHA, "targets": "all"},
            "schedule": {**DEFAULT["schedule"], "prompts_per_step": PROMPTS, "n_train": N_GEN, "n_gen": N_GEN,
                         "mu": 1},
            "grpo": {**DEFAULT["grpo"], "temperature": TEMPERATURE, "max_completion_len": MAX_COMPLETION,
                     "beta": 0.0},
            "learning_rate": {"ref": LR, "ref_batch": PROMPTS * N_GEN, "fixed": True},
        })
        self.config = config = build_config(cfg)
        cm = CostModel(config, load_arch(config.model), reward_spec(config), config.prompt_len,
                       config.completion_len)
        per_step = cm.cost(N_GEN, 1).per_prompt.scaled(PROMPTS)
        self.schedule = Schedule(rho_target=per_step.rho, prompts_per_step=PROMPTS, n_gen=N_GEN, n_train=N_GEN,
                                 mu=1, steps=1_000_000, learning_rate=LR, lora_rank=RANK,
                                 flops_per_step=per_step, flops=per_step.scaled(1_000_000))
        self.engine = SeedAxisEngine(config, self.schedule, [seed])
        self.train = load_task(TASK, split="train", seed=seed)
        self.rng, self.order, self.cursor = random.Random(seed), list(range(len(self.train))), 0
        self.rng.shuffle(self.order)
        self._tokens: list[int] = []
        backend, method = self.engine.backend, "generate_seeds"       # the seed group's sampler
        inner = getattr(backend, method)

        def counting_generate(*a, **kw):
            out = inner(*a, **kw)
            batches = out if isinstance(out, list) else [out]
            self._tokens.append(sum(len(c) for b in batches for grp in b.completion_ids for c in grp))
            return out

        setattr(backend, method, counting_generate)     # instance attribute: race/ is untouched
        self.steps: list[dict] = []

    def _problems(self):
        if self.cursor + PROMPTS > len(self.order):
            self.rng.shuffle(self.order)
            self.cursor = 0
        out = [self.train[i] for i in self.order[self.cursor:self.cursor + PROMPTS]]
        self.cursor += PROMPTS
        return out

    def run(self, n: int, *, record: bool = True) -> None:
        eng = self.engine
        for _ in range(n):
            problems = self._problems()
            before = dict(eng.walls[0])
            t = time.perf_counter()
            rec = eng.step([0], [problems])[0]
            dt = time.perf_counter() - t
            if record:
                phases = {k: eng.walls[0][k] - before[k] for k in ("rollout", "reward", "update", "sync")}
                self.steps.append({"step_s": dt, **phases, "tokens": self._tokens[-1],
                                   "flops": rec.flops.total, "search_flops": rec.flops.search,
                                   "learning_flops": rec.flops.learning, "mean_reward": rec.mean_reward})


# ----------------------------------------------------------------------------- TRL

class TrlRunner:
    """A ``GRPOTrainer`` with the same recipe; ``run(n)`` is one ``train()`` call of n steps."""

    def __init__(self, seed: int, out_dir: str):
        import torch
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
        from transformers.utils import logging as hf_logging
        from trl import GRPOConfig, GRPOTrainer

        from race.flops.catalog import resolve_model_path
        from race.tasks.rewards.rules import sparse
        from race.tasks import load_task

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        path = resolve_model_path(MODEL)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        train = load_task(TASK, split="train", seed=seed)
        ds = Dataset.from_dict({"prompt": [p.prompt for p in train], "answer": [p.answer for p in train]})

        def exact_match(prompts, completions, answer, **_):
            """race.tasks.rewards.rules.sparse: 1.0 iff the text before any EOS, stripped, equals the answer."""
            return [sparse(p, c, a) for p, c, a in zip(prompts, completions, answer)]

        args = GRPOConfig(
            output_dir=out_dir, per_device_train_batch_size=PROMPTS * N_GEN, num_generations=N_GEN,
            gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, beta=0.0,
            max_completion_length=MAX_COMPLETION, temperature=TEMPERATURE, top_p=1.0, top_k=0,
            learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
            loss_type="dapo", scale_rewards="group", use_cpu=True, bf16=False, fp16=False,
            gradient_checkpointing=False, report_to="none", logging_strategy="no", save_strategy="no",
            eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0, dataloader_pin_memory=False,
            log_completions=False, max_steps=1, seed=seed, data_seed=seed,
        )
        lora = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"])
        runner = self
        self.steps: list[dict] = []
        self._gen: list[tuple[float, int]] = []
        self._score: list[float] = []
        self._recording = True

        class StepTimer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                runner._t_begin = time.perf_counter()
                runner._n_gen_before = len(runner._gen)

            def on_step_end(self, args, state, control, **kw):
                t = time.perf_counter()
                gen = runner._gen[runner._n_gen_before:]
                score = runner._score[-1] if runner._score else float("nan")
                interval = t - runner._t_prev if runner._t_prev is not None else float("nan")
                runner._t_prev = t
                if runner._recording:
                    runner.steps.append({"step_s": t - runner._t_begin, "interval_s": interval,
                                         "generate": sum(g[0] for g in gen), "tokens": sum(g[1] for g in gen),
                                         "gen_and_score": score, "threads": torch.get_num_threads()})

            def on_train_begin(self, args, state, control, **kw):
                runner._t_prev = None

        self.trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=args, train_dataset=ds,
                                   processing_class=tok, peft_config=lora, callbacks=[StepTimer()])
        tr = self.trainer
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        tr.remove_callback(PrinterCallback)       # logging is off; this only prints train()'s summary
        tr.remove_callback(ProgressCallback)
        gen_inner, score_inner = tr._generate_single_turn, tr._generate_and_score_completions

        def timed_generate(*a, **kw):
            t = time.perf_counter()
            completion_ids, logprobs = gen_inner(*a, **kw)
            self._gen.append((time.perf_counter() - t, sum(len(c) for c in completion_ids)))
            return completion_ids, logprobs

        def timed_score(*a, **kw):
            t = time.perf_counter()
            out = score_inner(*a, **kw)
            self._score.append(time.perf_counter() - t)
            return out

        tr._generate_single_turn = timed_generate
        tr._generate_and_score_completions = timed_score
        self.trainable = sum(p.numel() for p in tr.model.parameters() if p.requires_grad)
        self.dtype = str(next(tr.model.parameters()).dtype)

    def run(self, n: int, *, record: bool = True) -> None:
        self._recording = record
        self.trainer.args.max_steps = n
        self.trainer.train()


# ----------------------------------------------------------------------------- the comparison

def compare(race: RaceRunner, trl: TrlRunner, *, threads: int, steps: int, rounds: int, warmup: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    peaks = [matmul_peak(threads)]
    race.steps.clear()
    trl.steps.clear()
    loads = [loadavg()]
    race.run(warmup, record=False)
    trl.run(warmup, record=False)
    blocks = []
    for r in range(rounds):
        order = [("race", race), ("trl", trl)] if r % 2 == 0 else [("trl", trl), ("race", race)]
        for name, runner in order:
            t = time.perf_counter()
            runner.run(steps)
            blocks.append({"round": r, "system": name, "seconds": time.perf_counter() - t, "load": loadavg()})
        loads.append(loadavg())
        peaks.append(matmul_peak(threads))      # between rounds: the peak samples the same machine state
    return summarise(race, trl, threads=threads, peak=best_per_shape(peaks), loads=loads, blocks=blocks)


def block_medians(steps: list[dict], size: int) -> list[float]:
    import statistics

    return [statistics.median(s["step_s"] for s in steps[i:i + size]) for i in range(0, len(steps), max(1, size))]


def summarise(race: RaceRunner, trl: TrlRunner, *, threads, peak, loads, blocks) -> dict:
    rs, ts = list(race.steps), list(trl.steps)       # copies: the runners' lists are reused per thread count
    r_step = quartiles([s["step_s"] for s in rs])
    t_step = quartiles([s["step_s"] for s in ts])
    r_phases = {k: quartiles([s[k] for s in rs]) for k in ("rollout", "reward", "update", "sync")}
    r_other = quartiles([s["step_s"] - s["rollout"] - s["reward"] - s["update"] - s["sync"] for s in rs])
    r_tokens = sum(s["tokens"] for s in rs)
    r_tok_s = r_tokens / sum(s["rollout"] for s in rs)
    t_tokens = sum(s["tokens"] for s in ts)
    t_gen = quartiles([s["generate"] for s in ts])
    t_score = quartiles([s["gen_and_score"] for s in ts])
    t_update = quartiles([s["step_s"] - s["gen_and_score"] for s in ts])
    t_interval = quartiles([s["interval_s"] for s in ts if s["interval_s"] == s["interval_s"]])
    t_tok_s = t_tokens / sum(s["generate"] for s in ts)
    flops = quartiles([s["flops"] for s in rs])
    flops_per_s = sum(s["flops"] for s in rs) / sum(s["step_s"] for s in rs)
    search_per_s = sum(s["search_flops"] for s in rs) / sum(s["rollout"] for s in rs)
    learn_per_s = sum(s["learning_flops"] for s in rs) / sum(s["update"] for s in rs)
    pk = peak["max_gflops"] * 1e9
    return {
        "threads": threads,
        "race": {"step_s": r_step, "phases_s": r_phases, "other_s": r_other,
                 "completion_tokens_per_step": r_tokens / len(rs), "rollout_tokens_per_s": r_tok_s,
                 "tokens_per_step_second": r_tokens / sum(s["step_s"] for s in rs),
                 "flops_per_step": flops, "flop_per_s": flops_per_s, "search_flop_per_s": search_per_s,
                 "learning_flop_per_s": learn_per_s, "fraction_of_peak": flops_per_s / pk,
                 "mean_reward": sum(s["mean_reward"] for s in rs) / len(rs)},
        "trl": {"step_s": t_step, "interval_s": t_interval, "generate_s": t_gen, "gen_and_score_s": t_score,
                "update_and_other_s": t_update, "completion_tokens_per_step": t_tokens / len(ts),
                "rollout_tokens_per_s": t_tok_s, "tokens_per_step_second": t_tokens / sum(s["step_s"] for s in ts),
                "trainable_params": trl.trainable, "dtype": trl.dtype,
                "torch_threads_seen": sorted({s["threads"] for s in ts})},
        "ratio_race_over_trl": r_step["median"] / t_step["median"],
        "matmul_peak": peak,
        "loadavg": loads, "blocks": blocks,
        "block_medians_s": {"race": block_medians(rs, len(rs) // max(1, len(blocks) // 2)),
                            "trl": block_medians(ts, len(ts) // max(1, len(blocks) // 2))},
        "raw": {"race": rs, "trl": ts},
    }


def markdown(res: dict) -> str:
    th, r, t = res["threads"], res["race"], res["trl"]
    ms = lambda q: f"{1e3 * q['median']:.1f}"                     # noqa: E731
    iqr = lambda q: f"{1e3 * q['q1']:.1f}–{1e3 * q['q3']:.1f}"      # noqa: E731
    rp = r["phases_s"]
    lines = [
        f"### {th} torch thread{'s' if th > 1 else ''}: {r['step_s']['n']} + {t['step_s']['n']} timed steps",
        "",
        "| system | median step (ms) | IQR (ms) | rollout (ms) | reward / score (ms) | update + other (ms) "
        "| completion tok/step | rollout tok/s | tok per step-second |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| RACE `SeedAxisEngine` | **{ms(r['step_s'])}** | {iqr(r['step_s'])} | {ms(rp['rollout'])} "
        f"| {ms(rp['reward'])} | {1e3 * (rp['update']['median'] + rp['sync']['median'] + r['other_s']['median']):.1f} "
        f"| {r['completion_tokens_per_step']:.1f} | {r['rollout_tokens_per_s']:,.0f} | {r['tokens_per_step_second']:,.0f} |",
        f"| TRL 1.16 `GRPOTrainer` | **{ms(t['step_s'])}** | {iqr(t['step_s'])} | {ms(t['generate_s'])} "
        f"| {1e3 * (t['gen_and_score_s']['median'] - t['generate_s']['median']):.1f} | {ms(t['update_and_other_s'])} "
        f"| {t['completion_tokens_per_step']:.1f} | {t['rollout_tokens_per_s']:,.0f} | {t['tokens_per_step_second']:,.0f} |",
        "",
        f"- **RACE / TRL median step = {res['ratio_race_over_trl']:.3f}** (target ≤ 0.5: "
        f"{'met' if res['ratio_race_over_trl'] <= 0.5 else 'NOT met'}). TRL end-to-end step interval "
        f"(incl. dataloader fetch): median {ms(t['interval_s'])} ms.",
        f"- RACE metered FLOPs per step: median {r['flops_per_step']['median']:.3g} "
        f"(IQR {r['flops_per_step']['q1']:.3g}–{r['flops_per_step']['q3']:.3g}); "
        f"{r['flop_per_s'] / 1e9:.2f} GFLOP/s over the whole step = {100 * r['fraction_of_peak']:.2f} % of the "
        f"matmul peak; {r['search_flop_per_s'] / 1e9:.2f} GFLOP/s while sampling, "
        f"{r['learning_flop_per_s'] / 1e9:.2f} GFLOP/s while updating.",
        f"- torch fp32 matmul peak ({th} thr, best of {len(res['matmul_peak']['measurements'])} measurements "
        f"spread over the run): {res['matmul_peak']['max_gflops']:.0f} GFLOP/s (" + ", ".join(f"{s['shape']}: {s['gflops']:.0f}" for s in res['matmul_peak']['shapes']) + ").",
        f"- RACE phases (median ms/step): rollout {ms(rp['rollout'])}, reward {ms(rp['reward'])}, "
        f"update {ms(rp['update'])}, adapter merge (sync) {ms(rp['sync'])}, other {ms(r['other_s'])}.",
        "- per-round medians (ms): RACE " + ", ".join(f"{1e3 * x:.1f}" for x in res["block_medians_s"]["race"])
        + "; TRL " + ", ".join(f"{1e3 * x:.1f}" for x in res["block_medians_s"]["trl"]) + "; per-round ratio "
        + ", ".join(f"{x / y:.2f}" for x, y in zip(res["block_medians_s"]["race"], res["block_medians_s"]["trl"]))
        + ".",
        "- load average (1/5/15 min) before and after each round: "
        + "; ".join("/".join(f"{x:.2f}" for x in la) for la in res["loadavg"]) + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per block (default 30)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (RACE block, TRL block) (default 3)")
    ap.add_argument("--threads", type=int, nargs="+", default=[2], help="torch thread counts to run (default 2)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps of each system per thread count")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="OUT", help="write all measurements (incl. per-step rows) here")
    a = ap.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import peft
    import torch
    import transformers
    import trl as trl_pkg

    torch.set_num_threads(a.threads[0])
    t0 = time.perf_counter()
    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "trl": trl_pkg.__version__, "peft": peft.__version__, "nproc": os.cpu_count(),
           "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
           "cpu": platform.processor() or platform.machine(), "loadavg_start": loadavg(),
           "command": " ".join([Path(sys.executable).name, *sys.argv])}
    with tempfile.TemporaryDirectory(prefix="race-bench-trl-") as out_dir:
        race = RaceRunner(a.seed)
        trl = TrlRunner(a.seed, out_dir)
        env["setup_s"] = time.perf_counter() - t0
        results = [compare(race, trl, threads=th, steps=a.steps, rounds=a.rounds, warmup=a.warmup)
                   for th in a.threads]
    env["loadavg_end"] = loadavg()
    env["total_s"] = time.perf_counter() - t0

    print(f"## RACE vs TRL: one LoRA GRPO step ({PROMPTS} prompts × {N_GEN} rollouts, ≤{MAX_COMPLETION} tokens, "
          f"LoRA r={RANK} on 7 modules, fp32 CPU)\n")
    print(f"torch {env['torch']}, transformers {env['transformers']}, trl {env['trl']}, peft {env['peft']}; "
          f"nproc {env['nproc']}; load average at start {env['loadavg_start']}, at end {env['loadavg_end']}; "
          f"TRL trainable params {trl.trainable:,} ({trl.dtype}); wall {env['total_s']:.0f} s "
          f"(setup {env['setup_s']:.1f} s).\n\ncommand: `{env['command']}`\n")
    for res in results:
        print(markdown(res))
        print()
    if a.json:
        Path(a.json).write_text(json.dumps({"env": env, "args": vars(a), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
