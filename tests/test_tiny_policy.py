"""The shipped tiny policy loads the ordinary Hugging Face way and half-knows addition."""
import json
import os
import random

import pytest

from conftest import TINY_MODEL

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CHARS = "0123456789+-*=,; |c"


@pytest.fixture(scope="module")
def tiny():
    tok = transformers.AutoTokenizer.from_pretrained(TINY_MODEL)
    model = transformers.AutoModelForCausalLM.from_pretrained(TINY_MODEL).eval()
    return tok, model


def test_assets_are_small_and_described():
    names = set(os.listdir(TINY_MODEL))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "race_meta.json"} <= names
    assert sum(os.path.getsize(os.path.join(TINY_MODEL, n)) for n in names) < 5e6
    meta = json.load(open(os.path.join(TINY_MODEL, "race_meta.json"), encoding="utf-8"))
    assert meta["parameters"] == 741_888 and meta["recipe"]["seed"] == 0
    assert 0.25 <= meta["accuracy"]["easy_sampled"] <= 0.45
    assert meta["accuracy"]["hard_sampled"] <= 0.1


def test_model_shape(tiny):
    _, model = tiny
    cfg = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.max_position_embeddings) == (128, 3, 4, 2, 32, 512, 64)
    assert cfg.tie_word_embeddings and cfg.vocab_size == 23
    # 740,864 with a 15-token vocabulary (REFERENCES.md) + 8 more tokens × 128
    assert sum(p.numel() for p in model.parameters()) == 741_888


def test_tokenizer_one_id_per_character(tiny):
    tok, _ = tiny
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "left" and len(tok) == 23
    assert tok("12+34=")["input_ids"] == [5, 6, 14, 7, 8, 17]
    raw = __import__("tokenizers").Tokenizer.from_file(os.path.join(TINY_MODEL, "tokenizer.json"))
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(CHARS) for _ in range(rng.randint(1, 24)))
        ids = tok(text)["input_ids"]
        assert ids == [4 + CHARS.index(c) for c in text] == raw.encode(text).ids
        assert tok.decode(ids) == text
    assert tok.decode([5, 14, 6, 17, 7, 2, 0]) == "1+2=3</s><pad>"
    assert tok.decode([5, 14, 6, 17, 7, 2, 0], skip_special_tokens=True) == "1+2=3"


def _completions(tok, model, prompts, *, sample, seed=0):
    torch.manual_seed(seed)
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=sample, temperature=1.0 if sample else None, top_k=None,
                             top_p=None, max_new_tokens=6, pad_token_id=tok.pad_token_id)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=False)


def test_sampled_accuracy_leaves_room_for_rl(tiny):
    from race.rewards import sparse, structured
    from race.tasks import load_task
    tok, model = tiny
    probs = load_task("arithmetic-easy", split="eval", n=200)
    texts = _completions(tok, model, [p.prompt for p in probs], sample=True, seed=0)
    acc = sum(sparse(p.prompt, t, p.answer) for p, t in zip(probs, texts)) / len(probs)
    assert 0.15 <= acc <= 0.6, acc
    greedy = _completions(tok, model, [p.prompt for p in probs], sample=False)
    g_acc = sum(sparse(p.prompt, t, p.answer) for p, t in zip(probs, greedy)) / len(probs)
    assert acc < g_acc < 0.8, (acc, g_acc)
    # The policy has learnt the format: digits then EOS (structured reward ≥ 0.2).
    formed = sum(structured(p.prompt, t, p.answer) >= 0.2 for p, t in zip(probs, greedy)) / len(probs)
    assert formed > 0.9, formed


def test_hard_split_is_hard(tiny):
    from race.rewards import sparse
    from race.tasks import load_task
    tok, model = tiny
    probs = load_task("arithmetic-hard", split="eval", n=200)
    texts = _completions(tok, model, [p.prompt for p in probs], sample=True, seed=0)
    assert sum(sparse(p.prompt, t, p.answer) for p, t in zip(probs, texts)) / len(probs) <= 0.1
