"""Probe PRM training recipes: the experiments behind the "(probe)" rows of docs/prm.md.

    python research/probes/prm_recipe_probe.py --pool 0.5 --init policy --steps 2400
    python research/probes/prm_recipe_probe.py --pool 0.5 --init random --steps 2400

Trains a 4-layer tiny PRM with scripts/build_tiny_prm.py's data, losses and optimizer but a
constant learning rate after warm-up (the recipe before the shipped one added cosine decay),
and prints every 200 steps the step AUC on two probe sets from the evaluation split: corrupted
solutions of 400 problems (``cor``) and the step policy's samples on 400 problems (``pol``).
Nothing is saved unless --out is given. One thread by default.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import Qwen2ForTokenClassification

    import build_tiny_prm as B
    from build_tiny_policy import optimizer_step
    from race.tasks import load_task

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=float, default=0.5, help="share of each batch from policy samples")
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--init", choices=["policy", "random"], default="random")
    ap.add_argument("--lr", type=float, default=B.LR)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    train_prompts = [p.prompt for p in load_task(B.TASK, split="train")]
    eval_prompts = [p.prompt for p in load_task(B.TASK, split="eval")]
    pool = B.policy_samples(train_prompts, seed=0)
    probe_pol = B.policy_samples(eval_prompts[:400], seed=777)
    probe_cor = B.corrupted(eval_prompts[:400], random.Random(99))
    tok = B.prm_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForTokenClassification(B.prm_config("s", len(tok)))
    if a.init == "policy":
        B.init_from_policy(model)
    rng = random.Random(0)
    canon_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size)
    opt = torch.optim.AdamW(list(model.parameters()) + list(canon_head.parameters()), lr=a.lr,
                            betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / B.WARMUP))
    n_pool = int(B.BATCH * a.pool)
    t0 = time.perf_counter()
    model.train()
    for step in range(a.steps):
        pairs = rng.sample(pool, n_pool) + B.corrupted(rng.sample(train_prompts, B.BATCH - n_pool), rng)
        loss = B.loss_fn(model, B.encode(tok, pairs), canon_head)
        optimizer_step(model, loss, opt, sched)
        if step % 200 == 0 or step == a.steps - 1:
            print(f"step {step} loss {loss.item():.3f} cor {B.probe_auc(model, tok, probe_cor):.4f} "
                  f"pol {B.probe_auc(model, tok, probe_pol):.4f} {time.perf_counter() - t0:.0f}s", flush=True)
    if a.out:
        model.save_pretrained(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
