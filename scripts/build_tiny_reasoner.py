"""Build ``race/assets/tiny-reasoner``: a tiny Qwen2 chat policy that writes worked solutions
to word problems (``race/tasks/wordproblems.py``) and ends them with ``#### N``, like a
GSM8K-tuned Qwen2.5 in miniature.

    python scripts/build_tiny_reasoner.py                    # build into race/assets/tiny-reasoner
    python scripts/build_tiny_reasoner.py --target 0 --steps 2000   # no stop rule: a fixed step count
    python scripts/build_tiny_reasoner.py --write-data race/assets/word-problems   # the JSONL files only

What it writes (``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``, no remote code):

- a byte-level BPE tokenizer trained here with ``tokenizers`` on the generator's text, with
  Qwen2's pipeline (NFC, Qwen2's split regex, which puts every digit in a piece of its own,
  then ByteLevel), special tokens ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>``
  (EOS, the end of a turn) and a ChatML ``chat_template`` (system / user / assistant; the
  generation prompt is ``<|im_start|>assistant\\n``);
- ``config.json`` + ``generation_config.json`` + ``model.safetensors`` (Qwen2, float32);
- ``race_meta.json``: recipe, training seconds, parameter count, accuracies (greedy and T = 1
  on the ``word-problems`` eval split and on ``word-problems-downstream``), mean completion
  lengths, the weights' SHA-256 and the library versions.

Recipe: supervised next-token training on chat-formatted training problems of
``word-problems`` (plus a share of ``word-problems-hard``), half of them with the system
prompt ``SYSTEM``; the loss covers the assistant turn and its ``<|im_end|>`` only. Training
stops on purpose early (the stop rule: sampled accuracy on 200 *training* problems reaches
``TARGET``, checked every ``CHECK_EVERY`` steps), which lands sampled accuracy on the easy
held-out split in 20–50 %, so RL has room to improve it. ``race_meta.json`` also covers
``word-problems-hard``'s eval split.

Deterministic: one thread, ``torch.use_deterministic_algorithms``, seeded init and batches; the
learning rate is constant after warm-up, so the model after N steps does not depend on the
total, and the stop rule's checks sample with their own generator (the training trajectory is
unchanged): ``--target 0 --steps N`` with N the recorded step count rebuilds the same weights.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import statistics
import sys
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from build_tiny_policy import make_batch  # noqa: E402  (left-padded prompt + solution + EOS, labels on the solution)
from race.engine.backends.hf import cache_keyword  # noqa: E402
from race.tasks import load_task  # noqa: E402
from race.tasks.wordproblems import write_gsm8k, write_math  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "race", "assets", "tiny-reasoner")
DATA_OUT = os.path.join(ROOT, "race", "assets", "word-problems")
TASK, HARD, DOWNSTREAM = "word-problems", "word-problems-hard", "word-problems-downstream"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]       # ids 0, 1, 2
PAD, EOS = "<|endoftext|>", "<|im_end|>"
SYSTEM = "Solve the problem step by step. Write the final answer after ####."
# Qwen2's pre-tokenizer split (transformers' Qwen2Tokenizer): \p{N} makes every digit a piece.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# ChatML as Qwen2.5 writes it, without Qwen's default system message and tool calls.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
VOCAB = 1024            # an upper bound: the generator's text saturates below it
MAX_POSITIONS = 512

# The recipe (docs/tiny-models.md says how it was chosen).
ARCH = {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 512}
MAX_STEPS = 3000        # an upper bound: training stops at the first check that reaches TARGET
CHECK_EVERY = 100       # steps between checks of the stop rule
CHECK_PROBLEMS = 200    # training problems the stop rule samples (never the held-out splits)
TARGET = 0.30           # stop once sampled (T = 1) accuracy on those reaches this
BATCH = 32
LR = 3e-3
WARMUP = 50
HARD_SHARE = 0.1        # share of each batch from word-problems-hard (longer chains, larger numbers)
SYSTEM_SHARE = 0.5      # share of training conversations with the system prompt
MAX_NEW_TOKENS = 200
EVAL_PROBLEMS = 500     # first N of each held-out split (fixed order) for race_meta.json


# ------------------------------------------------------------------------------ tokenizer

def corpus() -> list[str]:
    """The tokenizer's training text: questions and solutions of every word-problem split
    (both answer formats), the system prompt and the chat roles."""
    texts = [SYSTEM, "system\nuser\nassistant\n"]
    for name in (TASK, HARD, DOWNSTREAM):
        for split in ("train", "eval"):
            for p in load_task(name, split=split)[:4000]:
                texts += [p.prompt, p.meta["solution"], f"{p.meta['work']}\n#### {p.answer}"]
    return texts


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE over ``corpus()`` with Qwen2's normaliser, split and decoder."""
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=None, bos_token=None,
        additional_special_tokens=["<|im_start|>"], padding_side="left", model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE)


def _portable_tokenizer_config(out: str) -> None:
    """Name the generic fast-tokenizer class (transformers 4.x and 5.x resolve it) and keep the
    chat template in tokenizer_config.json, where every version looks for it."""
    path = os.path.join(out, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    jinja = os.path.join(out, "chat_template.jinja")
    if os.path.exists(jinja):
        os.remove(jinja)


# ------------------------------------------------------------------------------ model and data

def build_config(tok, **arch) -> Qwen2Config:
    a = {**ARCH, **arch}
    return Qwen2Config(
        vocab_size=len(tok), max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
        rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu", bos_token_id=tok.convert_tokens_to_ids(PAD),
        eos_token_id=tok.convert_tokens_to_ids(EOS), pad_token_id=tok.convert_tokens_to_ids(PAD), use_cache=True,
        dtype="float32", **a)


def chat_prompt(tok, question: str, system: bool = False) -> str:
    """The conversation up to the assistant's turn, as the chat template writes it."""
    messages = ([{"role": "system", "content": SYSTEM}] if system else []) + [{"role": "user", "content": question}]
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)



def training_pairs(tok, name: str, rng: random.Random) -> list[tuple[str, str]]:
    """(chat prompt, GSM8K-style solution) of every training problem of ``name``; the system
    prompt on a ``SYSTEM_SHARE`` of them, drawn once from ``rng``."""
    return [(chat_prompt(tok, p.prompt, system=rng.random() < SYSTEM_SHARE), p.meta["solution"])
            for p in load_task(name, split="train")]


# ------------------------------------------------------------------------------ evaluation

_ANSWER = re.compile(r"####\s*(-?\d+)")


def extract_answer(completion: str) -> int | None:
    """The integer after the first ``####`` before the end of turn (None when there is none)."""
    m = _ANSWER.search(completion.split(EOS)[0])
    return int(m.group(1)) if m else None


@torch.no_grad()
def generate(model, tok, prompts: list[str], *, sample: bool, gen: torch.Generator | None = None,
             max_new_tokens: int = MAX_NEW_TOKENS) -> tuple[list[str], list[int]]:
    """(completions decoded with special tokens, token counts up to and including EOS) by
    KV-cache decoding; sampling at T = 1 draws from ``gen`` only."""
    from transformers import DynamicCache

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    kv = {cache_keyword(model): DynamicCache()}
    out, done = [], torch.zeros(len(prompts), dtype=torch.bool)
    lengths = torch.zeros(len(prompts), dtype=torch.long)
    for _ in range(max_new_tokens):
        o = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kv)
        logits = o.logits[:, -1].float()
        nxt = (torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).squeeze(1) if sample
               else logits.argmax(-1))
        nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
        lengths += (~done).long()
        out.append(nxt)
        done |= nxt == tok.eos_token_id
        ids = nxt[:, None]
        mask = torch.cat([mask, torch.ones_like(ids)], 1)
        pos = pos[:, -1:] + 1
        if done.all():
            break
    return tok.batch_decode(torch.stack(out, 1), skip_special_tokens=False), lengths.tolist()


@torch.no_grad()
def accuracy(model, tok, problems, *, sample: bool, seed: int = 0, batch_size: int = 250) -> dict[str, float]:
    """Final-answer accuracy (``#### N`` equals the answer), share of completions that end
    their turn, and mean completion length in tokens."""
    gen = torch.Generator().manual_seed(seed)
    right = ended = 0
    lengths: list[int] = []
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        texts, lens = generate(model, tok, [chat_prompt(tok, p.prompt) for p in chunk], sample=sample, gen=gen)
        for t, p in zip(texts, chunk):
            right += extract_answer(t) == int(p.answer)
            ended += EOS in t
        lengths += lens
    n = len(problems)
    return {"accuracy": round(right / n, 4), "ended": round(ended / n, 4),
            "mean_tokens": round(statistics.mean(lengths), 1)}


# ------------------------------------------------------------------------------ training

def optimizer_step(model, loss: torch.Tensor, opt, sched) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def train(model, tok, *, steps: int, seed: int, target: float = TARGET, every: int = CHECK_EVERY,
          log: list | None = None) -> tuple[float, int]:
    """Train until the stop rule holds (sampled accuracy on ``CHECK_PROBLEMS`` training problems
    reaches ``target``, checked every ``every`` steps) or ``steps`` steps; returns (training
    seconds without the checks, steps taken). ``target`` 0 never stops early. The checks
    sample from their own generator, so they leave the training trajectory unchanged."""
    rng = random.Random(seed)
    easy, hard = training_pairs(tok, TASK, rng), training_pairs(tok, HARD, rng)
    check_set = load_task(TASK, split="train", n=CHECK_PROBLEMS, seed=seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        n_hard = sum(rng.random() < HARD_SHARE for _ in range(BATCH))
        batch = make_batch(tok, rng.sample(easy, BATCH - n_hard) + rng.sample(hard, n_hard))
        loss = model(**batch).loss
        optimizer_step(model, loss, opt, sched)
        if every and (step + 1) % every == 0:
            model.eval()
            t0 = time.perf_counter()
            s = accuracy(model, tok, check_set, sample=True)
            model.train()
            start += time.perf_counter() - t0           # checks do not count as training time
            row = {"step": step + 1, "loss": round(loss.item(), 4), "sampled": s["accuracy"],
                   "mean_tokens": s["mean_tokens"], "ended": s["ended"],
                   "seconds": round(time.perf_counter() - start, 1), "check_seconds": round(time.perf_counter() - t0, 1)}
            if log is not None:
                log.append(row)
            print(json.dumps(row), flush=True)
            if target and s["accuracy"] >= target:
                break
        elif step % 50 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f} s", flush=True)
    model.eval()
    return time.perf_counter() - start, step + 1


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_data(out: str, *, n_train: int = 2000, n_eval: int = 500) -> dict[str, int]:
    """Sample files of the three splits: ``train.jsonl`` and ``eval.jsonl`` (GSM8K style, from
    ``word-problems``) and ``downstream.jsonl`` (MATH-500 style, ``word-problems-downstream``'s
    eval split). Returns rows written per file."""
    os.makedirs(out, exist_ok=True)
    return {"train.jsonl": write_gsm8k(load_task(TASK, split="train", n=n_train), os.path.join(out, "train.jsonl")),
            "eval.jsonl": write_gsm8k(load_task(TASK, split="eval", n=n_eval), os.path.join(out, "eval.jsonl")),
            "downstream.jsonl": write_math(load_task(DOWNSTREAM, split="eval", n=n_eval),
                                           os.path.join(out, "downstream.jsonl"))}


def build(out: str, *, steps: int = MAX_STEPS, seed: int = 0, threads: int = 1, target: float = TARGET,
          every: int = CHECK_EVERY, eval_problems: int = EVAL_PROBLEMS) -> dict:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    tok = build_tokenizer()
    tok_seconds = time.perf_counter() - t0
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(build_config(tok))
    checks: list[dict] = []
    seconds, taken = train(model, tok, steps=steps, seed=seed, target=target, every=every, log=checks)
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))
    model.generation_config.update(bos_token_id=model.config.bos_token_id, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tok.backend_tokenizer.no_padding()      # the checks padded batches: keep that state out of tokenizer.json
    tok.save_pretrained(out)
    _portable_tokenizer_config(out)
    for name in os.listdir(out):
        os.chmod(os.path.join(out, name), 0o644)
    tok2 = AutoTokenizer.from_pretrained(out)
    model2 = AutoModelForCausalLM.from_pretrained(out).eval()
    t1 = time.perf_counter()
    acc = {}
    for key, name in (("eval", TASK), ("hard", HARD), ("downstream", DOWNSTREAM)):
        problems = load_task(name, split="eval", n=eval_problems)
        acc[key] = {"task": name, "problems": len(problems),
                    "greedy": accuracy(model2, tok2, problems, sample=False),
                    "sampled": accuracy(model2, tok2, problems, sample=True, seed=0)}
    meta = {
        "task": TASK,
        "architecture": {"model_type": "qwen2", **ARCH, "vocab_size": len(tok2),
                         "max_position_embeddings": MAX_POSITIONS, "tie_word_embeddings": True},
        "tokenizer": {"type": "byte-level BPE (Qwen2 split: one digit a token)", "vocab_size": len(tok2),
                      "specials": SPECIALS, "eos": EOS, "pad": PAD, "seconds": round(tok_seconds, 1)},
        "recipe": {"seed": seed, "steps": taken, "max_steps": steps, "stop_rule": f"sampled accuracy on "
                   f"{CHECK_PROBLEMS} training problems >= {target}, checked every {every} steps",
                   "batch": BATCH, "lr": LR, "warmup": WARMUP,
                   "schedule": "linear warm-up, then constant", "hard_share": HARD_SHARE,
                   "system_share": SYSTEM_SHARE, "system": SYSTEM, "loss": "assistant turn + <|im_end|> only",
                   "optimizer": "AdamW(betas=(0.9, 0.98), wd=0.01), grad clip 1.0", "threads": threads},
        "train_seconds": round(seconds, 1),
        "checks": checks,
        "eval_seconds": round(time.perf_counter() - t1, 1),
        "parameters": sum(p.numel() for p in model2.parameters()),
        "accuracy": acc,
        "accuracy_note": f"first {eval_problems} problems of each held-out split, user turn only (no system "
                         "prompt); right = the integer after '####' equals the answer; ended = <|im_end|> "
                         f"produced; mean_tokens counts up to and including <|im_end|>; max_new_tokens "
                         f"{MAX_NEW_TOKENS}; sampled = temperature 1.0, torch.Generator seed 0",
    }
    meta = {**meta, "model_sha256": sha256(os.path.join(out, "model.safetensors")),
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                         "tokenizers": __import__("tokenizers").__version__,
                         "cpu_capability": torch.backends.cpu.get_cpu_capability()}}
    with open(os.path.join(out, "race_meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=MAX_STEPS, help="at most this many steps")
    ap.add_argument("--target", type=float, default=TARGET, help="stop rule's sampled accuracy (0: run all steps)")
    ap.add_argument("--every", type=int, default=CHECK_EVERY, help="steps between stop-rule checks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-problems", type=int, default=EVAL_PROBLEMS, help="held-out problems per split in race_meta")
    ap.add_argument("--write-data", metavar="DIR", nargs="?", const=DATA_OUT,
                    help=f"write the sample JSONL files (default {os.path.relpath(DATA_OUT, ROOT)}) and stop")
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary folder and compare weight hashes with --out")
    args = ap.parse_args(argv)
    if args.check:
        from build_tiny_policy import check_rebuild

        return check_rebuild(args.out, lambda tmp: build(tmp, steps=args.steps, seed=args.seed, threads=args.threads,
                                                         target=args.target, every=args.every,
                                                         eval_problems=args.eval_problems), argv, __file__)
    if args.write_data:
        print(json.dumps(write_data(args.write_data)))
        return 0
    t0 = time.perf_counter()
    meta = build(args.out, steps=args.steps, seed=args.seed, threads=args.threads, target=args.target,
                 every=args.every, eval_problems=args.eval_problems)
    print(json.dumps(meta, indent=2))
    print(f"built {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
