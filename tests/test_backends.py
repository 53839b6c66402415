"""Backend choice (auto | hf | vllm), the HF backend's device/dtype selection, gradient
checkpointing on the peft path, and the micro-batched update — all on CPU."""
import pytest

import race.engine.backends as B
from race.run.api import build_config
from race.config import presets


@pytest.mark.parametrize("installed, cuda, expected", [(True, True, "vllm"), (True, False, "hf"),
                                                       (False, True, "hf"), (False, False, "hf")])
def test_auto_is_vllm_only_with_the_package_and_a_gpu(monkeypatch, installed, cuda, expected):
    monkeypatch.setattr(B, "vllm_installed", lambda: installed)
    monkeypatch.setattr(B, "cuda_available", lambda: cuda)
    assert B.resolve_backend("auto") == expected
    assert B.resolve_backend("hf") == "hf"


def test_vllm_without_the_package_is_a_clear_user_error(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from race.run.cli import main

    monkeypatch.setattr(B, "vllm_installed", lambda: False)
    with pytest.raises(ValueError, match="backend 'vllm' needs the vllm package"):
        B.resolve_backend("vllm")
    r = CliRunner().invoke(main, ["pilot", "--backend", "vllm", "--out", str(tmp_path / "o"), "--quiet"])
    assert r.exit_code == 2 and "Error: backend 'vllm' needs the vllm package" in r.output
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_backend_registry_is_lazy():
    import subprocess
    import sys

    code = ("import sys, race.engine.backends as b\n"
            "assert set(b.BACKENDS) == {'hf', 'vllm'}\n"
            "print(','.join(m for m in ('vllm', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
    assert B.backend_class("hf").__name__ == "HFBackend"
    with pytest.raises(ValueError, match="unknown"):
        B.backend_class("sglang")


def test_report_names_the_backend_that_produced_the_pilots():
    from dataclasses import replace

    from race.stats.report import render_diagnosis
    from test_report import _diag

    diag = replace(_diag(), meta={"model": "m", "backend": "vllm"})
    assert "backend: vllm" in render_diagnosis(diag, "text")
    assert "backend: vllm" in render_diagnosis(diag, "md")


def test_device_dtype_selection():
    import torch

    from race.engine.loading import model_load_kwargs

    assert model_load_kwargs("cuda") == {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}
    assert model_load_kwargs("cuda:1")["dtype"] == torch.bfloat16
    assert model_load_kwargs("cpu") == {"dtype": torch.float32, "attn_implementation": "sdpa"}


def test_hf_sampling_copy_takes_the_policy_dtype():
    """The merged sampling copy of the peft path is in the policy's dtype (bf16 on CUDA)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import TINY_MODEL
    from race.engine.backends.hf import HFBackend

    model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.bfloat16)
    policy = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    backend = HFBackend(policy, AutoTokenizer.from_pretrained(TINY_MODEL), model_path=TINY_MODEL)
    assert backend.sampler is not policy and backend.sampler.dtype == torch.bfloat16
    assert backend.sampler.config._attn_implementation == "sdpa"
    batch = backend.generate(["12+34="], n=3, max_new_tokens=4, seed=0)
    assert len(batch.completion_ids[0]) == 3


def _cfg(**grpo):
    return build_config({**presets.DEFAULT, "grpo": {**presets.DEFAULT["grpo"], **grpo}})


def _layer_calls(policy, batch, **kw):
    """Forward calls of layer 0's q_proj during one update: 2 per iteration when checkpointing
    recomputes the layer in backward (the layer's own post-forward hook would not fire then:
    non-reentrant recomputation stops once the saved tensors exist again)."""
    import torch

    from race.engine import grpo

    calls = []
    layer = next(m for n, m in policy.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
    h = layer.register_forward_hook(lambda *a: calls.append(1))
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-3)
    grpo.update(policy, opt, batch, mu=1, temperature=1.0, clip_eps=0.2, loss_agg="dapo", max_completion_len=6, **kw)
    h.remove()
    return len(calls)


def _batch():
    from race.engine import grpo

    return grpo.pack([[4, 5, 6], [7, 8]], [[9, 2], [10, 11, 2], [12, 2], [9, 9, 2]], [0, 0, 1, 1],
                     [1.0, -1.0, 0.5, -0.5], 0)


def test_grad_checkpointing_is_honoured_on_the_peft_path():
    """grpo.grad_checkpointing: the policy is HF + peft with non-reentrant checkpointing (the lean
    path has none), so each layer's forward is recomputed in backward, as the FLOP meter counts."""
    from peft import PeftModel

    from race.engine.backends.lockstep import LockstepLM
    from race.engine.loading import load_policy

    def checkpointing(policy):          # the property's name from transformers 5.25 on, else the old one
        hf = policy.base_model.model
        new = hasattr(type(hf), "is_activation_checkpointing")
        return hf.is_activation_checkpointing if new else hf.is_gradient_checkpointing

    _, ckpt, _ = load_policy(_cfg(grad_checkpointing=True))
    assert isinstance(ckpt, PeftModel) and checkpointing(ckpt) and ckpt.training
    _, plain, _ = load_policy(_cfg(fast_path=False))
    assert isinstance(plain, PeftModel) and not checkpointing(plain)
    assert isinstance(load_policy(_cfg())[1], LockstepLM)
    assert _layer_calls(ckpt, _batch()) == 2
    assert _layer_calls(plain, _batch()) == 1
    from race.flops.grid import shares_prefix

    assert not shares_prefix(_cfg(grad_checkpointing=True)) and shares_prefix(_cfg())


def test_the_peft_path_loads_without_transformers_deprecation_warning():
    """peft 0.21.2's PeftModel reads transformers' is_gradient_checkpointing, which 5.25 deprecates with a
    FutureWarning in every pilot process's output; load_policy keeps that one warning out, and only it."""
    import warnings

    from race.engine.loading import load_policy

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_policy(_cfg(fast_path=False))
        warnings.warn("another FutureWarning", FutureWarning)
    messages = [str(w.message) for w in caught]
    assert not any("is_gradient_checkpointing" in m for m in messages)
    assert "another FutureWarning" in messages


@pytest.mark.parametrize("loss_agg", ["dapo", "grpo", "dr_grpo"])
def test_micro_batched_update_equals_the_full_batch(loss_agg):
    """grpo.micro_batch splits the update into whole prompt groups and accumulates: same step."""
    import torch

    from race.engine import grpo
    from race.config.configfile import GridConfig
    from race.engine.loading import load_policy

    cfg = GridConfig(model="race/tiny-arith", budget=1e12)
    results = []
    for micro in (None, 2):
        torch.manual_seed(0)
        _, policy, _ = load_policy(cfg)
        with torch.no_grad():
            for name, p in policy.adapters[0].items():       # the lean policy: a group of one seed
                if name.endswith("_B"):
                    p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
        # SGD: the step is the gradient itself (Adam's g/|g| would magnify float noise of ~0 gradients)
        opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
        stats = grpo.update_seeds(policy, [opt], [_batch()], mu=2, temperature=1.0, clip_eps=0.2,
                                  loss_agg=loss_agg, max_completion_len=6, micro_batch=micro, beta=0.01)[0]
        results.append(({k: v.detach().clone() for k, v in policy.adapters[0].items()}, stats))
    (full, s_full), (micro, s_micro) = results
    assert len(grpo.micro_batches(_batch(), 2)) == 2
    for k in full:
        assert torch.allclose(full[k], micro[k], atol=1e-6), (k, float((full[k] - micro[k]).abs().max()))
    assert s_micro.loss == pytest.approx(s_full.loss, abs=1e-6)


def test_unmerged_adapter_sampling_is_metered_at_2_n_plus_n_lora():
    """FLOP parity: a backend that samples through the unmerged adapter (vLLM) is metered at
    2·(N + N_lora) per token it feeds, one that merges (HF) at 2·N."""
    from race.flops import formulas as F
    from race.engine.backends.vllm import VLLMBackend
    from race.flops.catalog import load_arch
    from race.flops.meter import FlopMeter

    assert VLLMBackend.sampling_uses_adapter is True
    arch, lora = load_arch("Qwen/Qwen2.5-1.5B-Instruct"), F.LoRASpec(rank=8)
    on, off = FlopMeter(arch, lora, sampling_uses_adapter=True), FlopMeter(arch, lora, sampling_uses_adapter=False)
    prompts, completions = [6, 9], [[4, 3], [1, 5, 2]]
    fed = sum(prompts) + sum(c - 1 for group in completions for c in group)     # prefill + decode inputs
    diff = on.search(prompts, completions) - off.search(prompts, completions)
    assert diff == pytest.approx(2 * F.lora_param_count(arch, lora) * fed, rel=1e-9)


def test_vllm_gpu_memory_share_comes_from_the_memory_plan(monkeypatch):
    """On a GPU, vLLM's gpu_memory_utilization is its weights + one rollout batch's KV cache from
    race.flops.memory, as a fraction of the device; nothing is passed on CPU or to the HF backend."""
    import types

    import torch

    from race.flops.grid import plan_grid
    from race.flops.memory import schedule_memory, vllm_memory_fraction
    from race.engine.loading import backend_options

    cfg = build_config({**presets.DEFAULT, "model": "Qwen/Qwen2.5-1.5B-Instruct", "backend": "vllm",
                        "grpo": {**presets.DEFAULT["grpo"], "max_completion_len": 1024}, "budget": 5e16,
                        "lengths": {"prompt": 150, "completion": 700},
                        "schedule": {**presets.DEFAULT["schedule"], "lower_rho_by": "generate"}})
    schedule = plan_grid(cfg).schedules[0]     # the most rollouts per prompt: the largest KV cache
    total = 141 * 2 ** 30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=total))
    frac = backend_options(cfg, "vllm", device="cuda", schedule=schedule)["gpu_memory_utilization"]
    assert frac == vllm_memory_fraction(schedule_memory(cfg, schedule, prompt_len=cfg.prompt_len), total)
    assert 0.05 < frac < 0.5
    assert 0.05 <= backend_options(cfg, "vllm", device="cuda")["gpu_memory_utilization"] < 0.5   # calibration
    assert backend_options(cfg, "vllm", device="cpu", schedule=schedule) == {}
    assert backend_options(cfg, "hf", device="cuda", schedule=schedule) == {}


def test_vllm_sleep_comes_from_the_memory_plan(monkeypatch):
    """auto: vLLM sleeps during the update only when the awake estimate exceeds the device;
    on / off as set; `on` off a GPU is passed on for the backend to refuse."""
    import types

    import torch

    from race.flops.grid import plan_grid
    from race.flops.memory import schedule_memory
    from race.engine.loading import backend_options

    cfg = build_config({**presets.DEFAULT, "model": "Qwen/Qwen2.5-1.5B-Instruct", "backend": "vllm",
                        "grpo": {**presets.DEFAULT["grpo"], "max_completion_len": 1024, "micro_batch": 8},
                        "budget": 5e16, "lengths": {"prompt": 150, "completion": 700}})
    schedule = plan_grid(cfg).schedules[-1]
    awake = schedule_memory(cfg, schedule, prompt_len=cfg.prompt_len, vllm_sleep=False)
    for total, want in ((141 * 2 ** 30, False), (int(awake.peak * 0.95), True)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d, t=total: types.SimpleNamespace(total_memory=t))
        assert backend_options(cfg, "vllm", device="cuda", schedule=schedule)["sleep"] is want
        for mode in ("on", "off"):
            got = backend_options(cfg.with_overrides(vllm_sleep=mode), "vllm", device="cuda", schedule=schedule)
            assert got["sleep"] is (mode == "on")
    assert backend_options(cfg.with_overrides(vllm_sleep="on"), "vllm", device="cpu") == {"sleep": True}
    assert backend_options(cfg.with_overrides(vllm_sleep="on"), "hf", device="cuda") == {}


@pytest.mark.parametrize("fast_path", [True, False])
def test_backend_is_paused_for_exactly_the_update(monkeypatch, fast_path):
    """The pilot step frees the sampler (vLLM sleep) for the update and wakes it before sync: on the
    lean path's seed-axis engine (a solo pilot is a group of one) and on the peft path (the same
    engine and step, its backend a group of one)."""
    from race.engine import grpo
    from race.engine.seed_axis import LeanPolicy, SeedAxisEngine
    from race.flops.grid import plan_grid

    cfg = build_config({**presets.DEFAULT, "budget": 6e10, "seeds": 1,
                        "grpo": {**presets.DEFAULT["grpo"], "fast_path": fast_path}})
    schedule = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[0]
    engine = SeedAxisEngine(cfg, schedule, [0])
    assert isinstance(engine.trainer, LeanPolicy) == fast_path
    calls = []
    backend = engine.backend
    gen, upd = "generate_seeds", "update_seeds"
    real_update = getattr(grpo, upd)
    monkeypatch.setattr(backend, "pause", lambda: calls.append("pause"))
    monkeypatch.setattr(backend, "resume", lambda: calls.append("resume"))
    monkeypatch.setattr(backend, "sync", lambda *a, real=backend.sync: calls.append("sync") or real(*a))
    monkeypatch.setattr(backend, gen, lambda *a, real=getattr(backend, gen), **k:
                        calls.append("generate") or real(*a, **k))
    monkeypatch.setattr(grpo, upd, lambda *a, **k: calls.append("update") or real_update(*a, **k))
    from race.tasks import load_task

    problems = load_task(cfg.task, split="train", seed=0)[:schedule.prompts_per_step]
    engine.step([0], [problems])
    assert calls == ["generate", "pause", "update", "resume", "sync"]


def test_sdpa_where_available_else_the_default_attention(monkeypatch):
    import transformers

    from race.engine.backends.hf import load_causal_lm

    calls = []

    def fake(path, **kw):
        calls.append(kw)
        if kw.get("attn_implementation") == "sdpa":
            raise ValueError("FooForCausalLM does not support an attention implementation through "
                             "torch.nn.functional.scaled_dot_product_attention yet (sdpa)")
        return "model"

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake)
    assert load_causal_lm("p", dtype="bf16") == "model"
    assert calls == [{"attn_implementation": "sdpa", "dtype": "bf16"}, {"dtype": "bf16"}]
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda path, **kw: (_ for _ in ()).throw(ValueError("no such model")))
    with pytest.raises(ValueError, match="no such model"):
        load_causal_lm("p")


def _steps_policy():
    from transformers import AutoTokenizer

    from race.flops.catalog import resolve_model_path
    from race.engine.backends.hf import load_causal_lm

    path = resolve_model_path("race/tiny-arith-steps")
    return load_causal_lm(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("lean", [False, True])
def test_finished_rows_leave_the_batch_without_changing_any_completion(monkeypatch, lean):
    """Dropping finished rows (cache, mask, positions) gives the same tokens as keeping them:
    greedy-like sampling (T = 1e-4) of 12 long worked solutions, compacting at every chance vs
    never, on the HF cache and on the lean path's own cache."""
    import torch

    import race.engine.backends.hf as hf

    import race.engine.backends.lockstep as ls

    model, tok = _steps_policy()
    if lean:
        model = ls.LockstepLM(model, rank=4, alpha=8, targets=("q_proj",), seeds=[0])
        model.merge()
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("05+37=", "47+85=", "99+99=", "10+01=")]
    runs = {}
    for share in (0.0, 2.0):                      # 0: compact whenever a row has finished; 2: never
        mod = ls if lean else hf
        monkeypatch.setattr(mod, "COMPACT_SHARE", share)
        monkeypatch.setattr(mod, "COMPACT_MIN_LEFT", 1)
        kw = dict(n=3, max_new_tokens=40, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=1e-4)
        if lean:
            runs[share] = ls.sample_lockstep(model, [prompts], generators=[torch.Generator().manual_seed(0)], **kw)[0]
        else:
            runs[share] = hf.sample(model, prompts, generator=torch.Generator().manual_seed(0), **kw)
    assert runs[0.0] == runs[2.0]
    lengths = {len(c) for grp in runs[0.0] for c in grp}
    assert len(lengths) > 1                       # rows did finish at different steps
    for grp in runs[0.0]:
        for c in grp:
            assert c.count(tok.eos_token_id) == 1 and c[-1] == tok.eos_token_id


def test_sampling_stops_at_any_stop_token():
    """A chat model ends its turn with <|im_end|> and its text with <|endoftext|>: both stop a row
    (here: the tiny policy's EOS plus ';', which every worked solution writes after its first step)."""
    import torch

    from race.engine.backends.base import stop_token_ids
    from race.engine.backends.hf import sample

    model, tok = _steps_policy()
    semi = tok.convert_tokens_to_ids(";")
    model.generation_config.eos_token_id = [tok.eos_token_id, semi]
    stops = stop_token_ids(tok, model)
    assert stops == sorted({tok.eos_token_id, semi})
    out = sample(model, [tok("47+85=", add_special_tokens=False)["input_ids"]], n=4, max_new_tokens=30,
                 eos_id=stops, pad_id=tok.pad_token_id, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    for c in out[0]:
        assert c[-1] in stops and not set(c[:-1]) & set(stops)
    assert any(c[-1] == semi for c in out[0])


def test_every_rollout_backend_has_what_the_protocol_names():
    """race.engine.backends.base.RolloutBackend is what the engine, evaluation and calibration call: the
    HF backend, a lockstep seed's view, and (by their class attributes and methods) both vLLM
    backends have all of it, so no caller probes with hasattr."""
    import inspect

    from race.engine.backends.base import RolloutBackend
    from race.engine.backends.hf import HFBackend
    from race.engine.backends.lockstep import SeedView
    from race.config.configfile import config_from_dict
    from race.engine.loading import load_policy

    tok, policy, path = load_policy(config_from_dict({"model": "race/tiny-arith", "budget": 1e10,
                                                      "grpo": {"fast_path": False}}))
    hf = HFBackend(policy, tok, model_path=path)
    assert isinstance(hf, RolloutBackend) and hf.sleep is False

    from types import SimpleNamespace

    group = SimpleNamespace(tok=tok, device=hf.device, pad_id=0, name="hf", sampling_uses_adapter=False,
                            sleep=False)      # a group backend's surface, as LockstepBackend and the vLLM one have
    assert isinstance(SeedView(group, 0), RolloutBackend)
    wanted = {m for m in dir(RolloutBackend) if not m.startswith("_")}
    import ast

    src = inspect.getsource(__import__("race.engine.backends.vllm", fromlist=["x"]))
    tree = ast.parse(src)
    for cls in ("VLLMBackend",):
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
        have = {f.name for f in node.body if isinstance(f, ast.FunctionDef)} | {
            t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)} | {
            t.attr for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets
            if isinstance(t, ast.Attribute)} | {
            e.attr for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Tuple)
            for e in t.elts if isinstance(e, ast.Attribute)}
        assert wanted <= have, (cls, wanted - have)
