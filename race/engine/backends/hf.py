"""The Hugging Face rollout backend (CPU and CUDA) for policies wrapped by peft (models the lean
path of race.engine.backends.lean cannot run; lean policies sample through race.engine.backends.lockstep).

Sampling is a plain KV-cache loop rather than ``model.generate``: on small
models the per-token overhead of ``generate`` (logits processors, stopping
criteria, cache bookkeeping) is larger than the model itself. Each prompt is
prefilled once and its cache repeated for its ``n`` rollouts (prefix sharing,
as counted by ``flops.search_flops(prefix_shared=True)``).

By default the backend samples from a separate copy of the base model into
which the adapter is merged after every optimizer step (``W + s·B·A``, a few
small matmuls): sampling then runs plain linear layers with no LoRA overhead,
and ``sampling_uses_adapter`` is False, so the meter counts 2·N per token plus
the merge FLOPs. ``merge_for_sampling=False`` samples through the peft model.
"""
from __future__ import annotations

import torch

from race.engine.backends.base import RolloutBatch, stop_token_ids


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    keep = sorted_p.cumsum(-1) - sorted_p < top_p          # always keeps the top token
    sorted_p = sorted_p * keep
    return torch.zeros_like(probs).scatter(-1, idx, sorted_p)


COMPACT_SHARE = 0.25     # drop finished rows once at least this share of the batch has finished …
COMPACT_MIN_LEFT = 8     # … and at least this many tokens may still follow (else the copy costs more)


@torch.no_grad()
def sample(model, prompt_ids: list[list[int]], *, n: int, max_new_tokens: int, eos_id, pad_id: int,
           temperature: float = 1.0, top_p: float = 1.0, generator: torch.Generator | None = None,
           device: torch.device | str = "cpu", logprobs: list | None = None) -> list[list[list[int]]]:
    """Sample ``n`` continuations of each prompt; returns ids per prompt per rollout (the stop token
    kept, no pad). ``logprobs``, when a list is given, receives the same nesting of each sampled
    token's log-prob under the tempered distribution before top-p (what the update recomputes:
    the sync check of race.engine.grpo compares the two).

    ``eos_id`` is one token id or a collection of them (a chat model stops at its end-of-turn
    token, ``<|im_end|>``, as well as at its end-of-text token). Rows that have stopped leave the
    batch: once at least ``COMPACT_SHARE`` of the rows still in it have finished and at least
    ``COMPACT_MIN_LEFT`` tokens may still follow, the finished rows' logits, mask and KV cache are
    dropped, so long completions of uneven length do not pay for the rows that are done.
    """
    stop = torch.tensor(sorted({int(eos_id)} if isinstance(eos_id, int) else {int(i) for i in eos_id}),
                        dtype=torch.long, device=device)
    P = len(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((P, width), pad_id, dtype=torch.long)
    mask = torch.zeros((P, width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):            # left padding: prompts end at the same column
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits, step, select = _prefill(model, ids, mask, pos, n=n)
    mask = mask.repeat_interleave(n, dim=0)
    next_pos = pos[:, -1:].repeat_interleave(n, dim=0) + 1
    B = P * n
    rows = torch.arange(B, device=device)         # which rollout each row of the batch is
    out: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    done = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        scaled = logits.float() / temperature
        probs = top_p_filter(torch.softmax(scaled, dim=-1), top_p)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        lp = torch.log_softmax(scaled, dim=-1).gather(1, nxt.unsqueeze(1)).squeeze(1).tolist() \
            if logprobs is not None else None
        for k, (r, tok, d) in enumerate(zip(rows.tolist(), nxt.tolist(), done.tolist())):
            if not d:
                out[r].append(tok)
                if lp is not None:
                    lps[r].append(lp[k])
        finished = torch.isin(nxt, stop) & ~done
        done = done | finished
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, (~done | finished).long().unsqueeze(1)], dim=1)
        if float(done.float().mean()) >= COMPACT_SHARE and max_new_tokens - 1 - t >= COMPACT_MIN_LEFT:
            keep = (~done).nonzero().squeeze(1)
            rows, mask, next_pos, nxt, done = rows[keep], mask[keep], next_pos[keep], nxt[keep], done[keep]
            select(keep)
        logits = step(nxt.unsqueeze(1), mask, next_pos)
        next_pos = next_pos + 1
    if logprobs is not None:
        logprobs.extend(lps[i * n:(i + 1) * n] for i in range(P))
    return [out[i * n:(i + 1) * n] for i in range(P)]


def _prefill(model, ids, mask, pos, *, n: int):
    """Prefill the prompts once, repeat the cache n times; returns (first logits [P·n, V], step fn,
    select fn: keep only the given rows of the cache)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    kv = {cache_keyword(model): cache}
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1, **kv)
    cache.batch_repeat_interleave(n)

    def step(tok, m, p):
        return model(input_ids=tok, attention_mask=m, position_ids=p, use_cache=True, **kv).logits[:, -1, :]

    select = cache.batch_select_indices
    return out.logits[:, -1, :].repeat_interleave(n, dim=0), step, select


def cache_keyword(model) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` where it names one
    (transformers 5.25 renamed ``past_key_values``, which it warns about and drops in 5.40), else
    ``past_key_values`` (earlier releases, and remote code that kept the old name). A peft model
    is asked about its base model, to which its ``forward`` passes the keyword."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        names = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        names = {}
    return "cache" if "cache" in names else "past_key_values"


def returned_cache(out):
    """The KV cache a forward returned: ``out.cache`` from transformers 5.25, ``out.past_key_values``
    before (the old attribute still answers there, with a warning)."""
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache


def load_causal_lm(path: str, **kw):
    """``AutoModelForCausalLM.from_pretrained`` asking for PyTorch SDPA attention (flash /
    memory-efficient kernels on CUDA) and falling back to the model's default attention where an
    architecture has no SDPA implementation."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, **{"attn_implementation": "sdpa", **kw})
    except (ValueError, ImportError) as e:
        if "sdpa" not in str(e).lower() or kw.get("attn_implementation") not in (None, "sdpa"):
            raise
        return AutoModelForCausalLM.from_pretrained(path, **{k: v for k, v in kw.items() if k != "attn_implementation"})


def _lora_modules(policy):
    """(name without the peft prefix, lora layer) for every adapted linear layer."""
    for name, mod in policy.named_modules():
        if hasattr(mod, "lora_A") and hasattr(mod, "base_layer") and "default" in getattr(mod, "lora_A", {}):
            yield name.split("base_model.model.", 1)[-1], mod


class HFBackend:
    """Rollouts from a Transformers model (the policy being trained), on CPU or CUDA."""

    name = "hf"
    sleep = False                 # nothing sleeps: the sampling copy stays where it is

    def __init__(self, policy, tokenizer, *, model_path: str | None = None, merge_for_sampling: bool = True,
                 device: str = "cpu"):
        self.policy, self.tok, self.device = policy, tokenizer, torch.device(device)
        self.eos_id = tokenizer.eos_token_id
        self.stop_ids = stop_token_ids(tokenizer, policy)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.sampler = policy
        self.sampling_uses_adapter = True
        self._targets: list[tuple[torch.nn.Parameter, torch.Tensor, object]] = []
        if merge_for_sampling and model_path is not None:
            loras = list(_lora_modules(policy))
            # the sampling copy takes the policy's weight dtype (bf16 on CUDA), not a fixed one
            dtype = loras[0][1].base_layer.weight.dtype if loras else torch.float32
            base = load_causal_lm(model_path, dtype=dtype).to(self.device).eval()
            params = dict(base.named_modules())
            for name, lora in loras:
                lin = params[name]
                # keep the frozen base weight: merged = W0 + s·B·A is recomputed, never accumulated
                self._targets.append((lin.weight, lora.base_layer.weight.detach(), lora))
            self.sampler = base
            self.sampling_uses_adapter = False
            self.sync()

    def pause(self) -> None:
        """Nothing to free: the sampling copy is the policy or a merged copy the update does not touch."""

    def resume(self) -> None:
        pass

    def sync(self) -> float:
        """Merge the current adapter into the sampling copy; returns the merge FLOPs (2·r·in·out per layer)."""
        flops = 0.0
        with torch.no_grad():
            for weight, w0, lora in self._targets:
                A, B = lora.lora_A["default"].weight, lora.lora_B["default"].weight   # [r, in], [out, r]
                weight.copy_(w0 + lora.scaling["default"] * (B @ A))
                flops += 2.0 * A.shape[0] * A.shape[1] * B.shape[0]
        return flops

    def generate(self, prompts: list[str], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None, generator: torch.Generator | None = None
                 ) -> RolloutBatch:
        prompt_ids = [self.tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        was_training = self.sampler.training
        self.sampler.eval()
        logprobs: list = []
        comp = sample(self.sampler, prompt_ids, n=n, max_new_tokens=max_new_tokens, eos_id=self.stop_ids,
                      pad_id=self.pad_id, temperature=temperature, top_p=top_p, generator=generator,
                      device=self.device, logprobs=logprobs)
        if was_training:
            self.sampler.train()
        # decoded WITH special tokens: rewards can tell a stopped policy from a truncated one
        texts = [[self.tok.decode(c, skip_special_tokens=False) for c in group] for group in comp]
        return RolloutBatch(prompt_ids=prompt_ids, completion_ids=comp, texts=texts, logprobs=logprobs)

    def close(self) -> None:
        self.sampler = None
