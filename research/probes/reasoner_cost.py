"""What a step of the tiny reasoner costs on this CPU, for a few model sizes (issue 18's probe).

    python research/probes/reasoner_cost.py                 # torch threads = 2, three sizes, markdown table
    python research/probes/reasoner_cost.py --threads 1 --repeats 3
    python research/probes/reasoner_cost.py --lean          # through race.engine.backends.lean.LeanLM + LoRA r 8, as pilots run

For each size (Qwen2, random weights, the word-problem tokenizer of
``scripts/build_tiny_reasoner.py``): the seconds of

- a GRPO-like step: 8 chat prompts × 8 samples of exactly ``--new-tokens`` tokens at T = 1
  (KV cache, prefix shared as in ``race.engine.backends.hf.sample``), then one forward + backward over
  the 64 sequences (prompt + completion, full fine-tuning) and an AdamW step;
- an SFT step: a batch of 32 chat-formatted worked solutions, forward + backward + AdamW.

With ``--lean`` the model runs through ``race.engine.backends.lean.LeanLM`` (merged weights for
sampling, LoRA rank 8 on every projection trained), the path pilots take on Llama-family models.
The median of ``--repeats`` timed runs after one warm-up run is reported.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

SIZES = {  # name: Qwen2 fields
    "h128-l2": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, intermediate_size=384),
    "h128-l3": dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=32, intermediate_size=512),          # race/tiny-reasoner's shape
    "h192-l4": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                    head_dim=32, intermediate_size=512),
    "h256-l4": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                    head_dim=32, intermediate_size=768),
}


def grpo_step(model, tok, prompts: list[str], *, n: int, new_tokens: int, opt) -> float:
    from race.engine.backends.hf import sample

    t0 = time.perf_counter()
    model.eval()
    if hasattr(model, "merge"):
        model.merge()
    ids = [tok.encode(p) for p in prompts]
    gen = torch.Generator().manual_seed(0)
    comps = sample(model, ids, n=n, max_new_tokens=new_tokens, eos_id=-1, pad_id=tok.pad_token_id, generator=gen)
    model.train()
    seqs = [p + c for p, group in zip(ids, comps) for c in group]
    width = max(map(len, seqs))
    x = torch.full((len(seqs), width), tok.pad_token_id)
    mask = torch.zeros_like(x)
    for i, s in enumerate(seqs):
        x[i, width - len(s):], mask[i, width - len(s):] = torch.tensor(s), 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=x, attention_mask=mask, position_ids=pos).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
    loss = -(logp[:, -new_tokens:]).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def sft_step(model, tok, pairs, opt) -> float:
    from build_tiny_reasoner import make_batch

    t0 = time.perf_counter()
    model.train()
    batch = make_batch(tok, pairs)
    labels = batch.pop("labels")
    logits = model(**batch).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=80)
    ap.add_argument("--sizes", default="h128-l2,h192-l4,h256-l4")
    ap.add_argument("--lean", action="store_true", help="LeanLM + LoRA r 8 (pilots' path) instead of HF full FT")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import Qwen2ForCausalLM

    from build_tiny_reasoner import build_config, build_tokenizer, chat_prompt
    from race.tasks import load_task

    tok = build_tokenizer()
    problems = load_task("word-problems", split="train", n=64)
    rng = random.Random(0)
    prompts = [chat_prompt(tok, p.prompt) for p in problems[:8]]
    pairs = [(chat_prompt(tok, p.prompt), p.meta["solution"]) for p in rng.sample(problems, 32)]
    print(f"{'LeanLM + LoRA r 8' if args.lean else 'HF, full fine-tuning'}, threads {args.threads}, vocab {len(tok)}, GRPO: 8 prompts x 8 samples x {args.new_tokens} tokens + "
          f"fwd/bwd; SFT: batch 32; median of {args.repeats}\n")
    print("| size | parameters | GRPO-like step (s) | of which sampling (s) | SFT step (s) |")
    print("|---|---|---|---|---|")
    for name in args.sizes.split(","):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(build_config(tok, **SIZES[name]))
        params = sum(p.numel() for p in model.parameters())
        if args.lean:
            from race.engine.backends.lean import LeanLM

            model = LeanLM(model, rank=8, alpha=16, seed=0, targets=("q_proj", "k_proj", "v_proj", "o_proj",
                                                                     "gate_proj", "up_proj", "down_proj"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        g, s, gen = [], [], []
        for r in range(args.repeats + 1):
            from race.engine.backends.hf import sample
            t0 = time.perf_counter()
            model.eval()
            if args.lean:
                model.merge()
            sample(model, [tok.encode(p) for p in prompts], n=8, max_new_tokens=args.new_tokens, eos_id=-1,
                   pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(r))
            gen.append(time.perf_counter() - t0)
            g.append(grpo_step(model, tok, prompts, n=8, new_tokens=args.new_tokens, opt=opt))
            s.append(sft_step(model, tok, pairs, opt))
        med = lambda xs: statistics.median(xs[1:])  # noqa: E731  (first run is the warm-up)
        print(f"| {name} | {params / 1e6:.2f} M | {med(g):.2f} | {med(gen):.2f} | {med(s):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
