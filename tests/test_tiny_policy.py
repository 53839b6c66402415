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
    # 740,864 with a 15-token vocabulary (docs/tiny-models.md) + 8 more tokens × 128
    assert sum(p.numel() for p in model.parameters()) == 741_888


def test_tokenizer_one_id_per_character(tiny):
    tok, _ = tiny
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    # 23 characters and specials (the model's rows) and the newline, an added token past them (verl's
    # newline check; scripts/build_tiny_policy.py NEWLINE): no RACE prompt holds one
    assert tok.padding_side == "left" and len(tok) == 24
    assert tok("\n", add_special_tokens=False)["input_ids"] == [23] and tok.decode([23]) == "\n"
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
    from race.tasks.rewards import sparse, structured
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
    from race.tasks.rewards import sparse
    from race.tasks import load_task
    tok, model = tiny
    probs = load_task("arithmetic-hard", split="eval", n=200)
    texts = _completions(tok, model, [p.prompt for p in probs], sample=True, seed=0)
    assert sum(sparse(p.prompt, t, p.answer) for p, t in zip(probs, texts)) / len(probs) <= 0.1


SIZES = {"tiny-arith-s": (64, 186_624), "tiny-arith-l": (256, 2_958_336)}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_the_other_sizes_share_the_recipe_and_scale_the_parameters(name):
    """scripts/build_tiny_policy.py --size s / l: the same data, steps and batch (so the same
    training tokens) as tiny-arith; the width changes (≈ 0.25× and ≈ 4× the parameters) and the
    learning rate with it, as 1 / width."""
    folder = os.path.join(os.path.dirname(TINY_MODEL), name)
    width, params = SIZES[name]
    meta = json.load(open(os.path.join(folder, "race_meta.json"), encoding="utf-8"))
    base = json.load(open(os.path.join(TINY_MODEL, "race_meta.json"), encoding="utf-8"))
    assert {**meta["recipe"], "lr": None} == {**base["recipe"], "lr": None} and meta["size"] == name[-1]
    assert meta["recipe"]["lr"] == pytest.approx(base["recipe"]["lr"] * 128 / width)
    assert meta["parameters"] == params and meta["architecture"]["hidden_size"] == width
    assert 0.2 <= params / base["parameters"] <= 4.2
    cfg = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8"))
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["head_dim"], cfg["vocab_size"]) == (width, 3, 32, 23)
    assert sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)) < 13e6
    assert {"easy_sampled", "easy_greedy", "hard_sampled"} <= set(meta["accuracy"])


def test_the_default_size_builds_the_shipped_config():
    """--size m (the default) is the shipped tiny-arith's architecture, field for field."""
    mod = _builder()
    built = mod.build_config(23).to_dict()
    shipped = json.load(open(os.path.join(TINY_MODEL, "config.json"), encoding="utf-8"))
    skip = {"architectures", "transformers_version"}
    assert {k: v for k, v in shipped.items() if k not in skip} == {k: built[k] for k in shipped if k not in skip}


def _builder():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "build_tiny_policy", os.path.join(os.path.dirname(__file__), "..", "scripts", "build_tiny_policy.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_rebuilds_with_the_cpu_kernels_the_asset_records(tmp_path, monkeypatch):
    """The shipped assets record their CPU kernels; --check re-runs itself with the recorded ones
    (ATEN_CPU_CAPABILITY) when this machine would pick others, and says so in one line when even
    then it cannot (the re-run is captured here, not performed)."""
    mod = _builder()
    for name, cap in (("tiny-arith", "AVX2"), ("tiny-arith-s", "AVX512"), ("tiny-arith-l", "AVX512"),
                      ("tiny-arith-steps", "AVX2"), ("tiny-prm-s", "AVX2"), ("tiny-prm-l", "AVX2"),
                      ("tiny-reasoner", "AVX512")):
        meta = json.load(open(os.path.join(TINY_MODEL, "..", name, "race_meta.json"), encoding="utf-8"))
        assert meta["versions"]["cpu_capability"] == cap
    have = torch.backends.cpu.get_cpu_capability()
    same = tmp_path / "same.json"
    same.write_text(json.dumps({"versions": {"cpu_capability": have}}))
    mod.check_capability(str(same), ["--check"])                 # nothing to do: returns
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"versions": {"cpu_capability": "ZZZ"}}))
    calls = []
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(mod.os, "execve", lambda exe, args, env: calls.append((args, env["ATEN_CPU_CAPABILITY"])))
    mod.check_capability(str(other), ["--check", "--size", "s"])
    assert calls and calls[0][0][-3:] == ["--check", "--size", "s"] and calls[0][1] == "zzz"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "zzz")           # the re-run, still on other kernels
    with pytest.raises(SystemExit, match=f"built with ZZZ CPU kernels and this machine runs {have}"):
        mod.check_capability(str(other), ["--check"])


def test_check_rebuild_compares_the_rebuilt_weights_hash(tmp_path, capsys):
    """--check of every builder (policy, step policy, PRM, reasoner) goes through check_rebuild:
    exit 0 only when the rebuild's SHA-256 is the shipped one; an asset without recorded kernels
    gets the hint to try the other ones."""
    mod = _builder()
    have = torch.backends.cpu.get_cpu_capability()
    (tmp_path / "race_meta.json").write_text(json.dumps({"model_sha256": "abc", "versions": {"cpu_capability": have}}))
    folders = []
    assert mod.check_rebuild(str(tmp_path), lambda d: folders.append(d) or {"model_sha256": "abc"}, ["--check"]) == 0
    assert folders and folders[0] != str(tmp_path) and not os.path.exists(folders[0])   # a temporary folder, gone
    assert "== shipped abc" in capsys.readouterr().out
    assert mod.check_rebuild(str(tmp_path), lambda d: {"model_sha256": "abd"}, ["--check"]) == 1
    (tmp_path / "race_meta.json").write_text(json.dumps({"model_sha256": "abc", "versions": {}}))
    assert mod.check_rebuild(str(tmp_path), lambda d: {"model_sha256": "abd"}, ["--check"]) == 1
    assert "records no CPU capability: try again with ATEN_CPU_CAPABILITY=avx2" in capsys.readouterr().out
