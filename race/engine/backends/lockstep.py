"""Lockstep pilots on the lean path: the seeds of a grid point as ONE batch over shared base weights.

The seeds of one grid point run the same schedule (prompts per step, rollouts, μ), so every
activation can carry a leading *seed axis* ``S``: a base-weight matmul runs once over every seed's
tokens (``F.linear`` on ``[S, …, D]``), and each seed's LoRA A/B apply as batched matmuls
(``torch.bmm`` over the seed axis: race.engine.backends.lora_ops; as multi-LoRA serving does:
punica / S-LoRA, vLLM's ``max_loras``). ``LockstepLM`` holds one adapter per seed; ``active`` names the seeds in the batch
(a seed whose budget is spent leaves it, and its adapter is frozen from then on).

Invariants:
- a seed's adapter is drawn as ``LeanLM.new_adapter`` after ``torch.manual_seed(seed)`` (a
  ``from_pretrained`` draws nothing), whichever seeds share the group, and each seed keeps its own
  optimizer, schedule and generators (race.engine.seed_axis): nothing but matmul batching is shared;
- per-seed logits, losses, gradients and so adapters equal the one-seed group's bit for bit
  (tests/test_lockstep.py): padding a seed's rows to the widest seed changes no real position, and
  the reductions over token rows (a seed's adapter gradient, its loss) run over its solo rows only
  (race.engine.backends.lora_ops, race.engine.grpo), and so does its attention over keys
  (``_attention_by_seed``), since a CPU kernel's rounding can follow the length of a reduction,
  masked or zero padding included;
- ``sample_lockstep`` draws each seed's tokens from that seed's generator over exactly the rows its
  solo sampler would hold (the same compaction rule, applied per seed), so which other seeds share
  the batch does not change how a seed's random stream is consumed;
- a one-seed group (a solo pilot) takes the same inputs and returns the same shapes, but runs
  without the seed axis inside (``LoRAGroup`` over its parameters as they are, plain matmuls): the
  same products, so its numbers equal its row of a group's, without the axis's bookkeeping.

Sampling runs each seed's merged weights (``W + s·B_s·A_s``, stacked ``[S, out, in]``, one batched
matmul per projection), so the FLOP meter counts 2·N per token plus the merge. On a GPU with a large model, S merged copies of the adapted matrices cost
memory; there the unmerged path (shared base matmul + batched A/B) is the one to take.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from race.engine.backends.base import RolloutBatch
from race.engine.backends.hf import COMPACT_MIN_LEFT, COMPACT_SHARE, top_p_filter
from race.engine.backends.lean import LeanLM
from race.engine.backends.lora_ops import LoRAGroup, LoRAGroupSeeds, solo_rows


class LockstepLM(LeanLM):
    """The lean policy: one LoRA adapter per seed (a solo pilot is one seed). Inputs carry a leading
    seed axis over the ``active`` seeds, in that order: ``forward(input_ids [S, B, T], attention_mask,
    position_ids, logits_to_keep=0, cache=None, merged=False)`` → logits [S, B, T', V] (with
    ``cache`` from ``new_cache`` it appends keys/values for the given tokens: sampling; ``merged``
    runs the merged weights ``merge`` refreshed instead of the adapters);
    ``forward_grouped(prompt_ids [S, G, Lp], …)`` → [S, B, Lc, V]."""

    def __init__(self, hf_model, *, rank: int, alpha: float, targets, seeds, adapter_for=None):
        """``adapter_for(seed)`` returns that seed's adapter (default: torch's global stream seeded with
        ``seed``, then ``new_adapter()``: the solo pilot's draw, which follows ``seed_everything(seed)``
        and a ``from_pretrained`` that draws nothing)."""
        super().__init__(hf_model, rank=rank, alpha=alpha, targets=targets)
        self.seeds = tuple(int(s) for s in seeds)
        if len(set(self.seeds)) != len(self.seeds) or not self.seeds:
            raise ValueError(f"lockstep seeds {list(seeds)} must be distinct and at least one")
        if adapter_for is None:
            def adapter_for(seed):
                torch.manual_seed(seed)
                return self.new_adapter()
        self.adapters = torch.nn.ModuleList([adapter_for(s) for s in self.seeds])
        self.active: tuple[int, ...] = tuple(range(len(self.seeds)))
        self._merged: list[dict] = [{} for _ in self.seeds]     # per seed: (layer, group) → merged weight
        self._stacked: dict = {}                                 # (active, layer, group) → [S, out, in]
        self._solo_rows: list | None = None     # during forward_grouped: per seed its solo rows (``solo_rows``)
        self._seed_widths: list | None = None   # … and its solo (Lp, Lc), when some seed was padded

    # ------------------------------------------------------------------ seeds and adapters
    def set_active(self, seeds) -> None:
        """Run only these seeds (indices into ``self.seeds``, in batch order) from now on."""
        idx = tuple(self.seeds.index(s) for s in seeds)
        if not idx:
            raise ValueError("a lockstep batch needs at least one seed")
        self.active = idx

    def parameters_of(self, seed: int) -> list[torch.nn.Parameter]:
        return list(self.adapters[self.seeds.index(seed)].parameters())

    def adapter_state_dict(self, seed: int | None = None) -> dict[str, torch.Tensor]:
        """Seed ``seed``'s adapter under peft's key names (default: the first seed)."""
        return self.peft_state_dict(self.adapters[self.seeds.index(self.seeds[0] if seed is None else seed)])

    def merge(self, seeds=None) -> dict[int, float]:
        """Refresh the merged sampling weights of ``seeds`` (default: the active ones); returns the
        FLOPs each merge spent (2·r·in·out per adapted matrix), by seed."""
        flops: dict[int, float] = {}
        seeds = [self.seeds[k] for k in self.active] if seeds is None else list(seeds)
        for seed in seeds:
            k = self.seeds.index(seed)
            flops[seed] = 0.0
            for i, layer in enumerate(self.layers):
                for group, members in layer.slices.items():
                    if members:            # a group without members runs its base weight (``_linear``)
                        self._merged[k][(i, group)], f = self.merged_weight(i, layer, group, self.adapters[k])
                        flops[seed] += f
        self._stacked = {}
        return flops

    # ------------------------------------------------------------------ forward
    def _linear(self, i: int, layer, group: str, x: torch.Tensor, merged: bool) -> torch.Tensor:
        bias = layer.b.get(group)
        members = layer.slices[group] if self._adapter_on else ()
        if not members:
            return F.linear(x, layer.w[group], bias)
        if merged:
            if len(self.active) == 1:   # one seed: its merged weight as is, the bias fused (no stacked copy)
                return F.linear(x, self._merged[self.active[0]][(i, group)], bias)
            key = (self.active, i, group)
            W = self._stacked.get(key)
            if W is None:
                W = self._stacked[key] = torch.stack([self._merged[k][(i, group)] for k in self.active])
            S = x.shape[0]
            y = torch.bmm(x.reshape(S, -1, x.shape[-1]), W.transpose(1, 2)).view(*x.shape[:-1], W.shape[1])
            return y + bias if bias is not None else y
        slices = [sl for _, sl in members]
        if len(self.active) == 1:      # one seed (a solo pilot): its parameters as they are, no seed axis
            adapter = self.adapters[self.active[0]]
            return LoRAGroup.apply(x, layer.w[group], bias, self.scale, slices,
                                   *[adapter[f"{i}_{name}_{m}"] for name, _ in members for m in ("A", "B")])
        ab = [torch.stack([self.adapters[k][f"{i}_{name}_{m}"] for k in self.active])
              for name, _ in members for m in ("A", "B")]
        return LoRAGroupSeeds.apply(x, layer.w[group], bias, self.scale, slices, self._solo_rows, *ab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, *, logits_to_keep: int = 0, cache=None,
                merged: bool = False, **_: object):
        """Logits of [S, B, T] inputs (the cache holds S·B rows, seed-major). Left-padded rows: every
        query also sees itself, so a padding row sees a key and stays finite."""
        S, B, T = input_ids.shape
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[..., -T:]
        one = S == 1     # one seed: no seed axis inside (on a small model its views cost a few % of sampling)
        x = F.embedding(input_ids[0] if one else input_ids, self.embed)
        cos, sin = self._rope(position_ids[0] if one else position_ids, x.dtype)
        start = cache.length if cache is not None else 0
        keys = start + T
        causal = torch.ones(T, keys, dtype=torch.bool, device=x.device).tril(diagonal=start)
        mask = causal[None, None] & attention_mask.reshape(S * B, -1)[:, -keys:].bool()[:, None, None, :]
        rows = torch.arange(T, device=x.device)
        mask[..., rows, start + rows] = True

        def attend(i, q, k, v):
            if not one:
                q, k, v = (t.flatten(0, 1) for t in (q, k, v))              # [S·B, T, heads, d]
            if cache is None:
                a = self._attend_rows(q, k, v, mask)
            else:
                cache.k[i][:, :, start:keys] = k.transpose(1, 2)
                cache.v[i][:, :, start:keys] = v.transpose(1, 2)
                a = self._attention(q.transpose(1, 2), cache.k[i][:, :, :keys], cache.v[i][:, :, :keys], mask)
                a = a.transpose(1, 2).flatten(2)
            return a if one else a.unflatten(0, (S, B))

        x = self._blocks(x, cos, sin, attend, merged=merged)
        if cache is not None:
            cache.length = keys
        if logits_to_keep:
            x = x[..., -logits_to_keep:, :]
        logits = self._head(x)
        return SimpleNamespace(logits=logits.unsqueeze(0) if one else logits)

    def forward_grouped(self, prompt_ids, prompt_mask, group, completion_ids, completion_mask, widths=None):
        """Logits predicting each completion token, with each prompt run ONCE for its group of rollouts:
        prompt_ids / prompt_mask [S, G, Lp] (left-padded), group [S, B] (prompt row within the seed),
        completion_ids / completion_mask [S, B, Lc] (right-padded) → [S, B, Lc, V], row t predicting
        completion token t (from the prompt's last position for t = 0). ``widths``: per seed the
        (Lp, Lc) of its own batch before stacking (race.engine.grpo.stack_batches' ``seed_widths``;
        None: every seed's are the stacked ones), so that the backward reduces each seed's adapter
        gradient over its solo rows (``solo_rows``, ``_rank_grads_by_seed``).

        Sharing the prompt's keys/values (with their gradient) across its rollouts is exact: a
        prompt's forward does not depend on what follows it. Prompt and completion tokens of every
        seed travel as one packed batch through each projection; only attention splits them
        (prompts attend causally within themselves, completions to their prompt's keys/values and
        causally within themselves). The head reads each prompt's last position and every completion
        position; the last one's logits are unused but computed, as the FLOP formula counts."""
        self._solo_rows = solo_rows(widths, *prompt_ids.shape[1:], *completion_ids.shape[1:], prompt_ids.device)
        self._seed_widths = widths if self._solo_rows is not None else None
        try:
            return self._grouped(prompt_ids, prompt_mask, group, completion_ids, completion_mask)
        finally:
            self._solo_rows = self._seed_widths = None

    def _attention_by_seed(self, prompts, completions, G: int, B: int):
        """``_grouped``'s attention when seeds were padded to other widths: seed s's prompt and
        completion attention over exactly its solo batch's positions (its prompts' last Lp_s, its
        completions' first Lc_s), zero at the padding. A CPU attention kernel's reductions over the
        keys can follow their count, masked padding included (torch 2.13's SDPA under MKL on an AMD
        EPYC: up to 1e-6 apart; bench/sdpa_padding.py), so the stacked call would round a narrower
        seed otherwise than alone. ``prompts``: (q, k, v, mask) over [S·G, H, Lp, d];
        ``completions``: over [S·B, H, Lc, d], the keys [Lp | Lc]."""
        (qp, kp, vp, mask_p), (qc, kc, vc, mask_c) = prompts, completions
        Lp, Lc = qp.shape[2], qc.shape[2]
        aps, acs = [], []
        for s, (lp, lc) in enumerate(self._seed_widths):
            rp, rc, own = slice(s * G, (s + 1) * G), slice(s * B, (s + 1) * B), slice(Lp - lp, Lp)
            keys = slice(Lp - lp, Lp + lc)            # its prompt's last lp, then its first lc completion positions
            ap = self._attention(qp[rp, :, own], kp[rp, :, own], vp[rp, :, own], mask_p[rp, :, own, own])
            ac = self._attention(qc[rc, :, :lc], kc[rc, :, keys], vc[rc, :, keys], mask_c[rc, :, :lc, keys])
            aps.append(F.pad(ap, (0, 0, Lp - lp, 0)))
            acs.append(F.pad(ac, (0, 0, 0, Lc - lc)))
        return torch.cat(aps), torch.cat(acs)

    def _grouped(self, prompt_ids, prompt_mask, group, completion_ids, completion_mask):
        """``forward_grouped``'s forward pass."""
        S, G, Lp = prompt_ids.shape
        B, Lc = completion_ids.shape[1:]
        Np = G * Lp
        dev = prompt_ids.device
        flat_group = (group + G * torch.arange(S, device=dev)[:, None]).reshape(-1)     # rows of [S·G]
        pm, cm = prompt_mask.reshape(S * G, Lp), completion_mask.reshape(S * B, Lc)
        pos_p = (pm.cumsum(1) - 1).clamp(min=0)
        pos_c = pm.sum(1).index_select(0, flat_group)[:, None] + torch.arange(Lc, device=dev)
        one = S == 1                 # one seed: no seed axis inside (as ``forward``)
        lead = () if one else (S,)
        x = F.embedding(torch.cat((prompt_ids.reshape(*lead, -1), completion_ids.reshape(*lead, -1)), dim=-1), self.embed)
        cos, sin = self._rope(torch.cat((pos_p.reshape(*lead, -1), pos_c.reshape(*lead, -1)), dim=-1), x.dtype)
        rows = torch.arange(Lp, device=dev)
        mask_p = torch.ones(Lp, Lp, dtype=torch.bool, device=dev).tril()[None, None] & pm.bool()[:, None, None, :]
        mask_p[..., rows, rows] = True
        causal = torch.ones(Lc, Lc, dtype=torch.bool, device=dev).tril()[None, None] & cm.bool()[:, None, None, :]
        prefix = pm.bool().index_select(0, flat_group)[:, None, None, :].expand(S * B, 1, Lc, Lp)
        mask_c = torch.cat((prefix, causal), dim=-1)

        def attend(i, q, k, v):                       # q, k, v: [(S,) Np + B·Lc, heads, d]
            qp, kp, vp = (t[..., :Np, :, :].reshape(S * G, Lp, *t.shape[-2:]).transpose(1, 2) for t in (q, k, v))
            qc, kc, vc = (t[..., Np:, :, :].reshape(S * B, Lc, *t.shape[-2:]).transpose(1, 2) for t in (q, k, v))
            kc = torch.cat((kp.index_select(0, flat_group), kc), dim=2)
            vc = torch.cat((vp.index_select(0, flat_group), vc), dim=2)
            if self._seed_widths is None:
                ap, ac = self._attention(qp, kp, vp, mask_p), self._attention(qc, kc, vc, mask_c)
            else:
                ap, ac = self._attention_by_seed((qp, kp, vp, mask_p), (qc, kc, vc, mask_c), G, B)
            return torch.cat((ap.transpose(1, 2).reshape(*lead, Np, -1), ac.transpose(1, 2).reshape(*lead, B * Lc, -1)),
                             dim=-2)

        x = self._blocks(x, cos, sin, attend)
        head_rows = torch.cat((torch.arange(Lp - 1, Np, Lp, device=dev), torch.arange(Np, Np + B * Lc, device=dev)))
        logits = self._head(x.index_select(-2, head_rows))                           # [(S,) G + B·Lc, V]
        comp = G + torch.arange(B * Lc, device=dev).view(B, Lc)[:, :-1]
        idx = torch.cat((group[:, :, None], comp.expand(S, B, Lc - 1)), dim=2)       # [S, B, Lc]
        V = logits.shape[-1]
        if one:
            return torch.gather(logits, 0, idx.reshape(-1, 1).expand(-1, V)).view(1, B, Lc, V)
        return torch.gather(logits, 1, idx.reshape(S, -1, 1).expand(-1, -1, V)).view(S, B, Lc, V)


@torch.no_grad()
def sample_lockstep(model: LockstepLM, prompt_ids: list[list[list[int]]], *, n: int, max_new_tokens: int,
                    eos_id, pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                    generators: list[torch.Generator | None], device="cpu",
                    logprobs: list | None = None) -> list[list[list[list[int]]]]:
    """``race.engine.backends.hf.sample`` for the active seeds at once: ``prompt_ids[s]`` are seed s's
    prompts (every seed the same count), ``generators[s]`` its stream. Returns, per seed, ids per
    prompt per rollout; ``logprobs`` (a list) receives per seed the same nesting of log-probs.

    Each seed keeps the row set its solo sampler would keep (``own``: physical rows in solo order;
    finished rows leave under the same ``COMPACT_SHARE`` / ``COMPACT_MIN_LEFT`` rule, seed by seed),
    and draws its tokens from its own generator over exactly those rows. Physically every seed
    holds the same number of rows (the largest own set, padded with finished rows whose output is
    discarded), so the batch stays one [S, R] block."""
    S = len(prompt_ids)
    P = len(prompt_ids[0])
    if any(len(p) != P for p in prompt_ids):
        raise ValueError(f"lockstep sampling needs the same number of prompts per seed, got {[len(p) for p in prompt_ids]}")
    stop = torch.tensor(sorted({int(eos_id)} if isinstance(eos_id, int) else {int(i) for i in eos_id}),
                        dtype=torch.long, device=device)
    ids, mask, width = _left_padded(prompt_ids, pad_id, device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model.new_cache(S * P, width + max_new_tokens)
    logits = model(ids, mask, pos, cache=cache, logits_to_keep=1, merged=True).logits[:, :, -1, :]
    cache = LockstepLM.repeat_cache(cache, n)
    B = P * n
    logits = logits.repeat_interleave(n, dim=1)                    # [S, R, V]
    mask = mask.repeat_interleave(n, dim=1)                        # [S, R, L]
    next_pos = pos[:, :, -1:].repeat_interleave(n, dim=1) + 1      # [S, R, 1]
    rows = _SeedRows(S, B, device)
    R = B
    for t in range(max_new_tokens):
        toks, cols = [], []                                        # per seed: next token, new mask column
        for s in range(S):
            tok, col = _seed_step(rows, s, logits, t, R, max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, generator=generators[s], stop=stop, pad_id=pad_id,
                                  want_logprobs=logprobs is not None, device=device)
            toks.append(tok)
            cols.append(col)
        if not any(rows.live):
            break
        nxt_phys = torch.stack(toks)                                   # [S, R]
        mask = torch.cat([mask, torch.stack(cols).unsqueeze(-1)], dim=-1)
        compact = [rows.live[s] and float(rows.done[s].float().mean()) >= COMPACT_SHARE
                   and max_new_tokens - 1 - t >= COMPACT_MIN_LEFT for s in range(S)]
        if any(compact):
            phys, R_new = _compacted_rows(rows, compact, R, device)
            mask, next_pos, nxt_phys = _keep_rows(cache, phys, R, mask, next_pos, nxt_phys)
            R = R_new
        logits = model(nxt_phys.unsqueeze(-1), mask, next_pos, cache=cache, merged=True).logits[:, :, -1, :]
        next_pos = next_pos + 1
    if logprobs is not None:
        logprobs.extend([rows.lps[s][i * n:(i + 1) * n] for i in range(P)] for s in range(S))
    return [[rows.out[s][i * n:(i + 1) * n] for i in range(P)] for s in range(S)]


def _left_padded(prompt_ids: list[list[list[int]]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids, attention mask, width): every seed's prompts left-padded to the widest, [S, P, width], on ``device``."""
    S, P = len(prompt_ids), len(prompt_ids[0])
    width = max(len(p) for seed in prompt_ids for p in seed)
    ids = torch.full((S, P, width), pad_id, dtype=torch.long)
    mask = torch.zeros((S, P, width), dtype=torch.long)
    for s, seed in enumerate(prompt_ids):
        for i, p in enumerate(seed):
            ids[s, i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[s, i, width - len(p):] = 1
    return ids.to(device), mask.to(device), width


class _SeedRows:
    """What ``sample_lockstep`` keeps per seed s: ``own[s]``, how many of the physical rows are its
    solo sampler's (always the first ones, in solo order: compaction moves a seed's kept rows to the
    front, so they are a slice where an index would copy); ``rollout[s]``, which rollout each own
    row is; ``done[s]``, which own rows have finished; ``live[s]``, whether its solo sampler is still
    looping; ``out[s]`` / ``lps[s]``, the tokens (and log-probs) of each rollout so far."""

    def __init__(self, S: int, B: int, device) -> None:
        self.own = [B] * S
        self.rollout = [torch.arange(B, device=device) for _ in range(S)]
        self.done = [torch.zeros(B, dtype=torch.bool, device=device) for _ in range(S)]
        self.live = [True] * S
        self.out: list[list[list[int]]] = [[[] for _ in range(B)] for _ in range(S)]
        self.lps: list[list[list[float]]] = [[[] for _ in range(B)] for _ in range(S)]


def _seed_step(rows: _SeedRows, s: int, logits: torch.Tensor, t: int, R: int, *, max_new_tokens: int,
               temperature: float, top_p: float, generator: torch.Generator | None, stop: torch.Tensor,
               pad_id: int, want_logprobs: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoding step ``t`` of seed s over its own rows, as its solo sampler takes it: the next
    tokens drawn from ``generator``, recorded for the rows not done; returns the seed's [R] token
    row and mask column (padding rows, and every row once the seed stops, masked)."""
    m = rows.own[s]
    if not rows.live[s]:
        return (torch.full((R,), pad_id, dtype=torch.long, device=device),
                torch.zeros(R, dtype=torch.long, device=device))
    done = rows.done[s]
    scaled = logits[s, :m].float() / temperature
    probs = top_p_filter(torch.softmax(scaled, dim=-1), top_p)
    nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
    lp = torch.log_softmax(scaled, dim=-1).gather(1, nxt.unsqueeze(1)).squeeze(1).tolist() \
        if want_logprobs else None
    for k, (r, tok, d) in enumerate(zip(rows.rollout[s].tolist(), nxt.tolist(), done.tolist())):
        if not d:
            rows.out[s][r].append(tok)
            if lp is not None:
                rows.lps[s][r].append(lp[k])
    finished = torch.isin(nxt, stop) & ~done
    col = (~done | finished).long()       # the mask column as the solo sampler writes it
    rows.done[s] = done | finished
    if bool(rows.done[s].all()) or t == max_new_tokens - 1:
        rows.live[s] = False
    if not rows.live[s]:                  # its rows are read no more
        col = torch.zeros_like(col)
    return (nxt if m == R else F.pad(nxt, (0, R - m), value=pad_id),
            col if m == R else F.pad(col, (0, R - m)))   # padding rows masked


def _compacted_rows(rows: _SeedRows, compact: list[bool], R: int, device) -> tuple[list[torch.Tensor], int]:
    """Compaction: each seed in ``compact`` keeps only its rows not done (its solo rule), a stopped
    seed keeps none. Returns per seed the physical rows to keep, its own rows first (solo order),
    then any others as padding up to the new row count, and that count; updates ``rows``."""
    S = len(compact)
    keep_own = []
    for s in range(S):
        if compact[s]:
            k = (~rows.done[s]).nonzero().squeeze(1)
            rows.rollout[s], rows.done[s] = rows.rollout[s][k], rows.done[s][k]
            keep_own.append(k)
        else:
            keep_own.append(torch.arange(rows.own[s] if rows.live[s] else 0, device=device))
    R_new = max(len(k) for k in keep_own)
    phys = []
    for s in range(S):                   # own rows first (solo order), then any rows as padding
        k = keep_own[s]
        extra = R_new - len(k)
        if extra:
            spare = torch.ones(R, dtype=torch.bool, device=device)
            spare[k] = False
            k = torch.cat((k, spare.nonzero().squeeze(1)[:extra]))
        phys.append(k)
        rows.own[s] = len(keep_own[s])
    return phys, R_new


def _keep_rows(cache, phys: list[torch.Tensor], R: int, mask: torch.Tensor, next_pos: torch.Tensor,
               nxt_phys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows ``phys`` of each seed (of R physical rows) kept in the KV cache (in place), the
    attention mask, the next positions and the next tokens; returns the last three."""
    sel = torch.cat([p + s * R for s, p in enumerate(phys)])
    cache.k = [c.index_select(0, sel) for c in cache.k]
    cache.v = [c.index_select(0, sel) for c in cache.v]
    idx = torch.stack(phys)                                       # [S, R_new]
    mask = torch.gather(mask, 1, idx[..., None].expand(-1, -1, mask.shape[-1]))
    next_pos = torch.gather(next_pos, 1, idx[..., None])
    nxt_phys = torch.gather(nxt_phys, 1, idx)
    return mask, next_pos, nxt_phys


class LockstepBackend:
    """Rollouts for a lockstep group: ``generate_seeds`` samples every active seed's prompts as one
    batch from its merged weights; ``view(seed)`` is a one-seed backend with ``HFBackend``'s
    ``generate`` (held-out evaluations, checkpoints)."""

    name = "hf"
    sampling_uses_adapter = False       # each seed samples its merged weights W + s·B·A
    sleep = False

    def __init__(self, policy: LockstepLM, tokenizer, *, device: str = "cpu"):
        from race.engine.backends.base import stop_token_ids

        self.policy, self.tok, self.device = policy, tokenizer, torch.device(device)
        self.stop_ids = stop_token_ids(tokenizer, policy)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_ids[0]
        self.merge_flops = policy.merge(policy.seeds)

    def sync(self, seeds) -> dict[int, float]:
        """Merge the seeds' current adapters into their sampling weights; FLOPs by seed."""
        return self.policy.merge(seeds)

    def generate_seeds(self, seeds, prompts: list[list[str]], *, n: int, max_new_tokens: int,
                       temperature: float = 1.0, top_p: float = 1.0,
                       generators: list[torch.Generator]) -> list[RolloutBatch]:
        self.policy.set_active(seeds)
        prompt_ids = [[self.tok(p, add_special_tokens=False)["input_ids"] for p in ps] for ps in prompts]
        logprobs: list = []
        comp = sample_lockstep(self.policy, prompt_ids, n=n, max_new_tokens=max_new_tokens, eos_id=self.stop_ids,
                               pad_id=self.pad_id, temperature=temperature, top_p=top_p, generators=generators,
                               device=self.device, logprobs=logprobs)
        return [RolloutBatch(prompt_ids=pi, completion_ids=c,
                             texts=[[self.tok.decode(x, skip_special_tokens=False) for x in g] for g in c],
                             logprobs=lp) for pi, c, lp in zip(prompt_ids, comp, logprobs)]

    def pause(self) -> None:
        """Nothing to free: the merged sampling weights are the policy's own."""

    def resume(self) -> None:
        pass

    def view(self, seed: int, *, owner: bool = False) -> "SeedView":
        return SeedView(self, seed, owner=owner)

    def close(self) -> None:
        self.policy = None


class SeedView:
    """One seed of a lockstep group as a rollout backend (the ``generate`` of race.engine.backends.base),
    over any group backend with ``generate_seeds`` (this module's, vLLM's multi-LoRA one, or
    ``OneSeedGroup``). A view the group's engine made (``owner`` False) leaves syncing, pausing and
    closing to that engine; a view that ``owner``s its group (a group of one: calibration, a solo
    pilot's backend) syncs, pauses and closes it."""

    def __init__(self, group, seed: int, *, owner: bool = False):
        self.group, self.seed, self.owner = group, seed, owner
        self.tok, self.device, self.pad_id, self.name = group.tok, group.device, group.pad_id, group.name
        self.sampling_uses_adapter, self.sleep = group.sampling_uses_adapter, group.sleep

    def sync(self) -> float:
        return self.group.sync([self.seed])[self.seed] if self.owner else 0.0

    def pause(self) -> None:
        if self.owner:
            self.group.pause()

    def resume(self) -> None:
        if self.owner:
            self.group.resume()

    def close(self) -> None:
        if self.owner:
            self.group.close()

    def generate(self, prompts: list[str], *, n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None, generator: torch.Generator | None = None) -> RolloutBatch:
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        return self.group.generate_seeds([self.seed], [prompts], n=n, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, generators=[generator])[0]


class OneSeedGroup:
    """A single-adapter backend (race.engine.backends.vllm.VLLMBackend over a one-seed ``LockstepLM``, or
    the HF / vLLM backend of a peft policy: race.engine.seed_axis.PeftPolicy) as a group of that one seed, so the seed-axis engine drives it as any group: ``generate_seeds``,
    ``sync(seeds)`` and ``view(seed)`` pass through to the backend, and so do its pause and resume
    (vLLM's sleep mode during the update)."""

    def __init__(self, backend, seed: int):
        self.backend, self.seed = backend, seed
        self.tok, self.device, self.pad_id, self.name = backend.tok, backend.device, backend.pad_id, backend.name
        self.sampling_uses_adapter, self.sleep = backend.sampling_uses_adapter, backend.sleep

    def _one(self, seeds) -> None:
        if list(seeds) != [self.seed]:
            raise ValueError(f"this backend serves seed {self.seed} only, not {list(seeds)}")

    def sync(self, seeds) -> dict[int, float]:
        self._one(seeds)
        return {self.seed: self.backend.sync()}

    def pause(self) -> None:
        self.backend.pause()

    def resume(self) -> None:
        self.backend.resume()

    def generate_seeds(self, seeds, prompts: list[list[str]], *, n: int, max_new_tokens: int,
                       temperature: float = 1.0, top_p: float = 1.0, generators=None) -> list[RolloutBatch]:
        self._one(seeds)
        return [self.backend.generate(prompts[0], n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                      top_p=top_p, generator=(generators or [None])[0])]

    def view(self, seed: int, *, owner: bool = False) -> SeedView:
        return SeedView(self, seed, owner=owner)

    def close(self) -> None:
        self.backend.close()
