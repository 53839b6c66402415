"""Probe: does torch.compile of the decode step / the update pay within one pilot?

usage: python bench.py WHICH(arith|reasoner) PART(update|decode) VARIANT [N]
Replays recorded real batches (capture.py) through the eager and the compiled path alternately on
the same policy; prints one JSON line with compile cost, steady per-call CPU/wall medians, agreement.
"""
import json, os, sys, time, pickle, statistics, resource
import torch
import torch.nn.functional as F
torch.set_num_threads(1)
import torch._inductor.config as icfg
icfg.compile_threads = 1            # compile in-process: process_time() then includes the compile CPU
import torch._dynamo
from torch._dynamo.utils import counters
from common import engine, grpo, hf, med
from race.engine.backends.lean import LeanLM, rms_norm

which, part, variant = sys.argv[1], sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 else 0
rec = pickle.load(open(f"rec_{which}.pkl", "rb"))
cfg, sch, e, train = engine(which)
pol, opt = e.policy, e.optimizer

def cc(fn, **kw):
    return torch.compile(fn, **kw)

MODES = {"dyn": dict(dynamic=True), "auto": dict(), "maxat": dict(dynamic=True, mode="max-autotune-no-cudagraphs"),
         "maxat_auto": dict(mode="max-autotune-no-cudagraphs")}

# ------------------------------------------------------------------ update variants
orig_clp, orig_pl, orig_blocks = grpo.completion_logprobs, grpo.policy_loss, LeanLM._blocks

def lsm_gather(logits, ids, temperature: float):
    logsm = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logsm.gather(-1, ids.unsqueeze(-1)).squeeze(-1)

def pl_core(logp, old_logp, adv, mask, clip_eps: float):
    ratio = torch.exp(logp - old_logp)
    a = adv.unsqueeze(1)
    un = ratio * a
    cl = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * a
    per = -torch.minimum(un, cl)
    m = mask.to(per.dtype)
    loss = (per * m).sum() / m.sum().clamp(min=1)
    clipfrac = ((((un - cl).abs() > 0) & mask.bool()).sum() / m.sum().clamp(min=1)).detach()
    return loss, clipfrac

def rope(qk, cos, sin, half: int):
    return qk * cos + qk.roll(half, -1) * sin

def swiglu(gu):
    gate, up = gu.chunk(2, dim=-1)
    return F.silu(gate) * up

def make_blocks(rope_fn, swiglu_fn):
    def _blocks(self, x, cos, sin, attend, *, merged=False):
        H, Hkv, d = self.n_heads, self.n_kv, self.head_dim
        half = d // 2
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.norms["in"], self.eps)
            qkv = self._linear(i, layer, "qkv", h, merged)
            qk, v = qkv[..., :layer.q_dim + layer.kv_dim].unflatten(-1, (H + Hkv, d)), qkv[..., -layer.kv_dim:]
            qk = rope_fn(qk, cos, sin, half)
            q, k = qk.split((H, Hkv), dim=-2)
            a = attend(i, q, k, v.unflatten(-1, (Hkv, d)))
            x = x + self._linear(i, layer, "o", a, merged)
            h = rms_norm(x, layer.norms["post"], self.eps)
            x = x + self._linear(i, layer, "down", swiglu_fn(self._linear(i, layer, "gate_up", h, merged)), merged)
        return x
    return _blocks

eager_blocks = make_blocks(rope, swiglu)     # same ops as LeanLM._blocks (checked below for agreement)

orig_linear = LeanLM._linear

def plain_linear(self, i, layer, group, x, merged):
    """LeanLM._linear with the adapter as plain autograd ops (dynamo cannot trace _LoRAGroup:
    'lift_tracked_freevar_to_input should not be called on root SubgraphTracer'); same products."""
    bias = layer.b.get(group)
    if merged and group in layer.merged:
        return F.linear(x, layer.merged[group], bias)
    members = layer.slices[group] if self._adapter_on else ()
    y = F.linear(x, layer.w[group], bias)
    if not members:
        return y
    A_all = torch.cat([self.lora[f"{i}_{name}_A"] for name, _ in members])
    xa = F.linear(x, A_all) * self.scale
    r = self.rank
    pieces, at = [], 0
    for j, (name, (lo, hi)) in enumerate(members):
        if lo > at:
            pieces.append(y.new_zeros(*y.shape[:-1], lo - at))
        pieces.append(F.linear(xa[..., j * r:(j + 1) * r], self.lora[f"{i}_{name}_B"]))
        at = hi
    if at < y.shape[-1]:
        pieces.append(y.new_zeros(*y.shape[:-1], y.shape[-1] - at))
    return y + (torch.cat(pieces, -1) if len(pieces) > 1 else pieces[0])

def setup_update(variant):
    base, mode = variant.split(":") if ":" in variant else (variant, "dyn")
    kw = MODES[mode]
    if base == "full":                       # forward_grouped + log_softmax + gather (fwd + AOT bwd)
        c = cc(orig_clp, **kw)
        def on(): grpo.completion_logprobs = c
        def off(): grpo.completion_logprobs = orig_clp
    elif base == "fullplain":                # the same, the adapter as plain ops (AOT makes the backward)
        c = cc(orig_clp, **kw)
        def on(): grpo.completion_logprobs, LeanLM._linear = c, plain_linear
        def off(): grpo.completion_logprobs, LeanLM._linear = orig_clp, orig_linear
    elif base == "eagerplain":               # no compile: plain-op adapter, to separate its effect
        def on(): LeanLM._linear = plain_linear
        def off(): LeanLM._linear = orig_linear
    elif base == "fwdgrouped":               # only the model's forward_grouped
        c = cc(LeanLM.forward_grouped, **kw)
        def on(): LeanLM.forward_grouped = c
        def off(): LeanLM.forward_grouped = orig_fg
        orig_fg = LeanLM.forward_grouped
    elif base == "tail":                     # log_softmax/gather and the loss arithmetic only
        clg, cpl = cc(lsm_gather, **kw), cc(pl_core, **kw)
        def clp(model, batch, *, temperature=1.0, with_entropy=False):
            logits = model.forward_grouped(batch.prompt_ids, batch.prompt_mask, batch.group,
                                           batch.completion_ids, batch.completion_mask)
            return clg(logits, batch.completion_ids, temperature), None
        def pl(logp, old_logp, advantages, mask, *, clip_eps=0.2, **k):
            loss, cf = cpl(logp, old_logp, advantages, mask, clip_eps)
            return grpo.LossTerms(loss, float(cf), 0.0, 0.0)
        def on(): grpo.completion_logprobs, grpo.policy_loss = clp, pl
        def off(): grpo.completion_logprobs, grpo.policy_loss = orig_clp, orig_pl
    elif base == "blocks":                   # rope and swiglu elementwise parts of each block
        cb = make_blocks(cc(rope, **kw), cc(swiglu, **kw))
        def on(): LeanLM._blocks = cb
        def off(): LeanLM._blocks = orig_blocks
    else:
        raise SystemExit(f"unknown variant {variant}")
    return on, off

# ------------------------------------------------------------------ decode variants
orig_prefill = hf._prefill

def setup_decode(variant):
    base, mode = variant.split(":") if ":" in variant else (variant, "dyn")
    kw = MODES[mode]
    if base == "stepfwd":                    # the whole decode-step forward (LeanLM.forward with cache)
        cfwd = cc(LeanLM.forward, **kw)
        def prefill(model, ids, mask, pos, *, n, max_len):
            cache = model.new_cache(ids.shape[0], max_len)
            out = model(ids, mask, pos, cache=cache, logits_to_keep=1, merged=True)
            cache = LeanLM.repeat_cache(cache, n)
            def step(tok, m, p):
                return cfwd(model, tok, m, p, cache=cache, merged=True).logits[:, -1, :]
            def select(keep):
                cache.k = [t.index_select(0, keep) for t in cache.k]
                cache.v = [t.index_select(0, keep) for t in cache.v]
            return out.logits[:, -1, :].repeat_interleave(n, dim=0), step, select
        def on(): hf._prefill = prefill
        def off(): hf._prefill = orig_prefill
    elif base == "blocks":
        cb = make_blocks(cc(rope, **kw), cc(swiglu, **kw))
        def on(): LeanLM._blocks = cb
        def off(): LeanLM._blocks = orig_blocks
    else:
        raise SystemExit(f"unknown variant {variant}")
    return on, off

# ------------------------------------------------------------------ driver
def cstats():
    return (sum(counters["stats"].values()) if "stats" in counters else 0, dict(counters["stats"]),
            sum(counters["graph_break"].values()))

def cpu_now():
    # this process + its finished children (inductor's g++ runs are child processes)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime

calls = {"eager": [], "compiled": []}   # (cpu, wall, compiled_something)

def timed(fn):
    before = counters["stats"].get("unique_graphs", 0)
    t, w = cpu_now(), time.perf_counter()
    r = fn()
    return r, cpu_now() - t, time.perf_counter() - w, counters["stats"].get("unique_graphs", 0) - before

agree = {}
if part == "update":
    on, off = setup_update(variant)
    items = rec["update"]
    def run(i):
        b, kw = items[i % len(items)]
        return grpo.update(pol, opt, b, **kw)
    # agreement on the first batch, same weights: log-probs and adapter gradients
    b, kw = items[0]
    def lp_grad():
        opt.zero_grad(set_to_none=True)
        logp, _ = grpo.completion_logprobs(pol, b, temperature=kw["temperature"])
        terms = grpo.policy_loss(logp, logp.detach() - 0.01 * b.completion_mask, b.advantages, b.completion_mask,
                                 clip_eps=kw["clip_eps"], loss_agg=kw["loss_agg"])
        terms.loss.backward()
        g = torch.cat([p.grad.flatten() for p in pol.parameters() if p.grad is not None])
        opt.zero_grad(set_to_none=True)
        return logp.detach(), g
    # a non-zero B first, so that gradients reach A too
    for _ in range(3):
        run(0)
    (lp_e, g_e), _, _, _ = timed(lp_grad)
    on(); (lp_c, g_c), cpu0, wall0, ng0 = timed(lp_grad); off()
    m = b.completion_mask.bool()
    agree = {"logp_maxabs": float((lp_e - lp_c)[m].abs().max()), "grad_maxabs": float((g_e - g_c).abs().max()),
             "grad_maxrel": float((g_e - g_c).abs().max() / g_e.abs().max()), "first_call_cpu": cpu0,
             "first_call_wall": wall0}
else:
    on, off = setup_decode(variant)
    items = rec["sample"]
    def run(i):
        p, kw = items[i % len(items)]
        g = torch.Generator().manual_seed(1000 + i)
        lps = []
        out = hf.sample(pol, p, generator=g, logprobs=lps, **kw)
        return out, lps
    for _ in range(2):
        pol.merge()
    on(); (_, cpu0, wall0, ng0) = timed(lambda: run(0)); off()
    agree = {"first_call_cpu": cpu0, "first_call_wall": wall0}

n = N or max(len(items), 20)
same_tokens, lp_diff = 0, 0.0
for i in range(n):
    if part == "decode":
        pol.merge()                    # new merged-weight tensors each step, as after a real update
    order = ("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")
    res = {}
    for path in order:
        (on if path == "compiled" else off)()
        if part == "update":          # same weights for both paths: restore after the first
            if path == order[0]:
                saved = [p.detach().clone() for p in pol.parameters()]
                saved_opt = {k: {kk: (vv.clone() if torch.is_tensor(vv) else vv) for kk, vv in s.items()}
                             for k, s in opt.state.items()}
            else:
                with torch.no_grad():
                    for p, s in zip(pol.parameters(), saved):
                        p.copy_(s)
                for k, s in saved_opt.items():
                    opt.state[k] = s
        r, cpu, wall, ng = timed(lambda: run(i))
        calls[path].append((cpu, wall, ng))
        res[path] = r
        off()
    if part == "decode":
        same_tokens += res["eager"][0] == res["compiled"][0]
        if res["eager"][0] == res["compiled"][0]:
            for ge, gc in zip(res["eager"][1], res["compiled"][1]):
                for re_, rc in zip(ge, gc):
                    lp_diff = max(lp_diff, max((abs(a - c) for a, c in zip(re_, rc)), default=0.0))
if part == "decode":
    agree.update(same_tokens=f"{same_tokens}/{n}", logprob_maxabs=lp_diff)

steady = [c for c in calls["compiled"] if c[2] == 0]
eager = calls["eager"]
med_e_cpu, med_e_wall = med([c[0] for c in eager]), med([c[1] for c in eager])
med_c_cpu, med_c_wall = med([c[0] for c in steady]), med([c[1] for c in steady])
compiling = [c for c in calls["compiled"] if c[2] > 0]
# compile cost: the first call plus every call that compiled a graph, less what a steady call costs
comp_cpu = agree.get("first_call_cpu", 0) - med_c_cpu + sum(c[0] - med_c_cpu for c in compiling)
comp_wall = agree.get("first_call_wall", 0) - med_c_wall + sum(c[1] - med_c_wall for c in compiling)
save_cpu, save_wall = med_e_cpu - med_c_cpu, med_e_wall - med_c_wall
out = dict(which=which, part=part, variant=variant, n=n, unique_graphs=counters["stats"].get("unique_graphs", 0),
           graph_breaks=sum(counters["graph_break"].values()), graphs_first_call=ng0, recompiling_calls=len(compiling),
           compile_cpu_s=round(comp_cpu, 2), compile_wall_s=round(comp_wall, 2),
           eager_cpu_ms=round(med_e_cpu * 1e3, 2), comp_cpu_ms=round(med_c_cpu * 1e3, 2),
           eager_wall_ms=round(med_e_wall * 1e3, 2), comp_wall_ms=round(med_c_wall * 1e3, 2),
           save_cpu_ms=round(save_cpu * 1e3, 2), save_wall_ms=round(save_wall * 1e3, 2),
           breakeven_steps_cpu=(round(comp_cpu / save_cpu) if save_cpu > 0 else None),
           breakeven_steps_wall=(round(comp_wall / save_wall) if save_wall > 0 else None),
           **{k: (round(v, 8) if isinstance(v, float) else v) for k, v in agree.items()})
if dict(counters["graph_break"]):
    out["graph_break_reasons"] = {k[:120]: v for k, v in list(counters["graph_break"].items())[:5]}
print("RESULT " + json.dumps(out))
