"""Does this CPU's attention kernel round a query the same when masked keys join its row?

race.engine.backends.lockstep pads a group's seeds to the widest seed's prompts and completions; a seed
equals its solo pilot bit for bit only where padding changes no real position. Plain matmuls are row-exact
on every CPU measured so far, but torch's CPU SDPA is not on all of them (docs/benchmarks.md, "Equivalence
with the solo engine"). This prints, per shape, whether appending or prepending masked keys changes the
output, and the largest difference.

    OMP_NUM_THREADS=1 python bench/sdpa_padding.py
"""
from __future__ import annotations

import platform

import torch
import torch.nn.functional as F


def cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> None:
    torch.manual_seed(0)
    rows, heads, d = 64, 4, 32
    print(f"torch {torch.__version__}, {cpu_name()}, {torch.backends.cpu.get_cpu_capability()}")
    for T, K, pad in [(6, 6, 2), (4, 4, 3), (6, 12, 4), (5, 11, 1)]:
        q, k, v = torch.randn(rows, heads, T, d), torch.randn(rows, heads, K, d), torch.randn(rows, heads, K, d)
        mask = torch.ones(rows, 1, T, K, dtype=torch.bool).tril(diagonal=K - T)
        base = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        extra = torch.randn(rows, heads, pad, d)
        off = torch.zeros(rows, 1, T, pad, dtype=torch.bool)
        for side, (kk, vv, mm) in {"appended": ((k, extra), (v, extra), (mask, off)),
                                   "prepended": ((extra, k), (extra, v), (off, mask))}.items():
            out = F.scaled_dot_product_attention(q, torch.cat(kk, 2), torch.cat(vv, 2), attn_mask=torch.cat(mm, 3))
            print(f"T {T}, K {K}, {pad} masked keys {side}: equal {torch.equal(base, out)}, "
                  f"max |diff| {float((base - out).abs().max()):.2e}")


if __name__ == "__main__":
    main()
