"""Build RACE's tiny policy, ``race/assets/tiny-arith``: a character-level Qwen2 model that
half-knows two-digit addition, in plain Hugging Face format.

    python scripts/build_tiny_policy.py            # build into race/assets/tiny-arith
    python scripts/build_tiny_policy.py --out DIR --steps 400 --seed 0
    python scripts/build_tiny_policy.py --size s   # the ~0.25x size, into race/assets/tiny-arith-s
    python scripts/build_tiny_policy.py --size l   # the ~4x size, into race/assets/tiny-arith-l

What it writes (all loadable by ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained``,
no ``trust_remote_code``): ``tokenizer.json`` + ``tokenizer_config.json`` (one token per
character, left padding), ``config.json`` + ``generation_config.json`` + ``model.safetensors``
(float32), and ``race_meta.json`` (recipe, training time, measured accuracies, weight hash).

Recipe: supervised next-token training with plain AdamW on the *training* split of
``arithmetic-easy`` plus a small share of ``arithmetic-hard`` (prompt + answer + EOS, loss
on the answer and EOS only), stopped early on purpose: the base policy should be right
about a third of the time when sampled at temperature 1, so that RL has room to improve it.

Sizes (``--size``): ``m`` is the shipped ``tiny-arith`` (0.74 M parameters); ``s`` (~0.25x,
half the width) and ``l`` (~4x, twice the width) are the same recipe on the same data for the
same number of steps (so the same training tokens); the width changes, and with it the AdamW
learning rate, as 1/width (muP's rule for hidden matrices, anchored at m's 3e-3: s 6e-3, l 1.5e-3;
with m's rate the 4x model ends its 925 steps at 5 % sampled accuracy, docs/models.md). They feed
the model-size x rho grid (docs/models.md). The default size builds byte-identical weights and
metadata to before sizes existed; the other sizes add ``size`` and ``architecture`` to
``race_meta.json``.

Deterministic: one CPU thread, ``torch.use_deterministic_algorithms``, seeded model init,
batches and sampling. Two runs on the same machine give byte-identical weights (the
SHA-256 of ``model.safetensors`` is stored in ``race_meta.json``; ``--check`` rebuilds in a
temporary folder and compares). Across machines one more thing matters: the vector width of
PyTorch's CPU kernels (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, ...), which
changes the order of float sums. The shipped ``tiny-arith`` was built with AVX2 kernels and an
AVX512 machine builds other weights from the same code (0.09 instead of 0.35 sampled accuracy:
training stops mid-way through a steep rise, so rounding grows); ``race_meta.json`` records the
capability (``versions.cpu_capability``), and ``--check`` rebuilds with the recorded one
(``ATEN_CPU_CAPABILITY``, which must be set before torch loads, so the check re-runs itself).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config,
                          Qwen2ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from race.tasks import load_task  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "race", "assets", "tiny-arith")
# Width per size; depth (3 layers), head width (32) and vocabulary are shared, so parameters
# scale with the square of the width: s ~ 0.25x, l ~ 4x of m.
SIZES = {
    "s": {"hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1},
    "m": {"hidden_size": 128, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2},
    "l": {"hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 4},
}
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]          # ids 0, 1, 2, 3
# Digits and operators of the arithmetic tasks, plus the punctuation a later step-by-step
# task needs (',', ';', ' ', '|', 'c' for "carry").
CHARS = list("0123456789") + list("+-*=") + list(",; |c")

# The recipe (see docs/tiny-models.md for how it was chosen).
STEPS = 925             # optimizer steps: stops mid-way through the jump from ~10 % to ~90 %
BATCH = 64              # sequences per step
LR = 3e-3               # AdamW peak learning rate, linear warm-up then constant
WARMUP = 20
HARD_SHARE = 0.05       # share of each batch drawn from arithmetic-hard's training split


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer with one token per character; no BOS/EOS added on encode.

    Characters are stored in their byte-level form (space as "Ġ", as in GPT-2 / Qwen
    vocabularies) behind a ByteLevel pre-tokenizer and decoder. Why: transformers 5 loads
    any ``model_type: qwen2`` folder through ``Qwen2Tokenizer``, which rebuilds the
    pipeline as byte-level BPE over this vocabulary (no merges); with byte-level names it
    gives exactly the ids of this WordLevel model, so both paths agree.
    """
    names = [c if c != " " else "\u0120" for c in CHARS]   # "Ġ": the byte-level form of a space
    vocab = {tok: i for i, tok in enumerate(SPECIALS + names)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("."), behavior="isolated"),           # one piece per character
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        padding_side="left", model_max_length=64, clean_up_tokenization_spaces=False)


def build_config(vocab_size: int, size: str = "m") -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size, **SIZES[size], num_hidden_layers=3, head_dim=32, max_position_embeddings=64,
        tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
        bos_token_id=1, eos_token_id=2, pad_token_id=0, use_cache=True, dtype="float32")


def make_batch(tok, pairs: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Left-padded ``prompt + answer + EOS`` with labels on the answer and EOS only.

    Left padding and positions counted from the first real token match what
    ``generate`` does with a left-padded batch.
    """
    seqs, labels = [], []
    for prompt, answer in pairs:
        p, a = tok.encode(prompt), tok.encode(answer) + [tok.eos_token_id]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    lab = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, l) in enumerate(zip(seqs, labels)):
        ids[i, width - len(s):], lab[i, width - len(s):], mask[i, width - len(s):] = \
            torch.tensor(s), torch.tensor(l), 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "labels": lab}


def optimizer_step(model, loss: torch.Tensor, opt, sched) -> None:
    """One AdamW step of the asset builders: backward, gradients of ``model`` clipped to norm 1,
    step, learning-rate schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def size_lr(size: str) -> float:
    """Peak learning rate of a size: ``LR`` at m's width, scaled as 1 / width (muP for Adam)."""
    return LR * SIZES["m"]["hidden_size"] / SIZES[size]["hidden_size"]


def train(model, tok, *, steps: int, seed: int, lr: float = LR) -> float:
    """Supervised training; returns wall seconds."""
    rng = random.Random(seed)
    easy = [(p.prompt, p.answer) for p in load_task("arithmetic-easy", split="train")]
    hard = [(p.prompt, p.answer) for p in load_task("arithmetic-hard", split="train", seed=seed)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        n_hard = sum(rng.random() < HARD_SHARE for _ in range(BATCH))
        batch = make_batch(tok, rng.sample(easy, BATCH - n_hard) + rng.sample(hard, n_hard))
        loss = model(**batch).loss
        optimizer_step(model, loss, opt, sched)
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  {time.perf_counter() - start:6.1f} s", flush=True)
    model.eval()
    return time.perf_counter() - start


@torch.no_grad()
def accuracy(model, tok, problems, *, sample: bool, seed: int = 0, max_new_tokens: int = 6,
             batch_size: int = 500) -> float:
    """Share of problems whose completion (up to EOS) equals the answer; temperature 1 when sampling."""
    torch.manual_seed(seed)
    correct = 0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        enc = tok([p.prompt for p in chunk], return_tensors="pt", padding=True)
        out = model.generate(**enc, do_sample=sample, temperature=1.0 if sample else None, top_p=None,
                             top_k=None, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id)
        texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=False)
        correct += sum(t.split(tok.eos_token)[0] == p.answer and tok.eos_token in t
                       for t, p in zip(texts, chunk))
    return correct / len(problems)


def measure(model, tok) -> dict[str, float]:
    out = {}
    for task in ("arithmetic-easy", "arithmetic-hard"):
        problems = load_task(task, split="eval")
        key = task.split("-")[1]
        out[f"{key}_greedy"] = round(accuracy(model, tok, problems, sample=False), 4)
        out[f"{key}_sampled"] = round(accuracy(model, tok, problems, sample=True, seed=0), 4)
        out[f"{key}_eval_problems"] = len(problems)
    return out


# The chat template a trainer applies to a prompt (verl always does; TRL and OpenRLHF on request): the
# user turns' text as it is, nothing around it, which is the format RACE's pilots feed the policy, so a
# trainer's rendering of a prompt tokenizes exactly as RACE's does (tests/test_trainer_runs.py).
# A system turn is left out (this policy never saw one); no generation prompt is added.
CHAT_TEMPLATE = ("{%- for message in messages -%}{%- if message['role'] == 'user' -%}"
                 "{{- message['content'] -}}{%- endif -%}{%- endfor -%}")


def _portable_tokenizer_config(out: str) -> None:
    """Name the generic fast-tokenizer class, which transformers 4.x and 5.x both resolve
    (5.x writes its own alias, ``TokenizersBackend``, unknown to 4.x), and carry the chat template."""
    path = os.path.join(out, "tokenizer_config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


# verl 0.9.1 picks its rollout's token builder by config.json's model_type, and for qwen2 that builder
# requires "\n" to tokenize to exactly one id (it inserts it after a turn's end in multi-turn rollouts:
# verl/utils/tokenizer/continuous_token.py). These policies never see a newline: RACE's prompts and chat
# template have none. So the newline is an added token at the first id past the model's rows, not a
# character of the vocabulary: the model's vocab_size, its weights, every other string's ids and every id
# the model can emit decode as before (tests/test_tiny_policy.py, tests/test_trainer_runs.py).
NEWLINE = "\n"


def add_newline_token(out: str) -> int:
    """Add ``NEWLINE`` to the saved ``out/tokenizer.json`` as a plain (not special) added token, at the id
    after the highest one; return that id. Idempotent: an existing newline token keeps its id."""
    path = os.path.join(out, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    added = data["added_tokens"]
    for t in added:
        if t["content"] == NEWLINE:
            return t["id"]
    new_id = max([*data["model"]["vocab"].values(), *(t["id"] for t in added)]) + 1
    added.append({"id": new_id, "content": NEWLINE, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": False})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
    return new_id


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def build(out: str, *, steps: int = STEPS, seed: int = 0, threads: int = 1, size: str = "m") -> dict:
    """Build the tokenizer and model into ``out``; returns the metadata written."""
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    tok = build_tokenizer()
    assert tok("12+34=")["input_ids"] == [len(SPECIALS) + CHARS.index(c) for c in "12+34="]
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(build_config(len(tok), size))
    seconds = train(model, tok, steps=steps, seed=seed, lr=size_lr(size))
    os.makedirs(out, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "race_meta.json"):
        if os.path.exists(os.path.join(out, name)):
            os.remove(os.path.join(out, name))
    model.generation_config.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    _portable_tokenizer_config(out)
    add_newline_token(out)                          # after the model is sized: an id past its rows
    for name in os.listdir(out):
        os.chmod(os.path.join(out, name), 0o644)     # safetensors writes 0600
    # Measure the saved artefact through the path users take.
    tok2 = AutoTokenizer.from_pretrained(out)
    model2 = AutoModelForCausalLM.from_pretrained(out).eval()
    sized = {} if size == "m" else {
        "size": size, "architecture": {**SIZES[size], "num_hidden_layers": 3, "head_dim": 32},
        "tokens_note": f"same data, steps and batch as tiny-arith (m): {steps} x {BATCH} sequences; "
                       "learning rate 3e-3 x 128 / width"}
    meta = {
        **sized,
        "recipe": {"seed": seed, "steps": steps, "batch": BATCH, "lr": size_lr(size), "warmup": WARMUP,
                   "hard_share": HARD_SHARE, "optimizer": "AdamW(betas=(0.9, 0.98), wd=0.01)",
                   "threads": threads},
        "train_seconds": round(seconds, 1),
        "parameters": sum(p.numel() for p in model2.parameters()),
        "accuracy": measure(model2, tok2),
        "accuracy_note": "exact match up to EOS on the held-out eval split (all problems); "
                         "sampled = temperature 1.0, torch seed 0; max_new_tokens 6",
    }
    return write_meta(out, meta)


def write_meta(out: str, meta: dict) -> dict:
    """Write ``out/race_meta.json``: ``meta`` plus the weights' sha256, the library versions and the
    CPU kernels' capability (the builds' float sums depend on it; see the module docstring)."""
    meta = {**meta, "model_sha256": sha256(os.path.join(out, "model.safetensors")),
            "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                         "cpu_capability": torch.backends.cpu.get_cpu_capability()}}
    with open(os.path.join(out, "race_meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def check_capability(meta_path: str, argv: list[str] | None, script: str = __file__) -> None:
    """Before a ``--check`` rebuild: run with the CPU kernels the asset was built with. When the
    recorded capability is not the active one, run this script again with ``ATEN_CPU_CAPABILITY``
    set (torch reads it once, when it loads); when the machine cannot provide it, exit 2 saying so.
    Assets without a record are checked with whatever this machine picks. ``script``: the builder
    to run again (this one by default)."""
    want = json.load(open(meta_path, encoding="utf-8")).get("versions", {}).get("cpu_capability")
    have = torch.backends.cpu.get_cpu_capability()
    if not want or want == have:
        return
    if os.environ.get("ATEN_CPU_CAPABILITY", "").upper() == want.upper():
        raise SystemExit(f"{meta_path} was built with {want} CPU kernels and this machine runs {have} "
                         f"even with ATEN_CPU_CAPABILITY={want.lower()}: its weights cannot be rebuilt bit "
                         "for bit here")
    print(f"the asset was built with {want} CPU kernels (this machine picks {have}): checking with "
          f"ATEN_CPU_CAPABILITY={want.lower()}", file=sys.stderr, flush=True)
    args = sys.argv[1:] if argv is None else list(argv)
    os.execve(sys.executable, [sys.executable, os.path.abspath(script), *args],
              {**os.environ, "ATEN_CPU_CAPABILITY": want.lower()})


def check_rebuild(out: str, rebuild: Any, argv: list[str] | None, script: str = __file__) -> int:
    """``--check`` of any builder: rebuild with ``rebuild(folder) -> meta`` into a temporary folder,
    with the CPU kernels ``out`` records (``check_capability``), and compare the weights' SHA-256
    with ``out``'s; 0 when they are equal."""
    check_capability(os.path.join(out, "race_meta.json"), argv, script)
    shipped = json.load(open(os.path.join(out, "race_meta.json"), encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        got = rebuild(tmp)["model_sha256"]
    same = got == shipped["model_sha256"]
    kernels = torch.backends.cpu.get_cpu_capability()
    hint = "" if same or shipped.get("versions", {}).get("cpu_capability") else (
        f"; {out} records no CPU capability: try again with ATEN_CPU_CAPABILITY=avx2 (or avx512) set")
    print(f"{out}: rebuilt sha256 {got} {'==' if same else '!='} shipped {shipped['model_sha256']} "
          f"({kernels} kernels){hint}")
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None,
                    help="output folder (default: race/assets/tiny-arith, or tiny-arith-SIZE for --size s / l)")
    ap.add_argument("--size", choices=sorted(SIZES), default="m",
                    help="model width: m = the shipped tiny-arith, s ~ 0.25x, l ~ 4x the parameters")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: reproducible across machines)")
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary folder and compare weight hashes with --out")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = DEFAULT_OUT if args.size == "m" else f"{DEFAULT_OUT}-{args.size}"
    if args.check:
        return check_rebuild(args.out, lambda tmp: build(tmp, steps=args.steps, seed=args.seed, threads=args.threads,
                                                         size=args.size), argv)
    t0 = time.perf_counter()
    meta = build(args.out, steps=args.steps, seed=args.seed, threads=args.threads, size=args.size)
    print(json.dumps(meta, indent=2))
    print(f"built {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
