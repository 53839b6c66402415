"""Build ``race/assets/tiny-arith-steps``: a character-level Qwen2 policy that half-knows
column addition written out in steps (the ``arithmetic-steps`` task, ``race/tasks/steps.py``).

    python scripts/build_tiny_step_policy.py                 # build into race/assets/tiny-arith-steps
    python scripts/build_tiny_step_policy.py --probe 100     # print sampled accuracy every 100 steps

Same tokenizer, architecture and recipe as ``scripts/build_tiny_policy.py`` (the 23-token
character vocabulary already holds ``;`` and ``+``), trained on ``prompt + worked solution +
EOS`` from the training split of ``arithmetic-steps`` (``47+85=`` → ``7+5+0=12;4+8+1=13;132``),
loss on the completion only, and stopped early on purpose so that sampled (T = 1)
final-answer accuracy is roughly a third: RL has room to improve it.

Deterministic (one thread, deterministic algorithms, seeded init and batches); the SHA-256 of
the weights is stored in ``race_meta.json``. ``--probe N`` evaluates every N steps on 200
held-out problems with its own generator, which leaves the training trajectory unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from build_tiny_policy import (CHARS, SPECIALS, _portable_tokenizer_config, add_newline_token,  # noqa: E402
                               build_config, build_tokenizer, check_rebuild, make_batch, optimizer_step,
                               write_meta)

from race.tasks.rewards.rules import sparse  # noqa: E402
from race.engine.backends.hf import cache_keyword, returned_cache  # noqa: E402
from race.tasks import load_task  # noqa: E402
from race.tasks.steps import process_score  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "race", "assets", "tiny-arith-steps")
TASK = "arithmetic-steps"
STEPS = 200             # optimizer steps: mid-way through the rise (probe: 0.17 at 150, 0.37 at 200, 0.58 at 250)
BATCH = 64
LR = 3e-3
WARMUP = 20
MAX_NEW_TOKENS = 24     # the longest solution, "9+9+0=18;9+9+1=19;198", is 21 characters + EOS


def train(model, tok, *, steps: int, seed: int, probe: int = 0) -> float:
    rng = random.Random(seed)
    data = [(p.prompt, p.meta["solution"]) for p in load_task(TASK, split="train")]
    probe_set = load_task(TASK, split="eval", n=200)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        batch = make_batch(tok, rng.sample(data, BATCH))
        loss = model(**batch).loss
        optimizer_step(model, loss, opt, sched)
        if probe and (step + 1) % probe == 0:
            model.eval()
            acc = accuracy(model, tok, probe_set, sample=True)
            model.train()
            print(f"step {step + 1:5d}  loss {loss.item():.4f}  sampled answer {acc['answer']:.3f} "
                  f"solution {acc['solution']:.3f} process {acc['process']:.3f}  "
                  f"{time.perf_counter() - start:6.1f} s", flush=True)
        elif step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f} s", flush=True)
    model.eval()
    return time.perf_counter() - start


@torch.no_grad()
def generate(model, tok, prompts: list[str], *, sample: bool, gen: torch.Generator | None = None) -> list[str]:
    """Completions (decoded with special tokens) by KV-cache decoding; sampling at T = 1 draws
    from ``gen`` only, so the global torch RNG is left alone."""
    enc = tok(prompts, return_tensors="pt", padding=True)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    key, past, pos = cache_keyword(model), None, (mask.cumsum(-1) - 1).clamp(min=0)
    out, done = [], torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(MAX_NEW_TOKENS):
        o = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{key: past})
        logits = o.logits[:, -1].float()
        nxt = (torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1) if sample
               else logits.argmax(-1))
        nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
        out.append(nxt)
        done |= nxt == tok.eos_token_id
        past, ids = returned_cache(o), nxt[:, None]
        mask = torch.cat([mask, torch.ones_like(ids)], 1)
        pos = pos[:, -1:] + 1
        if done.all():
            break
    return tok.batch_decode(torch.stack(out, 1), skip_special_tokens=False)


@torch.no_grad()
def accuracy(model, tok, problems, *, sample: bool, seed: int = 0, batch_size: int = 500) -> dict[str, float]:
    """Final-answer accuracy, whole-solution exact match and process score (share of right steps)."""
    gen = torch.Generator().manual_seed(seed)
    answer = solution = process = 0.0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        for t, p in zip(generate(model, tok, [p.prompt for p in chunk], sample=sample, gen=gen), chunk):
            answer += sparse(p.prompt, t, p.answer)
            solution += t.split(tok.eos_token)[0] == p.meta["solution"] and tok.eos_token in t
            process += process_score(p.prompt, t)
    n = len(problems)
    return {"answer": round(answer / n, 4), "solution": round(solution / n, 4), "process": round(process / n, 4)}


def build(out: str, *, steps: int = STEPS, seed: int = 0, threads: int = 1, probe: int = 0) -> dict:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    tok = build_tokenizer()
    assert tok("7+5=12;")["input_ids"] == [len(SPECIALS) + CHARS.index(c) for c in "7+5=12;"]
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(build_config(len(tok)))
    seconds = train(model, tok, steps=steps, seed=seed, probe=probe)
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    model.generation_config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    _portable_tokenizer_config(out)
    add_newline_token(out)                          # verl's newline check (build_tiny_policy.NEWLINE)
    for name in os.listdir(out):
        os.chmod(os.path.join(out, name), 0o644)
    tok2 = AutoTokenizer.from_pretrained(out)
    model2 = AutoModelForCausalLM.from_pretrained(out).eval()
    evals = load_task(TASK, split="eval")
    meta = {
        "task": TASK,
        "recipe": {"seed": seed, "steps": steps, "batch": BATCH, "lr": LR, "warmup": WARMUP,
                   "optimizer": "AdamW(betas=(0.9, 0.98), wd=0.01)", "threads": threads},
        "train_seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model2.parameters()),
        "accuracy": {"greedy": accuracy(model2, tok2, evals, sample=False),
                     "sampled": accuracy(model2, tok2, evals, sample=True, seed=0), "eval_problems": len(evals)},
        "accuracy_note": "held-out eval split of arithmetic-steps; answer = final answer right, solution = the "
                         "whole worked solution exactly right, process = share of right steps (race.tasks.steps); "
                         f"sampled = temperature 1.0, generator seed 0; max_new_tokens {MAX_NEW_TOKENS}",
    }
    return write_meta(out, meta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--probe", type=int, default=0, help="evaluate every N steps (0: never)")
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary folder and compare weight hashes with --out")
    args = ap.parse_args(argv)
    if args.check:
        return check_rebuild(args.out, lambda tmp: build(tmp, steps=args.steps, seed=args.seed, threads=args.threads),
                             argv, __file__)
    t0 = time.perf_counter()
    meta = build(args.out, steps=args.steps, seed=args.seed, threads=args.threads, probe=args.probe)
    print(json.dumps(meta, indent=2))
    print(f"built {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
