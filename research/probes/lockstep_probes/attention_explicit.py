"""SDPA against attention as explicit matmuls, at the default grid's update and decode shapes (one thread).

    PYTHONPATH=. python research/probes/lockstep_probes/attention_explicit.py

The explicit form groups each key/value head's query heads as extra query rows ([N, H_kv, g·T, d]), so
no key or value is copied for GQA. Prints the median of 50 forward (+ backward where the update needs
it) times per shape, and the largest difference between the two outputs.
"""
import math
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)


def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def explicit(q, k, v, mask):
    N, H, T, d = q.shape
    Hk = k.shape[1]
    g = H // Hk
    scores = (q.reshape(N, Hk, g * T, d) @ k.transpose(-1, -2)).mul_(1 / math.sqrt(d)).view(N, Hk, g, T, -1)
    p = torch.softmax(scores.masked_fill(~mask[:, :, None], float("-inf")), -1).view(N, Hk, g * T, -1)
    return (p @ v).view(N, H, T, d)


def median_us(f, shape, grad):
    N, H, T, K, Hk, d = shape
    q, k, v = (torch.randn(N, h, n, d, requires_grad=grad) for h, n in ((H, T), (Hk, K), (Hk, K)))
    mask = torch.ones(N, 1, T, K, dtype=torch.bool).tril(K - T)
    times = []
    for i in range(55):
        t = time.perf_counter()
        out = f(q, k, v, mask)
        if grad:
            out.backward(torch.ones_like(out))
        if i >= 5:
            times.append(time.perf_counter() - t)
    with torch.no_grad():
        diff = (sdpa(q, k, v, mask) - explicit(q, k, v, mask)).abs().max().item()
    return sorted(times)[len(times) // 2] * 1e6, diff


SHAPES = [  # (N, H, T, K, H_kv, d), with a backward?
    ((64, 4, 4, 10, 2, 32), True),     # a solo update's completions over prompt + completion keys
    ((8, 4, 6, 6, 2, 32), True),       # its prompts
    ((192, 4, 4, 10, 2, 32), True),    # a group of 3's completions
    ((64, 4, 1, 9, 2, 32), False),     # a solo decode step
    ((192, 4, 1, 9, 2, 32), False),    # a group's decode step
]
if __name__ == "__main__":
    for shape, grad in SHAPES:
        a, diff = median_us(sdpa, shape, grad)
        b, _ = median_us(explicit, shape, grad)
        print(f"{shape} {'fwd+bwd' if grad else 'fwd'}: sdpa {a:.0f} us, explicit {b:.0f} us, max diff {diff:.1e}")
