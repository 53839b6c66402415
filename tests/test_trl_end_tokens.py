"""TRL's recipe for a policy whose tokenizer is not on the emitting machine (issue 51): a Hub id outside
the local cache at ``race recipe … --emit`` time. The emitted race_reward.py then carries no end-of-turn
ids (``END_TOKENS`` empty) and reads them at its first call from the tokenizer of the policy as the
trainer loads it (``MODEL``, from the cache the trainer's download filled), so TRL's reward still puts back
the marker TRL decodes away; where that tokenizer cannot be loaded either, the reward stops in one line
instead of scoring without the marker.

The Hub id is one RACE knows the architecture of without a download (Qwen/Qwen2.5-0.5B-Instruct: its
shipped config); the cache the trainer would have filled holds, under that id, the shipped reasoner's
tokenizer files (nothing is downloaded), so the scores can be checked against RACE's reward on the
reasoner's ids."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from conftest import ROOT
from race.fullrun.recipes import recipe
from test_trainer_runs import REASONER, TRL_CHECK

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"
TOKENIZER = os.path.join(ROOT, "race", "assets", "tiny-reasoner")


def _fill_cache(cache, repo: str, folder: str) -> None:
    """A Hugging Face hub cache holding ``folder``'s files (its weights left out) as ``repo``'s snapshot:
    what the trainer's download of the policy leaves before its first reward call."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in os.listdir(folder):
        if f.endswith(".json") or f.endswith(".jinja"):
            shutil.copy(os.path.join(folder, f), snapshot / f)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("0" * 40)


def _emit_without_the_tokenizer(tmp_path, monkeypatch):
    """The reasoner's TRL recipe for HUB_ID, emitted with an empty hub cache: its tokenizer is not readable."""
    import huggingface_hub.constants

    from race.config.configfile import config_from_dict
    from race.fullrun.reward_file import end_tokens
    from race.stats.results import load_results

    empty = tmp_path / "emit-cache"
    empty.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(empty))
    assert end_tokens(HUB_ID) == {}                          # not on this machine at emit time
    cfg = replace(config_from_dict(load_results(REASONER).config), model=HUB_ID)
    out = tmp_path / "emit"
    rec = recipe(cfg, trainer="trl", rho=0.5, full_run_budget=1e13, emit_dir=str(out))
    assert rec.model["model_name_or_path"] == HUB_ID and not (out / "model").exists()
    return cfg, out


def _trl_call(tmp_path, out, cache, flat, texts, completion_ids) -> subprocess.CompletedProcess:
    """race_reward.reward through TRL 1.16's GRPOTrainer._calculate_rewards, without RACE, offline, with
    ``cache`` as the hub cache (test_trainer_runs.TRL_CHECK)."""
    payload = json.dumps({"reward_file": str(out / "race_reward.py"),
                          "inputs": [{"prompt": row["prompt"], "answer": row["answer"]} for row, _, _ in flat],
                          "prompts": [row["prompt"] for row, _, _ in flat],
                          "completions": [[{"role": "assistant", "content": t}] for t in texts],
                          "completion_ids": completion_ids})
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "HF_HOME", "HF_HUB_CACHE")}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, "-I", "-c", TRL_CHECK, payload], cwd=str(tmp_path), capture_output=True,
                          text=True, env=env, timeout=600)


def test_a_hub_policy_outside_the_cache_at_emit_time_scores_as_race_from_the_trainers_tokenizer(tmp_path,
                                                                                                  monkeypatch):
    """Emitted with the policy's tokenizer unreadable, race_reward.py carries END_TOKENS = {} and MODEL = the
    Hub id. Called by TRL's own _calculate_rewards where the trainer has the policy in its cache, it reads
    the end ids from that tokenizer (its EOS, <|im_end|>) and scores what RACE's reward scores on the same
    ids decoded with special tokens kept: per row a right finished answer 1.0, a wrong finished one 0.1
    (the format term), a right one cut off 0.9, a right one only math-verify reads 1.0, an empty one 0.0.
    With an empty cache there too, the reward stops with one line naming the policy."""
    pytest.importorskip("trl")
    pytest.importorskip("math_verify")
    from transformers import AutoTokenizer

    from race.tasks import load_task
    from race.tasks.rewards import build_reward

    cfg, out = _emit_without_the_tokenizer(tmp_path, monkeypatch)
    text = (out / "race_reward.py").read_text()
    assert "\nEND_TOKENS = {}\n" in text and f"\nMODEL = {HUB_ID!r}\n" in text
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [json.loads(x) for x in (out / "data" / "train.jsonl").read_text().splitlines()[:2]]
    by_prompt = {p.prompt: p for p in load_task(cfg.task, split="train")}
    problems = [by_prompt[row["prompt"][-1]["content"]] for row in rows]

    def solution(answer):
        return tok(f"The total is {answer}.\n#### {answer}", add_special_tokens=False)["input_ids"]

    sampled = [[solution(p.answer) + [eos, pad], solution(int(p.answer) + 1) + [eos], solution(p.answer),
                solution(f"{int(p.answer) - 1}+1") + [eos], [eos, pad]] for p in problems]
    flat = [(row, p, c) for row, p, group in zip(rows, problems, sampled) for c in group]
    completion_ids = [c[:c.index(eos) + 1] if eos in c else list(c) for _, _, c in flat]
    texts = tok.batch_decode(completion_ids, skip_special_tokens=True)
    reward = build_reward(cfg)
    want = [float(reward(p.prompt, tok.decode(c, skip_special_tokens=False), p.answer)) for _, p, c in flat]
    assert want[:5] == [1.0, 0.1, 0.9, 1.0, 0.0]

    cache = tmp_path / "trainer-cache"
    _fill_cache(cache, HUB_ID, TOKENIZER)
    r = _trl_call(tmp_path, out, cache, flat, texts, completion_ids)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["end_tokens"] == {str(eos): tok.eos_token}
    assert got["rewards"] == pytest.approx(want, abs=1e-6)

    empty = tmp_path / "no-cache"
    empty.mkdir()
    r = _trl_call(tmp_path, out, empty, flat, texts, completion_ids)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]             # the exception's message: one line
    assert last.startswith(f"RuntimeError: race_reward.py: the end-of-turn ids of {HUB_ID!r} were not known at "
                           "emit time and its tokenizer cannot be loaded here (OSError: "), r.stderr[-3000:]
    assert "use_tokenizer" in last
