"""The vLLM rollout backend: one engine per pilot process, the adapter hot-swapped as LoRA versions.

The engine loads the BASE model once with LoRA enabled. After every optimizer step
``sync()`` writes the policy's adapter as a peft folder (``adapter_config.json`` +
``adapter_model.safetensors``) and registers it as a NEW LoRA version — a new
``lora_int_id`` and a new path — then unloads the previous version. Nothing is
merged into the base weights and the engine is never reloaded; vLLM runs the adapter
unmerged (its LoRA kernels), so a sampled token costs 2·(N + N_lora) FLOPs and
``sampling_uses_adapter`` is True: the pilot's meter counts C_search that way.

Sampling parameters map one to one: temperature, top_p, max_tokens (= max_new_tokens),
n, seed (one per call, drawn from the pilot's torch generator, so a pilot stays
reproducible). Prompts go in as token ids (the policy tokenizer's, without special
tokens, as the HF backend does) and completions stop at the policy's eos token, which is
kept. vLLM also returns the log-prob of each sampled token (``RolloutBatch.logprobs``);
the GRPO update does NOT use them: the training model recomputes the log-probs of the
sampled tokens (race.engine.grpo.completion_logprobs), so the ratio and the gradient come from
one model (vLLM's numbers differ in the last bits, and more in bf16).

Two vLLM traps, guarded here (tests/test_vllm.py covers both):

1. reusing a ``lora_int_id`` with a new path silently serves the OLD weights (vLLM caches
   adapters by id): every version gets a fresh id from a counter that only grows, and an
   id is never registered twice (``_lora_request`` refuses);
2. on the CPU build, a batch mixing ``lora_request=None`` rows with LoRA rows applies an
   adapter to the None rows (an open upstream bug): requests never go out without an
   adapter — the base policy is served through a zero-B adapter (``adapter="base"``),
   which is exactly the base model — and ``_submit`` refuses a batch that mixes.

On a GPU the engine's share of memory (``gpu_memory_utilization``) comes from the memory
plan (race.flops.memory.vllm_memory_fraction): its weights plus the KV cache of one rollout
batch, leaving the rest to training. With ``sleep=True`` (``vllm_sleep``, decided by the
plan: race.flops.memory.wants_vllm_sleep) the engine starts with ``enable_sleep_mode`` and sleeps
at level 1 during every update (``pause``: weights offloaded to CPU memory, KV cache
freed); ``resume`` wakes it before the new adapter version is registered. Level 1 keeps the
loaded adapters: vLLM allocates its LoRA slots while loading the model, inside the memory pool
tagged "weights" that level 1 backs up (vllm/v1/worker/gpu_worker.py ``load_model``, 0.32). vLLM
has sleep mode on CUDA only: asking for it elsewhere is a one-line error.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from race.engine.backends.base import RolloutBatch, stop_token_ids

class _LoRAIds:
    """The ids ever registered on one engine; new ids only grow (kept on the engine object, so
    backends sharing an engine never hand out the same id twice)."""

    def __init__(self) -> None:
        self.used: set[int] = set()
        self.next = 1

    def new(self) -> int:
        self.next += 1
        return self.next - 1


def engine_ids(llm) -> _LoRAIds:
    ids = getattr(llm, "_race_lora_ids", None)
    if ids is None:
        ids = _LoRAIds()
        setattr(llm, "_race_lora_ids", ids)
    return ids


def _log_env() -> None:
    """Before vLLM is first imported: it logs to stdout by default, where RACE prints the report
    (``--format json > file``); send its log to stderr, beside the progress lines, warnings only
    (the user's own VLLM_LOGGING_* settings win)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _engine_env(device: str) -> None:
    # the pilot runs in a daemonic child process, which may not start processes of its
    # own: keep vLLM's engine core in this process
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    _log_env()
    if not str(device).startswith("cuda"):
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")       # GiB of KV cache on CPU


def create_engine(model_path: str, *, max_lora_rank: int, device: str = "cpu", max_loras: int = 2,
                  max_model_len: int | None = None, dtype: str | None = None, seed: int = 0,
                  gpu_memory_utilization: float | None = None, **kw):
    """A ``vllm.LLM`` with LoRA enabled for ``model_path`` (fp32 on CPU, bf16 on CUDA)."""
    _engine_env(device)
    from vllm import LLM

    cuda = str(device).startswith("cuda")
    # CPU: eager mode starts faster and, measured on the tiny policy, samples ~6× faster than the
    # compiled default (whose shapes change every call); CUDA keeps vLLM's graphs
    args = dict(model=model_path, enable_lora=True, max_lora_rank=_vllm_rank(max_lora_rank), max_loras=max_loras,
                dtype=dtype or ("bfloat16" if cuda else "float32"), seed=seed, max_model_len=max_model_len,
                enforce_eager=None if cuda else True,
                # each sampled token's log-prob under the tempered distribution (before top-p: equal to it
                # when top_p = 1), as the update computes it; vLLM's default is the untempered one
                logprobs_mode="processed_logprobs")
    if cuda and gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    args.update(kw)
    return LLM(**{k: v for k, v in args.items() if v is not None})


def _vllm_rank(rank: int) -> int:
    """vLLM accepts max_lora_rank from a fixed set (8, 16, 32, 64, ...): the smallest one ≥ rank."""
    for r in (8, 16, 32, 64, 128, 256, 320, 512):
        if r >= rank:
            return r
    return rank


def write_adapter(folder: str, state: dict, *, rank: int, alpha: float, targets, base_model: str) -> str:
    """A peft-format adapter folder (what ``PeftModel.save_pretrained`` writes) from a state dict
    in peft key names (``base_model.model.….lora_A.weight``)."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file({k: v.detach().float().contiguous().cpu() for k, v in state.items()},
              os.path.join(folder, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
              "target_modules": sorted(targets), "lora_dropout": 0.0, "bias": "none",
              "base_model_name_or_path": base_model, "fan_in_fan_out": False, "use_rslora": False,
              "use_dora": False, "modules_to_save": None, "inference_mode": True}
    with open(os.path.join(folder, "adapter_config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)
    return folder


def policy_adapter(policy) -> tuple[dict, int, float, tuple[str, ...]]:
    """(state dict in peft key names, rank, alpha, target modules) of a lean or peft policy."""
    if hasattr(policy, "adapter_state_dict"):       # race.engine.backends.lockstep.LockstepLM: its first seed
        return policy.adapter_state_dict(), policy.rank, policy.scale * policy.rank, policy.targets
    from peft import get_peft_model_state_dict

    cfg = policy.peft_config["default"]
    state = {k: v for k, v in get_peft_model_state_dict(policy).items()}
    # RACE's peft policies are built on full module paths (race.flops.architectures.peft_module_paths);
    # the adapter names the modules as a saved peft adapter usually does, by their last name part
    return state, cfg.r, cfg.lora_alpha, tuple(sorted({t.rsplit(".", 1)[-1] for t in cfg.target_modules}))


def lora_request(ids: _LoRAIds, name: str, path: str, int_id: int):
    """A ``LoRARequest`` for an id never registered on this engine. Trap 1: an id serves the weights
    it was first loaded with, whatever the path — never reuse one."""
    from vllm.lora.request import LoRARequest

    if int_id in ids.used:
        raise ValueError(f"lora_int_id {int_id} was already used: vLLM would serve its old weights "
                         f"for the new adapter {path!r}")
    ids.used.add(int_id)
    return LoRARequest(lora_name=name, lora_int_id=int_id, lora_path=path)


def start_engine(model_path: str, *, device: str, **kw):
    """``create_engine`` without touching the caller's random state (in-process vLLM seeds the
    global RNGs; a pilot's streams must stay as they were)."""
    import random

    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    llm = create_engine(model_path, device=device, **kw)
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.random.set_rng_state(states[2])
    return llm


def rollout_batch(tok, prompt_ids: list[list[int]], outs) -> RolloutBatch:
    """vLLM's ``RequestOutput``s of ``prompt_ids`` (one each, its ``n`` samples in index order) as a
    ``RolloutBatch``: token ids, each sampled token's log-prob, texts decoded with special tokens."""
    comp, logps = [], []
    for out in outs:
        group, lp = [], []
        for o in sorted(out.outputs, key=lambda o: o.index):
            ids = list(o.token_ids)
            group.append(ids)
            lp.append([float(d[t].logprob) for t, d in zip(ids, o.logprobs or [])])
        comp.append(group)
        logps.append(lp)
    texts = [[tok.decode(c, skip_special_tokens=False) for c in group] for group in comp]
    return RolloutBatch(prompt_ids=prompt_ids, completion_ids=comp, texts=texts, logprobs=logps)


def release_engine(llm, *, owned: bool, requests) -> None:
    """Shut down an engine this backend started, or unload ``requests`` (its adapters) from a shared one."""
    if llm is None:
        return
    if owned:
        shutdown = getattr(getattr(llm.llm_engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        return
    loaded = set(llm.llm_engine.list_loras())
    for req in requests:
        if req is not None and req.lora_int_id in loaded:
            llm.llm_engine.remove_lora(req.lora_int_id)


def check_sleep_mode() -> None:
    """Raise a one-line error when vLLM's sleep mode is not available on this platform."""
    _log_env()
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        from race.core.errors import ConfigError

        raise ConfigError(f"vllm_sleep 'on' needs vLLM's sleep mode, which {type(current_platform).__name__} "
                          f"does not have (CUDA only): set vllm_sleep to auto or off")


class VLLMBackend:
    """Rollouts from a vLLM engine serving the policy's adapter (see the module docstring).

    ``llm``: an engine to use instead of starting one (tests share one); it is then not
    shut down by ``close``.
    """

    name = "vllm"
    sampling_uses_adapter = True

    def __init__(self, policy, tokenizer, *, model_path: str, device: str = "cpu", llm=None,
                 max_model_len: int | None = None, gpu_memory_utilization: float | None = None,
                 seed: int = 0, workdir: str | None = None, sleep: bool = False):
        import torch

        if sleep:
            check_sleep_mode()
        self.sleep, self.asleep = sleep, False
        self.policy, self.tok, self.device = policy, tokenizer, torch.device(device)
        self.model_path = model_path
        self.eos_id = tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(tokenizer, policy)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        state, self.rank, self.alpha, self.targets = policy_adapter(policy)
        self._owns_engine = llm is None
        if llm is None:
            llm = start_engine(model_path, max_lora_rank=self.rank, device=device, max_model_len=max_model_len,
                               gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                               **({"enable_sleep_mode": True} if sleep else {}))
        self.llm = llm
        self._dir = tempfile.mkdtemp(prefix="race-lora-", dir=workdir)
        self._ids = engine_ids(llm)
        zero = {k: (v * 0 if ".lora_B." in k else v) for k, v in state.items()}
        self.base_request = self._lora_request("base", write_adapter(
            os.path.join(self._dir, "base"), zero, rank=self.rank, alpha=self.alpha, targets=self.targets,
            base_model=model_path), self._ids.new())
        self.current = None
        self.version = 0
        self.sync()

    # ------------------------------------------------------------------ adapter versions
    def _lora_request(self, name: str, path: str, int_id: int):
        return lora_request(self._ids, name, path, int_id)

    def sync(self) -> float:
        """Publish the policy's current adapter as a new LoRA version; returns the FLOPs spent (0:
        vLLM runs the adapter unmerged, and its FLOPs are in every sampled token's 2·(N + N_lora))."""
        self.resume()
        state, *_ = policy_adapter(self.policy)
        self.version += 1
        int_id = self._ids.new()
        folder = write_adapter(os.path.join(self._dir, f"v{self.version}"), state, rank=self.rank, alpha=self.alpha,
                               targets=self.targets, base_model=self.model_path)
        old, self.current = self.current, self._lora_request(f"v{self.version}", folder, int_id)
        engine = self.llm.llm_engine
        engine.add_lora(self.current)
        if old is not None:
            engine.remove_lora(old.lora_int_id)      # keep max_loras slots for base + current
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return 0.0

    def pause(self) -> None:
        """Sleep (level 1) for the update when sleep mode is on: weights to CPU, KV cache freed."""
        if self.sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def resume(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def loaded_adapters(self) -> set[int]:
        return set(self.llm.llm_engine.list_loras())

    # ------------------------------------------------------------------ sampling
    def _submit(self, prompt_ids: list[list[int]], params, loras: list):
        """Trap 2: every request carries an adapter (no ``None`` rows next to LoRA rows)."""
        from vllm.inputs import TokensPrompt

        if any(r is None for r in loras) and any(r is not None for r in loras):
            raise ValueError("a vLLM batch mixes lora_request=None rows with LoRA rows: the CPU build applies an "
                             "adapter to the None rows; serve the base policy through the zero-B adapter instead")
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        return self.llm.generate(prompts, sampling_params=params, lora_request=loras, use_tqdm=False)

    def sampling_params(self, *, n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int | None):
        from vllm import SamplingParams

        return SamplingParams(n=n, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                              stop_token_ids=list(self.stop_ids), logprobs=0, detokenize=False)

    def generate(self, prompts: list[str], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None, generator=None, adapter: str = "current"
                 ) -> RolloutBatch:
        """``adapter``: ``current`` (the policy's latest version) or ``base`` (the zero-B adapter)."""
        import torch

        if adapter not in ("current", "base"):
            raise ValueError(f"adapter {adapter!r} is unknown: expected 'current' or 'base'")
        self.resume()
        prompt_ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if seed is None and generator is not None:
            seed = int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator))
        params = self.sampling_params(n=n, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                      seed=seed)
        lora = self.current if adapter == "current" else self.base_request
        return rollout_batch(self.tok, prompt_ids, self._submit(prompt_ids, params, [lora] * len(prompt_ids)))

    def close(self) -> None:
        """Shut the engine down (one this backend started) or unload this backend's adapters (a shared one)."""
        release_engine(self.llm, owned=self._owns_engine, requests=(self.current, self.base_request))
        self.llm = None
        shutil.rmtree(self._dir, ignore_errors=True)
        if self._owns_engine and self.device.type == "cuda":
            # hand the engine's memory back (calibration runs in the parent before the pilots)
            import gc

            import torch

            gc.collect()
            torch.cuda.empty_cache()


class VLLMLockstepBackend:
    """Rollouts for a lockstep group (race.engine.seed_axis) from ONE vLLM engine serving every seed's adapter
    at once (vLLM's multi-LoRA: ``max_loras`` = seeds + 1, each request carrying its seed's
    ``LoRARequest``). ``sync(seeds)`` publishes each seed's adapter as a new version (trap 1 holds
    per seed: fresh ids only); ``generate_seeds`` sends all seeds' prompts as one ``generate``
    call, each seed's requests seeded from that seed's generator; ``view(seed)`` is a one-seed
    backend for evaluations. As ``VLLMBackend``, adapters run unmerged: ``sampling_uses_adapter``."""

    name = "vllm"
    sampling_uses_adapter = True
    sleep = False                 # the multi-LoRA engine does not sleep

    def __init__(self, policy, tokenizer, *, model_path: str, device: str = "cpu", llm=None,
                 max_model_len: int | None = None, gpu_memory_utilization: float | None = None,
                 seed: int = 0, workdir: str | None = None):
        import torch

        self.policy, self.tok, self.device, self.model_path = policy, tokenizer, torch.device(device), model_path
        self.stop_ids = stop_token_ids(tokenizer, policy)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.rank, self.alpha, self.targets = policy.rank, policy.scale * policy.rank, policy.targets
        self._owns_engine = llm is None
        if llm is None:
            llm = start_engine(model_path, max_lora_rank=self.rank, device=device, max_model_len=max_model_len,
                               gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                               max_loras=len(policy.seeds) + 1)
        self.llm = llm
        self._dir = tempfile.mkdtemp(prefix="race-lora-", dir=workdir)
        self._ids = engine_ids(llm)
        self.current: dict[int, object] = {}
        self.version = 0
        self.sync(policy.seeds)

    def sync(self, seeds) -> dict[int, float]:
        """Publish each seed's current adapter as a new LoRA version (0 FLOPs each: unmerged)."""
        engine = self.llm.llm_engine
        for seed in seeds:
            self.version += 1
            name = f"s{seed}-v{self.version}"
            folder = write_adapter(os.path.join(self._dir, name), self.policy.adapter_state_dict(seed),
                                   rank=self.rank, alpha=self.alpha, targets=self.targets, base_model=self.model_path)
            old = self.current.get(seed)
            self.current[seed] = lora_request(self._ids, name, folder, self._ids.new())
            engine.add_lora(self.current[seed])
            if old is not None:
                engine.remove_lora(old.lora_int_id)
                shutil.rmtree(old.lora_path, ignore_errors=True)
        return {s: 0.0 for s in seeds}

    def generate_seeds(self, seeds, prompts: list[list[str]], *, n: int, max_new_tokens: int,
                       temperature: float = 1.0, top_p: float = 1.0, generators=None) -> list[RolloutBatch]:
        import torch
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [[self.tok(p, add_special_tokens=False)["input_ids"] for p in ps] for ps in prompts]
        draws = [int(torch.randint(0, 2 ** 31 - 1, (1,), generator=g)) if g is not None else None
                 for g in (generators or [None] * len(seeds))]
        params, loras, flat = [], [], []
        for seed, pids, draw in zip(seeds, ids, draws):
            p = SamplingParams(n=n, max_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=draw,
                               stop_token_ids=list(self.stop_ids), logprobs=0, detokenize=False)
            params += [p] * len(pids)
            loras += [self.current[seed]] * len(pids)
            flat += [TokensPrompt(prompt_token_ids=list(x)) for x in pids]
        outs = self.llm.generate(flat, sampling_params=params, lora_request=loras, use_tqdm=False)
        bounds = [sum(len(p) for p in ids[:k]) for k in range(len(ids) + 1)]
        return [rollout_batch(self.tok, pids, outs[lo:hi]) for pids, lo, hi in zip(ids, bounds, bounds[1:])]

    def pause(self) -> None:
        """The multi-LoRA engine does not sleep: nothing to free."""

    def resume(self) -> None:
        pass

    def view(self, seed: int, *, owner: bool = False):
        from race.engine.backends.lockstep import SeedView

        return SeedView(self, seed, owner=owner)

    def close(self) -> None:
        release_engine(self.llm, owned=self._owns_engine, requests=self.current.values())
        self.llm = None
        shutil.rmtree(self._dir, ignore_errors=True)
