"""LoRA GRPO, readable top to bottom.

One *step* of a pilot:

1. take ``B_p`` prompts and sample ``n_gen`` rollouts each (the rollout backend);
2. score every rollout with the reward system;
3. keep, per prompt, the ``n_train`` rollouts whose rewards have maximal variance
   (PODS-style down-sampling; all of them when ``n_train == n_gen``);
4. group-relative advantages over the kept rollouts of each prompt;
5. ``μ`` clipped policy-gradient iterations over the same batch (AdamW on the
   LoRA weights only), each one optimizer step (and one step of the learning-rate
   schedule, when the config has one).

Where RACE departs from TRL: the old-policy log-probs for the PPO ratio are the
first iteration's own log-probs, detached (the policy has not moved yet), so
μ > 1 costs no extra forward pass; the reference policy is the base model with
the adapter disabled (no second copy of the weights).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from race.flops.memory import LOGIT_BLOCK_ENTRIES  # entries (positions × vocabulary) of one token_logprobs block

ADV_EPS = 1e-4  # added to the group std, as in TRL


# ----------------------------------------------------------------------------- advantages

def group_advantages(rewards: torch.Tensor, *, scale: str = "grpo") -> torch.Tensor:
    """Group-relative advantages.

    rewards: [P, G] (P prompts, G rollouts each). ``grpo``: (r − mean_g) / (std_g + 1e-4)
    with the unbiased std (Bessel, as ``torch.std`` and TRL); ``dr_grpo``: r − mean_g
    (Dr. GRPO drops the std scaling, which up-weights easy and hard prompts).
    Returns [P, G]. A group with one rollout gets advantage 0.
    """
    mean = rewards.mean(dim=1, keepdim=True)
    centred = rewards - mean
    if scale == "dr_grpo":
        return centred
    if scale != "grpo":
        raise ValueError(f"advantage scale {scale!r} is unknown: expected 'grpo' or 'dr_grpo'")
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    return centred / (rewards.std(dim=1, keepdim=True) + ADV_EPS)


def max_variance_subset(rewards: Sequence[float], k: int) -> list[int]:
    """Indices of the ``k`` rewards with the largest (population) variance.

    The best subset of size k is always some ``i`` smallest plus ``k − i`` largest
    values (moving any chosen value towards the extremes cannot lower the
    variance), so it suffices to try the k + 1 splits of the sorted list. Ties
    are broken by the lowest index, so the choice is deterministic.
    """
    n = len(rewards)
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}] (rollouts generated)")
    if k == n:
        return list(range(n))
    low = sorted(range(n), key=lambda i: (rewards[i], i))     # smallest first, lowest index on ties
    high = sorted(range(n), key=lambda i: (-rewards[i], i))   # largest first, lowest index on ties
    best, best_var = None, -1.0
    for i in range(k + 1):
        idx = set(low[:i]) | set(high[:k - i])
        if len(idx) < k:          # equal values picked from both ends
            continue
        vals = [rewards[j] for j in idx]
        m = sum(vals) / k
        var = sum((v - m) ** 2 for v in vals) / k
        if var > best_var + 1e-12:
            best, best_var = idx, var
    return sorted(best)


# ----------------------------------------------------------------------------- the loss

def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) estimate k3 = e^(ref−θ) − (ref−θ) − 1 (≥ 0, unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, *, how: str, max_completion_len: int) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    - ``grpo``: mean over each sequence's tokens, then mean over sequences;
    - ``dapo``: sum over all tokens / number of active tokens in the batch;
    - ``dr_grpo``: sum over all tokens / (B · max_completion_len), a constant
      normaliser that removes the length bias.
    """
    mask = mask.to(per_token.dtype)
    if how == "grpo":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    if how == "dapo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if how == "dr_grpo":
        return (per_token * mask).sum() / (per_token.shape[0] * max_completion_len)
    raise ValueError(f"loss aggregation {how!r} is unknown: expected grpo, dapo or dr_grpo")


@dataclass
class LossTerms:
    loss: torch.Tensor
    clip_fraction: float
    kl: float
    entropy: float


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                clip_eps: float = 0.2, clip_eps_high: float | None = None, loss_agg: str = "dapo",
                max_completion_len: int = 1, ref_logp: torch.Tensor | None = None, beta: float = 0.0,
                entropy: torch.Tensor | None = None, entropy_coef: float = 0.0) -> LossTerms:
    """PPO-clipped GRPO loss on completion tokens.

    Shapes: ``logp``, ``old_logp``, ``mask``, ``ref_logp``, ``entropy``: [B, T]
    (T completion positions); ``advantages``: [B] (one per sequence).
    Per token: −min(r·A, clip(r, 1−ε, 1+ε_high)·A) with r = exp(logp − old_logp),
    plus β·KL_k3(π_θ ‖ π_ref), minus entropy_coef · entropy; then ``aggregate``.
    """
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    kl_mean = 0.0
    if beta > 0 and ref_logp is not None:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + beta * kl
        kl_mean = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
    ent_mean = 0.0
    if entropy is not None:
        ent_mean = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        if entropy_coef:
            per_token = per_token - entropy_coef * entropy
    loss = aggregate(per_token, mask, how=loss_agg, max_completion_len=max_completion_len)
    with torch.no_grad():
        was_clipped = ((unclipped - clipped).abs() > 0) & mask.bool()
        clip_frac = float(was_clipped.sum() / mask.sum().clamp(min=1))
    return LossTerms(loss, clip_frac, kl_mean, ent_mean)


def completion_logprobs(model, batch: "TrainBatch", *, temperature: float = 1.0, with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and optionally entropies) of each sequence's completion tokens: [B, T] each.

    Logits are divided by the sampling temperature, so the ratio compares the
    distributions that were actually sampled from. A model with ``forward_grouped``
    (race.engine.backends.lockstep.LockstepLM, over a seed axis) runs each prompt once for its group of rollouts; any other
    model runs ``[prompt | completion]`` rows and computes logits only where needed
    (``logits_to_keep``), which matters for 150 k-token vocabularies.
    """
    T = batch.completion_width
    if hasattr(model, "forward_grouped"):
        logits = model.forward_grouped(batch.prompt_ids, batch.prompt_mask, batch.group,
                                       batch.completion_ids, batch.completion_mask, widths=batch.seed_widths)
    else:
        ids, mask = batch.input_ids, batch.attention_mask
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0),
                    logits_to_keep=T + 1, use_cache=False)
        logits = out.logits[:, :-1, :]                            # predicts the last T tokens
    return token_logprobs(logits, batch.completion_ids, temperature=temperature, with_entropy=with_entropy)


def token_logprobs(logits: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature) at ``ids`` (and the entropy of that distribution) per
    position: logits [..., T, V], ids [..., T] → [..., T] each, in fp32.

    The same values as ``log_softmax(logits.float() / temperature).gather(ids)``, but computed in
    blocks of positions (``LOGIT_BLOCK_ENTRIES``), forward and backward: only the logits are kept for
    backward, and fp32 temporaries exist for one block at a time. The whole-tensor log-softmax held
    four fp32 copies of every entry in its backward; on an H200 the blocks took the peak of a
    Qwen2.5-0.5B update (32 sequences of 512 tokens) from 55.9 to 37.7 GiB (docs/benchmarks.md)."""
    logp, entropy = _TokenLogprobs.apply(logits, ids, float(temperature), bool(with_entropy))
    return logp, (entropy if with_entropy else None)


def _blocks(shape: torch.Size) -> list[tuple[slice, slice]]:
    """(rows, positions) blocks of a [R, T, V] tensor with at most LOGIT_BLOCK_ENTRIES entries each
    (a single position of a vocabulary larger than that is one block)."""
    R, T, V = shape
    cols = max(1, min(T, LOGIT_BLOCK_ENTRIES // max(1, V)))
    rows = max(1, LOGIT_BLOCK_ENTRIES // max(1, cols * V)) if cols == T else 1
    return [(slice(r, min(R, r + rows)), slice(t, min(T, t + cols)))
            for r in range(0, R, rows) for t in range(0, T, cols)]


def _as_rows(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., T, V] and ids [..., T] as [R, T, V] and [R, T] (views where the layout allows)."""
    x = logits.flatten(0, -3) if logits.dim() > 3 else logits
    i = ids.flatten(0, -2) if ids.dim() > 2 else ids
    return (x.unsqueeze(0), i.unsqueeze(0)) if x.dim() == 2 else (x, i)


class _TokenLogprobs(torch.autograd.Function):
    """token_logprobs' blocks. Forward keeps per position the log-partition ``lse`` and the entropy
    ``H`` (fp32, [..., T]); backward recomputes each block's probabilities p = exp(z − lse), with
    z = logits / temperature, and writes the logits' gradient block by block:
    ∂logp/∂z = onehot(id) − p and ∂H/∂z = −p ⊙ (log p + H)."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, with_entropy):  # noqa: ANN001, ANN205
        x, i = _as_rows(logits, ids)
        lse = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        logp = torch.empty_like(lse)
        ent = torch.zeros_like(lse) if with_entropy else lse.new_zeros(())
        for r, t in _blocks(x.shape):
            z = x[r, t].float() / temperature
            lse[r, t] = torch.logsumexp(z, dim=-1)
            logp[r, t] = z.gather(-1, i[r, t].unsqueeze(-1)).squeeze(-1) - lse[r, t]
            if with_entropy:
                ent[r, t] = lse[r, t] - (torch.softmax(z, dim=-1) * z).sum(-1)
            del z
        ctx.save_for_backward(logits, ids, lse, ent)
        ctx.temperature, ctx.with_entropy = temperature, with_entropy
        shape = ids.shape
        return logp.reshape(shape), (ent.reshape(shape) if with_entropy else ent)

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # noqa: ANN001, ANN205
        logits, ids, lse, ent = ctx.saved_tensors
        x, i = _as_rows(logits, ids)
        g_logp = g_logp.reshape(lse.shape).float() if g_logp is not None else torch.zeros_like(lse)
        use_ent = ctx.with_entropy and g_ent is not None
        if use_ent:
            g_ent = g_ent.reshape(lse.shape).float()
        grad = torch.empty(x.shape, dtype=logits.dtype, device=logits.device)
        for r, t in _blocks(x.shape):
            z = x[r, t].float() / ctx.temperature
            log_p = z - lse[r, t].unsqueeze(-1)
            p = log_p.exp()
            gz = p * (-g_logp[r, t].unsqueeze(-1))
            gz.scatter_add_(-1, i[r, t].unsqueeze(-1), g_logp[r, t].unsqueeze(-1))
            if use_ent:
                gz -= g_ent[r, t].unsqueeze(-1) * p * (log_p + ent[r, t].unsqueeze(-1))
            grad[r, t] = gz / ctx.temperature
            del z, log_p, p, gz
        return grad.reshape(logits.shape), None, None, None



# ----------------------------------------------------------------------------- one step

@dataclass
class TrainBatch:
    """The kept rollouts of a step, packed for the update.

    prompt_ids / prompt_mask: [G, Lp], one row per prompt, left-padded; group: [B] the
    prompt row of each sequence; completion_ids / completion_mask: [B, T], right-padded;
    advantages: [B]. ``input_ids`` / ``attention_mask`` give the ``[pad… prompt |
    completion …pad]`` rows ([B, Lp + T]) for models that run whole sequences. ``seed_widths``
    (``stack_batches``' batches only): per seed the (Lp, T) of its own batch before stacking.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    group: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    advantages: torch.Tensor
    seed_widths: tuple[tuple[int, int], ...] | None = None

    @property
    def completion_width(self) -> int:
        return self.completion_mask.shape[1]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat((self.prompt_ids.index_select(0, self.group), self.completion_ids), dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat((self.prompt_mask.index_select(0, self.group), self.completion_mask), dim=1)

    @property
    def prompt_lens(self) -> list[int]:
        return self.prompt_mask.sum(1).tolist()

    @property
    def completion_lens(self) -> list[int]:
        return self.completion_mask.sum(1).tolist()


def _pad(rows: Sequence[Sequence[Any]], pad_id: Any, *, left: bool,
         dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(max((len(r) for r in rows), default=0), 1)
    fill = [[pad_id] * (width - len(r)) for r in rows]
    ids = torch.tensor([f + list(r) if left else list(r) + f for r, f in zip(rows, fill)], dtype=dtype)
    lens = torch.tensor([len(r) for r in rows])
    cols = torch.arange(width)
    mask = (cols >= width - lens[:, None]) if left else (cols < lens[:, None])
    return ids, mask.long()


def right_padded(values: Sequence[Sequence[float]]) -> torch.Tensor:
    """Per-token values of the completions (the sampler's log-probs), right-padded with 0 in fp32:
    [B, T], aligned with ``pack``'s ``completion_ids`` of the same completions."""
    return _pad(values, 0.0, left=False, dtype=torch.float32)[0]


def pack(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], group: Sequence[int],
         advantages: Sequence[float], pad_id: int, device: torch.device | str = "cpu") -> TrainBatch:
    """Pack prompts (one per group) and completions (``group[i]`` names completion i's prompt)."""
    pids, pmask = _pad(prompt_ids, pad_id, left=True)
    cids, cmask = _pad(completion_ids, pad_id, left=False)
    return TrainBatch(pids.to(device), pmask.to(device), torch.tensor(list(group), dtype=torch.long, device=device),
                      cids.to(device), cmask.to(device),
                      torch.tensor(list(advantages), dtype=torch.float32, device=device))


@dataclass
class UpdateStats:
    loss: float
    clip_fraction: float
    kl: float
    entropy: float
    sync: "SyncGap | None" = None


@dataclass(frozen=True)
class SyncGap:
    """The sync check of one step: the sampler's log-prob of each sampled token against the training
    model's, before the step's first optimizer step (both under the tempered distribution, before
    top-p). ``mean_abs``: mean |Δ log p| over completion tokens; ``max_ratio``: the largest
    importance ratio π_train / π_sample of a token. A healthy run gives rounding noise (fp32 on CPU:
    ~1e-7); rollouts from stale weights (a LoRA update that did not reach the sampler) give a gap
    of the size of one step's change or more."""

    mean_abs: float
    max_ratio: float


def sync_gap(train_logp: torch.Tensor, sample_logp: torch.Tensor, mask: torch.Tensor) -> SyncGap:
    """``SyncGap`` of [B, T] log-probs over the positions where ``mask`` is set."""
    m = mask.bool()
    d = (train_logp.detach().float() - sample_logp.to(train_logp.device).float())[m]
    if d.numel() == 0:
        return SyncGap(0.0, 1.0)
    return SyncGap(float(d.abs().mean()), float(d.max().exp()))


def micro_batches(batch: TrainBatch, size: int | None) -> list[TrainBatch]:
    """Split a batch into consecutive whole prompt groups of at most ``size`` sequences each (a
    group larger than ``size`` stays whole). ``None`` or a size ≥ the batch: the batch itself."""
    B = batch.group.shape[0]
    if not size or size >= B:
        return [batch]
    groups = batch.group.tolist()
    runs, start = [], 0                   # (start, end) of each run of one prompt's sequences
    for i in range(1, B + 1):
        if i == B or groups[i] != groups[i - 1]:
            runs.append((start, i))
            start = i
    bounds: list[tuple[int, int]] = []
    for lo, hi in runs:
        if bounds and hi - bounds[-1][0] <= size:
            bounds[-1] = (bounds[-1][0], hi)
        else:
            bounds.append((lo, hi))
    out = []
    for lo, hi in bounds:
        rows = sorted(set(groups[lo:hi]))
        remap = {g: i for i, g in enumerate(rows)}
        idx = torch.tensor(rows, dtype=torch.long, device=batch.group.device)
        out.append(TrainBatch(batch.prompt_ids.index_select(0, idx), batch.prompt_mask.index_select(0, idx),
                              torch.tensor([remap[g] for g in groups[lo:hi]], dtype=torch.long,
                                           device=batch.group.device),
                              batch.completion_ids[lo:hi], batch.completion_mask[lo:hi], batch.advantages[lo:hi]))
    return out


def _chunk_weight(chunk: TrainBatch, batch: TrainBatch, loss_agg: str) -> float:
    """Factor that turns a micro-batch's aggregated loss into its share of the whole batch's."""
    if loss_agg == "dapo":
        return float(chunk.completion_mask.sum()) / max(float(batch.completion_mask.sum()), 1.0)
    return chunk.group.shape[0] / batch.group.shape[0]          # grpo, dr_grpo: per-sequence means


def update(policy, optimizer, batch: TrainBatch, *, mu: int, temperature: float, clip_eps: float,
           loss_agg: str, clip_eps_high: float | None = None, max_completion_len: int, beta: float = 0.0, entropy_coef: float = 0.0,
           max_grad_norm: float | None = 1.0, micro_batch: int | None = None, lr_scheduler=None,
           sample_logprobs: torch.Tensor | None = None) -> UpdateStats:
    """μ clipped policy-gradient iterations on one batch, one optimizer step each: ``update_seeds``
    for one seed without a seed axis (the same code, so solo and lockstep pilots cannot drift apart).

    Iteration 1's log-probs, detached, are the old-policy log-probs (the policy has
    not moved yet); the reference log-probs (β > 0) come from the same model with
    the adapter disabled, once per batch. ``micro_batch``: run the forward/backward in
    chunks of whole prompt groups of at most that many sequences, accumulating the
    gradient (each chunk's loss weighted by its share of the batch, so the step is the
    full batch's); the FLOPs are the same, the activation memory that of one chunk.
    ``lr_scheduler`` (a torch LR scheduler, e.g. ``race.engine.loop.lr_scheduler``) steps after each
    optimizer step, so a schedule counts optimizer steps: μ per call. ``sample_logprobs`` ([B, T],
    aligned with ``batch.completion_mask``): the rollout backend's log-prob of each sampled token;
    the result's ``sync`` compares them with iteration 1's (``sync_gap``), at no extra cost.
    """
    return update_seeds(policy, [optimizer], [batch], mu=mu, temperature=temperature, clip_eps=clip_eps,
                        clip_eps_high=clip_eps_high, loss_agg=loss_agg, max_completion_len=max_completion_len, beta=beta,
                        entropy_coef=entropy_coef, max_grad_norm=max_grad_norm, micro_batch=micro_batch,
                        lr_schedulers=[lr_scheduler], sample_logprobs=[sample_logprobs], seed_axis=False)[0]


# ----------------------------------------------------------------------------- lockstep (a seed axis)

def stack_batches(batches: Sequence[TrainBatch], pad_id: int) -> TrainBatch:
    """Per-seed batches of one shape (same prompts and sequences per seed) as one ``TrainBatch`` with
    a leading seed axis: prompt_ids / prompt_mask [S, G, Lp] (left-padded to the widest seed),
    group [S, B], completion_ids / completion_mask [S, B, Lc] (right-padded), advantages [S, B],
    ``seed_widths`` each seed's own (Lp, Lc). Padding only adds masked positions, which change no
    real one (race.engine.backends.lockstep); the reductions over a seed's positions (its adapter
    gradient, its loss) run over its own widths only, so its numbers stay its solo pilot's."""
    if len(batches) == 1:               # one seed: views with an axis of 1, no copy
        b = batches[0]
        return TrainBatch(*(t.unsqueeze(0) for t in (b.prompt_ids, b.prompt_mask, b.group, b.completion_ids,
                                                     b.completion_mask, b.advantages)))
    G, B = batches[0].prompt_ids.shape[0], batches[0].group.shape[0]
    if any(b.prompt_ids.shape[0] != G or b.group.shape[0] != B for b in batches):
        raise ValueError("lockstep batches need the same prompts and sequences per seed: got "
                         f"{[(b.prompt_ids.shape[0], b.group.shape[0]) for b in batches]}")
    Lp = max(b.prompt_ids.shape[1] for b in batches)
    Lc = max(b.completion_ids.shape[1] for b in batches)

    def left(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (Lp - t.shape[1], 0), value=fill)

    def right(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, Lc - t.shape[1]), value=fill)

    return TrainBatch(torch.stack([left(b.prompt_ids, pad_id) for b in batches]),
                      torch.stack([left(b.prompt_mask, 0) for b in batches]),
                      torch.stack([b.group for b in batches]),
                      torch.stack([right(b.completion_ids, pad_id) for b in batches]),
                      torch.stack([right(b.completion_mask, 0) for b in batches]),
                      torch.stack([b.advantages for b in batches]),
                      tuple((b.prompt_ids.shape[1], b.completion_ids.shape[1]) for b in batches))


def _seed_slice(batch: TrainBatch, s: int) -> TrainBatch:
    return TrainBatch(batch.prompt_ids[s], batch.prompt_mask[s], batch.group[s], batch.completion_ids[s],
                      batch.completion_mask[s], batch.advantages[s])


def update_seeds(policy, optimizers: Sequence[Any], batches: Sequence[TrainBatch], *, mu: int, temperature: float,
                 clip_eps: float, loss_agg: str, max_completion_len: int, beta: float = 0.0,
                 clip_eps_high: float | None = None, entropy_coef: float = 0.0, max_grad_norm: float | None = 1.0, micro_batch: int | None = None,
                 lr_schedulers: Sequence[Any] | None = None, pad_id: int = 0,
                 sample_logprobs: Sequence[torch.Tensor | None] | None = None,
                 seed_axis: bool = True) -> list[UpdateStats]:
    """``update`` for the active seeds of a lockstep policy (race.engine.backends.lockstep) at once.

    ``batches[s]`` is seed s's batch, ``optimizers[s]`` its optimizer over its own adapter (and
    ``lr_schedulers[s]`` its schedule). Each iteration runs one forward and one backward over all
    seeds (the seeds' losses summed: their adapters are disjoint, so each gets exactly its own
    loss's gradient), then clips and steps each seed apart. Micro-batches split every seed at the
    same prompt-group boundaries (equal shapes). Returns per seed what ``update`` returns.
    ``seed_axis=False``: one seed on a plain policy, its tensors without the leading seed axis
    (what ``update`` runs)."""
    S = len(batches)
    if not seed_axis and S != 1:
        raise ValueError(f"update without a seed axis takes one batch, got {S}")
    per_seed_chunks, chunks = _seed_chunks(batches, micro_batch, pad_id, seed_axis)
    n_chunks = len(per_seed_chunks[0])
    weights = [[_chunk_weight(c[k], b, loss_agg) for k in range(n_chunks)] for c, b in zip(per_seed_chunks, batches)]
    widths = [[c[k].completion_width for k in range(n_chunks)] for c in per_seed_chunks]
    refs: list[torch.Tensor | None] = [None] * n_chunks
    if beta > 0:
        with torch.no_grad(), policy.disable_adapter():
            refs = [completion_logprobs(policy, c, temperature=temperature)[0] for c in chunks]
    olds: list[torch.Tensor | None] = [None] * n_chunks
    params = [[p for group in opt.param_groups for p in group["params"]] for opt in optimizers]
    stats: list[list[UpdateStats]] = [[] for _ in range(S)]
    loss_kw = dict(clip_eps=clip_eps, clip_eps_high=clip_eps_high, loss_agg=loss_agg,
                   max_completion_len=max_completion_len, beta=beta, entropy_coef=entropy_coef)
    for _ in range(mu):
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        acc = [[0.0, 0.0, 0.0, 0.0] for _ in range(S)]
        for k, chunk in enumerate(chunks):
            logp, entropy = completion_logprobs(policy, chunk, temperature=temperature,
                                                with_entropy=entropy_coef > 0)        # [S, B, Lc]
            if olds[k] is None:
                olds[k] = logp.detach()
            total = _seeds_loss(logp, olds[k], refs[k], entropy, chunk, [w[k] for w in weights],
                                [w[k] for w in widths], acc, seed_axis=seed_axis, weighted=n_chunks > 1,
                                loss_kw=loss_kw)
            total.backward()
        for s in range(S):
            _step_seed(optimizers[s], params[s], None if lr_schedulers is None else lr_schedulers[s], max_grad_norm)
            stats[s].append(UpdateStats(*acc[s]))
    out = []
    for s in range(S):
        sync = None
        if sample_logprobs is not None and sample_logprobs[s] is not None:
            # each chunk of a seed has the seed's own batch width (micro_batches slices rows only):
            # drop the columns the other seeds' widths added
            old = torch.cat([_of_seed(olds[k], s, seed_axis)[:, :widths[s][k]] for k in range(n_chunks)])
            sync = sync_gap(old, sample_logprobs[s], batches[s].completion_mask)
        out.append(_mean_stats(stats[s], sync))
    return out


def _seed_chunks(batches: Sequence[TrainBatch], micro_batch: int | None, pad_id: int,
                 seed_axis: bool) -> tuple[list[list[TrainBatch]], list[TrainBatch]]:
    """(per seed its micro-batches, the micro-batches the policy runs): with a seed axis the k-th
    micro-batches of all seeds stacked into one; without, the one seed's own."""
    per_seed_chunks = [micro_batches(b, micro_batch) for b in batches]
    n_chunks = len(per_seed_chunks[0])
    if seed_axis:
        chunks = [stack_batches([c[k] for c in per_seed_chunks], pad_id) for k in range(n_chunks)]
    else:
        chunks = per_seed_chunks[0]
    return per_seed_chunks, chunks


def _of_seed(t: Any, s: int, seed_axis: bool) -> Any:
    """Seed s's slice of ``t`` (the whole tensor without a seed axis; None stays None)."""
    return t if t is None or not seed_axis else t[s]


def _seeds_loss(logp: torch.Tensor, old: torch.Tensor, ref: torch.Tensor | None, entropy: torch.Tensor | None,
                chunk: TrainBatch, weights: Sequence[float], widths: Sequence[int], acc: list[list[float]], *,
                seed_axis: bool, weighted: bool, loss_kw: dict) -> torch.Tensor:
    """The summed loss of one micro-batch over the seeds (each seed's ``policy_loss`` times its chunk
    weight ``weights[s]`` when there are several micro-batches), seed by seed in order; adds each
    seed's weighted loss, clip fraction, KL and entropy to ``acc[s]``. Each seed's loss reads only
    its own ``widths[s]`` completion columns: a sum's rounding follows its length, padding included."""
    total = None
    for s, (w, width) in enumerate(zip(weights, widths)):
        own = [_of_seed(t, s, seed_axis) for t in (logp, old, chunk.completion_mask, ref, entropy)]
        own = [t if t is None else t[:, :width] for t in own]
        terms = policy_loss(own[0], own[1], _of_seed(chunk.advantages, s, seed_axis), own[2], ref_logp=own[3],
                            entropy=own[4], **loss_kw)
        term = terms.loss * w if weighted else terms.loss
        total = term if total is None else total + term
        a = acc[s]
        a[0] += float(terms.loss.detach()) * w
        a[1], a[2], a[3] = a[1] + terms.clip_fraction * w, a[2] + terms.kl * w, a[3] + terms.entropy * w
    return total


def _step_seed(optimizer: Any, params: Sequence[torch.Tensor], lr_scheduler: Any | None,
               max_grad_norm: float | None) -> None:
    """One seed's optimizer step: its gradient clipped to ``max_grad_norm`` (when set), then its
    optimizer and its schedule (when it has one) stepped."""
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True)
    optimizer.step()
    if lr_scheduler is not None:
        lr_scheduler.step()


def _mean_stats(stats: Sequence[UpdateStats], sync: SyncGap | None) -> UpdateStats:
    """One seed's ``UpdateStats`` averaged over its μ iterations, with its sync gap."""
    n = len(stats)
    return UpdateStats(sum(x.loss for x in stats) / n, sum(x.clip_fraction for x in stats) / n,
                       sum(x.kl for x in stats) / n, sum(x.entropy for x in stats) / n, sync)
