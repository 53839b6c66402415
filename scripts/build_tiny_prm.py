"""Build RACE's tiny process reward models, ``race/assets/tiny-prm-s`` and ``tiny-prm-l``:
character-level Qwen2 token classifiers that judge each step of an ``arithmetic-steps``
solution, in the Qwen2.5-Math-PRM convention (``<extra_0>`` after every step, 2 labels,
step score = positive-class probability at the step token).

    python scripts/build_tiny_prm.py                 # both sizes
    python scripts/build_tiny_prm.py --size s        # one of them

Labels come from the rule (``race.tasks.steps.step_labels``). Each batch of 64 is half the
step policy's own samples at T = 1 on training-split problems (one per problem, drawn once: its
natural mistakes, mostly a sum off by one and a wrong final answer) and half canonical
solutions of training-split problems with 0–2 corrupted steps (``race.tasks.steps.corrupted_steps``:
wrong sums, carries, digits, answers), drawn fresh for every batch. Loss: cross-entropy at the
step tokens, plus auxiliary targets on every other completion token (1 while the step so far is
a prefix of the canonical step; the canonical character at that place, through a training-only
head), AdamW with warm-up and cosine decay. Held-out step-classification AUC against the rule
is measured on evaluation-split problems (never trained on), separately for corrupted solutions
and for the step policy's own samples, and written to ``race_meta.json``.

Sizes (hidden 128 like the policy): ``s`` = 4 layers from random weights (≈ 0.99 M parameters,
1.3× the policy), 2,400 steps; ``l`` = 12 layers (≈ 2.96 M, 4× the policy), started from the
trained ``tiny-prm-s`` (its 4 layers and head) with 8 more layers that start as identities
(their ``o_proj`` and ``down_proj`` zeroed: depth up-scaling), then 600 steps more; ``l`` exists
so that scoring every rollout takes a large share of a pilot's FLOPs. Deterministic like the
policy builds (one thread, deterministic algorithms, seeded init and data).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time

import torch
from transformers import Qwen2ForTokenClassification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from build_tiny_policy import (_portable_tokenizer_config, build_config, build_tokenizer,  # noqa: E402
                               check_rebuild, optimizer_step, write_meta)
from build_tiny_step_policy import generate  # noqa: E402

from race.tasks.rewards.prm import STEP_TOKEN, ProcessRewardModel, roc_auc  # noqa: E402
from race.tasks import load_task  # noqa: E402
from race.tasks.steps import canonical_steps, corrupted_steps, parse_prompt, split_steps, step_labels  # noqa: E402

ASSETS = os.path.join(ROOT, "race", "assets")
POLICY = os.path.join(ASSETS, "tiny-arith-steps")
TASK = "arithmetic-steps"
SIZES = {   # the policy's width; s: 4 layers, l: tiny-prm-s's 4 layers + 8 that start as identities
    "s": {"num_hidden_layers": 4, "steps": 2400},
    "l": {"num_hidden_layers": 12, "steps": 600},
}
BATCH, LR, WARMUP, LR_FLOOR = 64, 2e-3, 50, 0.1   # cosine decay to LR_FLOOR · LR after the warm-up
AUX_WEIGHT = 1.0        # weight of the per-token auxiliary labels
INIT_FROM_POLICY = False  # s from random weights (starting from the step policy's: lower AUC on its own samples)
FREEZE_POLICY = False   # with INIT_FROM_POLICY: train the policy's layers too (freezing them learned slower)
POOL_SHARE = 0.5        # share of each batch taken from the step policy's own samples on training prompts
DATA_NOTE = ("half of each batch: the step policy's own samples at T=1 on training problems (one per problem, drawn "
             "once); the other half: canonical solutions of training problems with 0-2 corrupted steps, fresh "
             "every batch; labels from race.tasks.steps.step_labels; losses: step tokens + per-token right/wrong "
             "+ canonical character")


def prm_tokenizer():
    """The policy's character tokenizer plus the step token ``<extra_0>`` (id 23)."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [STEP_TOKEN]})
    tok.padding_side = "right"
    return tok


def prm_config(size: str, vocab_size: int):
    cfg = build_config(vocab_size)
    cfg.num_hidden_layers = SIZES[size]["num_hidden_layers"]
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    cfg.num_labels = 2
    cfg.id2label, cfg.label2id = {0: "wrong", 1: "right"}, {"wrong": 0, "right": 1}
    cfg.classifier_dropout = 0.0
    return cfg


def init_from_prm(model, path: str) -> None:
    """Start ``tiny-prm-l`` from a trained ``tiny-prm-s``: its embedding, layers, norm and head;
    the layers beyond its depth start as identities (depth up-scaling: at step 0 the larger
    model computes exactly the smaller one's scores). Everything is trained."""
    small = Qwen2ForTokenClassification.from_pretrained(path).state_dict()
    depth = sum(1 for k in small if k.endswith("input_layernorm.weight"))
    own = model.state_dict()
    with torch.no_grad():
        for k, v in small.items():
            own[k].copy_(v)
        for layer in model.model.layers[depth:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()


def init_from_policy(model) -> None:
    """Start the PRM's body from the step policy (as Qwen2.5-Math-PRM starts from a math
    policy): its embedding rows (the step token keeps its random row) and its layers; the
    layers beyond the policy's depth start as identities (o_proj and down_proj zeroed, so
    they add nothing to the residual stream until trained). The head starts random."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(POLICY).model.state_dict()
    body = model.model
    with torch.no_grad():
        body.embed_tokens.weight[:policy["embed_tokens.weight"].shape[0]] = policy["embed_tokens.weight"]
        body.norm.weight.copy_(policy["norm.weight"])
        depth = sum(1 for k in policy if k.endswith("input_layernorm.weight"))
        for i, layer in enumerate(body.layers):
            if i < depth:
                layer.load_state_dict({k.split(f"layers.{i}.", 1)[1]: v for k, v in policy.items()
                                       if k.startswith(f"layers.{i}.")})
    if FREEZE_POLICY:
        body.embed_tokens.requires_grad_(False)      # the policy's layers stay as they are: their next-token
        for layer in body.layers[:depth]:            # features (what each step should say) are what the
            layer.requires_grad_(False)              # trainable layers compare the written step with

def policy_samples(prompts: list[str], *, seed: int, per_prompt: int = 1) -> list[tuple[str, str]]:
    """(prompt, completion) samples of the shipped step policy at T = 1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(POLICY)
    model = AutoModelForCausalLM.from_pretrained(POLICY).eval()
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(per_prompt):
        for i in range(0, len(prompts), 500):
            chunk = prompts[i:i + 500]
            out += list(zip(chunk, generate(model, tok, chunk, sample=True, gen=gen)))
    return out


def corrupted(prompts: list[str], rng: random.Random) -> list[tuple[str, str]]:
    return [(p, ";".join(corrupted_steps(*parse_prompt(p), rng)) + "</s>") for p in prompts]


def encode(tok, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Right-padded ``prompt + step<extra_0>…`` with three kinds of targets:

    - ``labels``: the rule's label of each step at its step token (what the PRM is read for);
    - ``token_labels``: every other completion token: 1 while the step written so far is a
      prefix of the canonical step (``race.tasks.steps``), else 0 — *where* a step goes wrong;
    - ``canon``: every completion token: the canonical character at that place of the step
      (fixed-width steps line up), whatever was written there — the model must work out the
      right digit itself, a 10-way target as rich as the policy's next-token loss.
    """
    sep = tok.convert_tokens_to_ids(STEP_TOKEN)
    rows = []
    for prompt, completion in pairs:
        steps = split_steps(completion)
        want = canonical_steps(*parse_prompt(prompt))
        ids = tok.encode(prompt)
        lab, tl, canon = [-100] * len(ids), [-100] * len(ids), [-100] * len(ids)
        for i, (step, right) in enumerate(zip(steps, step_labels(prompt, completion))):
            last = i == len(steps) - 1
            target = want[-1] if last else (want[i] if i < len(want) - 1 else "")
            chars = tok.encode(step)
            ids += chars + [sep]
            tl += [int(target.startswith(step[:k + 1])) for k in range(len(chars))] + [-100]
            lab += [-100] * len(chars) + [int(right)]
            canon += [tok.convert_tokens_to_ids(target[k]) if k < len(target) else -100
                      for k in range(len(chars))] + [-100]
        rows.append((ids, lab, tl, canon))
    width = max(len(r[0]) for r in rows)
    batch = {"input_ids": torch.full((len(rows), width), tok.pad_token_id),
             "attention_mask": torch.zeros((len(rows), width), dtype=torch.long)}
    for key in ("labels", "token_labels", "canon"):
        batch[key] = torch.full((len(rows), width), -100)
    for i, (s, l, t, c) in enumerate(rows):
        batch["input_ids"][i, :len(s)] = torch.tensor(s)
        batch["attention_mask"][i, :len(s)] = 1
        for key, v in (("labels", l), ("token_labels", t), ("canon", c)):
            batch[key][i, :len(s)] = torch.tensor(v)
    return batch


def loss_fn(model, batch, canon_head=None) -> torch.Tensor:
    """Cross-entropy at the step tokens + AUX_WEIGHT × (the per-token right/wrong labels + the
    canonical-character targets through ``canon_head``, a training-only Linear(h, vocab))."""
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    logits = model.score(hidden)
    ce = torch.nn.functional.cross_entropy
    step = ce(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    token = ce(logits.flatten(0, 1), batch["token_labels"].flatten(), ignore_index=-100)
    aux = token
    if canon_head is not None:
        aux = aux + ce(canon_head(hidden).flatten(0, 1), batch["canon"].flatten(), ignore_index=-100)
    return step + AUX_WEIGHT * aux


@torch.no_grad()
def probe_auc(model, tok, pairs: list[tuple[str, str]]) -> float:
    """Step AUC on ``pairs`` with the model in training (a progress signal; no RNG used)."""
    batch = encode(tok, pairs)
    model.eval()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    model.train()
    at = batch["labels"] != -100
    return roc_auc(torch.softmax(logits[at], -1)[:, 1].tolist(), batch["labels"][at].tolist())


def train(model, tok, pool: list[tuple[str, str]], prompts: list[str], *, steps: int, seed: int,
          probe: list[tuple[str, str]] | None = None) -> float:
    rng = random.Random(seed)
    canon_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size)   # training only
    params = [p for p in model.parameters() if p.requires_grad] + list(canon_head.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    def lr_factor(s: int) -> float:
        if s < WARMUP:
            return (s + 1) / WARMUP
        done = (s - WARMUP) / max(1, steps - WARMUP)
        return LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1 + math.cos(math.pi * done))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    model.train()
    start = time.perf_counter()
    n_pool = int(BATCH * POOL_SHARE) if pool else 0
    for step in range(steps):   # policy samples (POOL_SHARE) and freshly corrupted canonical solutions
        pairs = rng.sample(pool, n_pool) + corrupted(rng.sample(prompts, BATCH - n_pool), rng)
        loss = loss_fn(model, encode(tok, pairs), canon_head)
        optimizer_step(model, loss, opt, sched)
        if step % 100 == 0 or step == steps - 1:
            auc = f"  held-out AUC {probe_auc(model, tok, probe):.4f}" if probe else ""
            print(f"step {step:5d}  loss {loss.item():.4f}{auc}  {time.perf_counter() - start:6.1f} s", flush=True)
    model.eval()
    return time.perf_counter() - start


def heldout_auc(prm: ProcessRewardModel, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """AUC of the PRM's step scores against the rule's labels, and accuracy at 0.5."""
    scores, _ = prm.step_scores([p for p, _ in pairs], [c for _, c in pairs])
    y, s = [], []
    for (prompt, completion), sc in zip(pairs, scores):
        labels = step_labels(prompt, completion)
        assert len(labels) == len(sc), (prompt, completion, sc)
        y += labels
        s += sc
    acc = sum((x >= 0.5) == bool(t) for x, t in zip(s, y)) / len(y)
    return {"auc": round(roc_auc(s, y), 4), "accuracy": round(acc, 4), "steps": len(y),
            "right_share": round(sum(y) / len(y), 4)}


def build(size: str, out: str, *, seed: int = 0, threads: int = 1, steps: int | None = None) -> dict:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    steps = steps or SIZES[size]["steps"]
    tok = prm_tokenizer()
    train_prompts = [p.prompt for p in load_task(TASK, split="train")]
    eval_prompts = [p.prompt for p in load_task(TASK, split="eval")]
    t0 = time.perf_counter()
    pool = policy_samples(train_prompts, seed=seed) if POOL_SHARE > 0 else []
    sample_seconds = time.perf_counter() - t0
    torch.manual_seed(seed)
    model = Qwen2ForTokenClassification(prm_config(size, len(tok)))
    if size == "l":
        init_from_prm(model, os.path.join(ASSETS, "tiny-prm-s"))
    elif INIT_FROM_POLICY:
        init_from_policy(model)
    probe = corrupted(eval_prompts[:200], random.Random(99)) + policy_samples(eval_prompts[200:400], seed=99)
    seconds = train(model, tok, pool, train_prompts, steps=steps, seed=seed, probe=probe)
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    _portable_tokenizer_config(out)
    for name in os.listdir(out):
        os.chmod(os.path.join(out, name), 0o644)
    prm = ProcessRewardModel(out, step_separator=";")          # through from_pretrained, as users load it
    held_policy = policy_samples(eval_prompts, seed=10_000 + seed, per_prompt=2)
    held_corrupt = corrupted(eval_prompts * 2, random.Random(10_000 + seed))
    meta = {
        "task": TASK, "size": size, "convention": "Qwen2.5-Math-PRM: <extra_0> after each step, "
        "P(label 1 = right) at the step tokens",
        "recipe": {"seed": seed, "steps": steps, "batch": BATCH, "lr": LR, "warmup": WARMUP,
                   "lr_schedule": f"linear warm-up, cosine decay to {LR_FLOOR} x lr", "threads": threads,
                   "data": DATA_NOTE, "pool_share": POOL_SHARE, "aux_weight": AUX_WEIGHT,
                   "init": "tiny-prm-s + identity layers" if size == "l" else
                   ("step policy" if INIT_FROM_POLICY else "random")},
        "sample_seconds": round(sample_seconds, 1), "train_seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "heldout": {"policy_samples": heldout_auc(prm, held_policy),
                    "corrupted": heldout_auc(prm, held_corrupt),
                    "all": heldout_auc(prm, held_policy + held_corrupt)},
        "heldout_note": f"evaluation split of {TASK} ({len(eval_prompts)} prompts, never trained on): two policy "
                        "samples (generator seed 10000) and two corrupted solutions (random.Random(10000)) per prompt",
    }
    return write_meta(out, meta)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["s", "l", "both"], default="both")
    ap.add_argument("--out", default=None, help="output folder (one size only; default race/assets/tiny-prm-SIZE)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check", action="store_true",
                    help="rebuild each size in a temporary folder and compare weight hashes with the shipped one")
    args = ap.parse_args(argv)
    if args.check:
        return max(check_rebuild(args.out or os.path.join(ASSETS, f"tiny-prm-{size}"),
                                 lambda tmp, size=size: build(size, tmp, seed=args.seed, threads=args.threads,
                                                              steps=args.steps), argv, __file__)
                   for size in (["s", "l"] if args.size == "both" else [args.size]))
    for size in (["s", "l"] if args.size == "both" else [args.size]):
        t0 = time.perf_counter()
        out = args.out or os.path.join(ASSETS, f"tiny-prm-{size}")
        meta = build(size, out, seed=args.seed, threads=args.threads, steps=args.steps)
        print(json.dumps(meta, indent=2))
        print(f"built {out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
