"""A LoRA-adapted projection group as ONE autograd node: ``LoRAGroupSeeds`` over a seed axis (one
adapter per seed: race.engine.backends.lockstep's group), ``LoRAGroup`` for one seed without it (a
solo pilot), and ``solo_rows``, which names each seed's own rows in a group's padded batch.

Invariants: both nodes compute the same products (peft's unmerged LoRA ones, which
``flops.learning_flops`` counts), so a seed's numbers in a group equal its solo pilot's bit for bit:
the products that reduce over the hidden size run over stacked rows (a row's result does not depend
on the others'), and the two that reduce over the token rows (the adapter gradients dA, dB) run per
seed over exactly its solo rows when the seeds were padded to other widths (``_rank_grads_by_seed``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class LoRAGroupSeeds(torch.autograd.Function):
    """y = x·Wᵀ + b + s·(x_s·A_{m,s}ᵀ)·B_{m,s}ᵀ for each adapted member m of a projection group
    (into m's output rows) and each seed s, as ONE autograd node: x [S, …, D], A_m [S, r, D],
    B_m [S, out_m, r].

    The base matmul runs once over all seeds' rows; the members' A matrices are stacked so that
    x·Aᵀ, the A-gradient and the input gradient through A each take one batched matmul (``bmm``
    over the seed axis) for the whole group. Every product is one that peft's unmerged LoRA
    computes too (so ``flops.learning_flops`` counts them), only fewer and larger: forward x·Wᵀ,
    x·A_allᵀ, then (·)·B_mᵀ per member; backward g·B_m and dB_m = gᵀ·(s·x·A_mᵀ) per member,
    dA_all = (s·g·B)ᵀ·x and, only when x needs a gradient, dx = g·W + (s·g·B)·A_all, each taken
    with the rank r as its row count (CPU GEMM kernels run a thin output of r columns 3–12×
    slower than the same product transposed). Autograd would build five nodes and a dozen small
    kernels per adapted layer; on small models that bookkeeping, not arithmetic, was the update's
    cost. ``rows`` (``solo_rows``; None when no seed was padded): the two products that reduce over
    token rows, dA and dB, then run per seed over its solo rows (``_rank_grads_by_seed``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale, slices, rows, *ab):
        S = x.shape[0]
        y = F.linear(x, weight, bias)
        x3 = x.reshape(S, -1, x.shape[-1])
        A_all = torch.cat(ab[0::2], dim=1) if len(slices) > 1 else ab[0]          # [S, k·r, D]
        r = ab[0].shape[1]
        y3 = y.view(S, -1, y.shape[-1])
        xa = torch.bmm(x3, A_all.to(x.dtype).transpose(1, 2)) * scale            # [S, M, k·r]
        for j, ((lo, hi), B) in enumerate(zip(slices, ab[1::2])):
            y3[..., lo:hi] += torch.bmm(xa[..., j * r:(j + 1) * r], B.to(x.dtype).transpose(1, 2))
        ctx.save_for_backward(x, weight, xa, A_all, *ab[1::2])
        ctx.scale, ctx.slices, ctx.rank, ctx.rows = scale, slices, r, rows
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight, xa, A_all, *Bs = ctx.saved_tensors
        S, r = x.shape[0], ctx.rank
        x3, g3 = x.reshape(S, -1, x.shape[-1]), g.reshape(S, -1, g.shape[-1])
        if ctx.rows is not None:       # seeds of other widths: each seed's reductions over its solo rows
            gbT, dA_all, dBs = _rank_grads_by_seed(x3, g3, xa, Bs, ctx.rows, ctx.slices, ctx.scale, r)
        else:
            gbTs, dBs = [], []         # rank-r products with r as the row count, as the solo group's
            for j, ((lo, hi), B) in enumerate(zip(ctx.slices, Bs)):
                gi = g3[..., lo:hi]
                gbTs.append(torch.bmm(B.to(g.dtype).transpose(1, 2), gi.transpose(1, 2)) * ctx.scale)   # [S, r, M]
                dBs.append(torch.bmm(xa[..., j * r:(j + 1) * r].transpose(1, 2), gi).transpose(1, 2))
            gbT = torch.cat(gbTs, dim=1) if len(gbTs) > 1 else gbTs[0]               # [S, k·r, M]
            dA_all = torch.bmm(gbT, x3)                                              # [S, k·r, D]
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = g @ weight + torch.bmm(gbT.transpose(1, 2), A_all.to(g.dtype)).view(x.shape)
        grads = []
        for j, (dB, B) in enumerate(zip(dBs, Bs)):
            grads += [dA_all[:, j * r:(j + 1) * r].to(A_all.dtype), dB.to(B.dtype)]
        return (grad_x, None, None, None, None, None, *grads)


def _rank_grads(x2, g2, xa2, Bs, slices, scale: float, r: int):
    """One seed's rank-r backward products over its N rows (``LoRAGroup``'s, and each seed's in
    ``_rank_grads_by_seed``): x2 [N, D], g2 [N, out], xa2 [N, k·r] → (gbT = s·(g·B)ᵀ [k·r, N],
    dA_all = gbT·x2 [k·r, D], dB_m = (gᵀ·xa_m)ᵀ per member [out_m, r]), r as the row count (CPU GEMM
    kernels run a thin output of r columns 3–12× slower than the same product transposed)."""
    gbTs, dBs = [], []
    for j, ((lo, hi), B) in enumerate(zip(slices, Bs)):
        gi = g2[:, lo:hi]
        gbTs.append((B.to(g2.dtype).t() @ gi.t()) * scale)                      # [r, N]
        dBs.append((xa2[:, j * r:(j + 1) * r].t() @ gi).t())                    # [out_j, r]
    gbT = torch.cat(gbTs) if len(gbTs) > 1 else gbTs[0]
    return gbT, gbT @ x2, dBs


def _rank_grads_by_seed(x3, g3, xa, Bs, rows, slices, scale: float, r: int):
    """``LoRAGroupSeeds``' rank-r backward products when the seeds were padded to other widths:
    seed s's are ``_rank_grads`` over exactly its solo pilot's rows, in its order (``rows[s]``, an
    index into the M stacked rows; None: all of them), so dA and dB reduce over the same number of
    rows in the same order as alone. A CPU GEMM splits a long reduction into blocks whose bounds
    follow its length: zero-gradient padding rows, wherever they sit, change the rounding once M is
    past one block (measured with torch 2.13's MKL sgemm: over 384 rows). Returns (gbT [S, k·r, M],
    zero at rows outside the seed's own, dA_all [S, k·r, D], dB per member [S, out_m, r])."""
    S, M = x3.shape[:2]
    gbT = g3.new_zeros(S, len(slices) * r, M)
    dAs, dBs = [], []
    for s in range(S):
        idx = rows[s]
        x_s, g_s, xa_s = (t[s] if idx is None else t[s].index_select(0, idx) for t in (x3, g3, xa))
        gbT_s, dA, dB = _rank_grads(x_s, g_s, xa_s, [B[s] for B in Bs], slices, scale, r)
        if idx is None:
            gbT[s] = gbT_s
        else:
            gbT[s].index_copy_(1, idx, gbT_s)
        dAs.append(dA)
        dBs.append(dB)
    return gbT, torch.stack(dAs), [torch.stack([d[j] for d in dBs]) for j in range(len(slices))]


class LoRAGroup(torch.autograd.Function):
    """``LoRAGroupSeeds`` for ONE seed, without the seed axis: x [..., D] (any leading shape), A_m
    [r, D], B_m [out_m, r], the seed's parameters themselves. The same products as the S-seed node
    (plain matmuls for its bmm), so a one-seed group's numbers equal its row of a group's; on a small
    model the seed axis's views and the per-parameter unsqueeze nodes cost ~10 % of the update, which
    a solo pilot does not pay."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale, slices, *ab):
        y = F.linear(x, weight, bias)
        A_all = torch.cat(ab[0::2]) if len(slices) > 1 else ab[0]                 # [k·r, D]
        xa = F.linear(x, A_all.to(x.dtype)) * scale                              # [..., k·r]
        r = ab[0].shape[0]
        for j, ((lo, hi), B) in enumerate(zip(slices, ab[1::2])):
            y[..., lo:hi] += F.linear(xa[..., j * r:(j + 1) * r], B.to(x.dtype))
        ctx.save_for_backward(x, weight, xa, A_all, *ab[1::2])
        ctx.scale, ctx.slices, ctx.rank = scale, slices, r
        return y

    @staticmethod
    def backward(ctx, g):
        x, weight, xa, A_all, *Bs = ctx.saved_tensors
        r = ctx.rank
        x2, g2, xa2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), xa.reshape(-1, xa.shape[-1])
        gbT, dA_all, dBs = _rank_grads(x2, g2, xa2, Bs, ctx.slices, ctx.scale, r)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (g2 @ weight + gbT.t() @ A_all.to(g.dtype)).view_as(x)
        grads = []
        for j, (dB, B) in enumerate(zip(dBs, Bs)):
            grads += [dA_all[j * r:(j + 1) * r].to(A_all.dtype), dB.to(B.dtype)]
        return (grad_x, None, None, None, None, *grads)


def solo_rows(widths, G: int, Lp: int, B: int, Lc: int, device) -> list | None:
    """Per seed, the rows of ``LockstepLM.forward_grouped``'s packed batch ([G·Lp prompt rows | B·Lc
    completion rows]) that its solo pilot's batch holds, in that batch's order: its prompts' last
    ``widths[s][0]`` positions, its completions' first ``widths[s][1]``. None for a seed whose widths
    are the stacked ones (all rows), and None in all when no seed's differ (or ``widths`` is None)."""
    if widths is None:
        return None
    out = []
    for lp, lc in widths:
        if (lp, lc) == (Lp, Lc):
            out.append(None)
            continue
        p = torch.arange(G, device=device)[:, None] * Lp + (Lp - lp) + torch.arange(lp, device=device)
        c = G * Lp + torch.arange(B, device=device)[:, None] * Lc + torch.arange(lc, device=device)
        out.append(torch.cat((p.reshape(-1), c.reshape(-1))))
    return out if any(r is not None for r in out) else None
