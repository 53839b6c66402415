import sys, pickle, time, torch
from common import *
which = sys.argv[1]
rec = pickle.load(open(f"rec_{which}.pkl", "rb"))
cfg, sch, e, train = engine(which)
pol = e.policy
# decode: time spent inside step() vs whole sample()
acc = {"step": 0.0, "prefill": 0.0}
orig_prefill = hf._prefill
def prefill(model, ids, mask, pos, **kw):
    t = time.process_time(); logits, step, select = orig_prefill(model, ids, mask, pos, **kw); acc["prefill"] += time.process_time() - t
    def st(*a):
        t = time.process_time(); r = step(*a); acc["step"] += time.process_time() - t; return r
    return logits, st, select
hf._prefill = prefill
tot = 0.0; ntok = 0
for p, kw in rec["sample"][:20]:
    g = torch.Generator().manual_seed(1); lps = []
    t = time.process_time(); out = hf.sample(pol, p, generator=g, logprobs=lps, **kw); tot += time.process_time() - t
print(f"sample total {tot/20*1e3:.1f} ms/step; prefill {acc['prefill']/20*1e3:.1f}; step {acc['step']/20*1e3:.1f}")
hf._prefill = orig_prefill
# update: forward, tail, backward, optimizer
opt = e.optimizer
ts = {"fwd": 0., "tail": 0., "bwd": 0., "opt": 0., "total": 0.}
for b, kw in rec["update"][:20]:
    t0 = time.process_time()
    logits = pol.forward_grouped(b.prompt_ids, b.prompt_mask, b.group, b.completion_ids, b.completion_mask)
    t1 = time.process_time()
    logsm = torch.log_softmax(logits.float(), -1); logp = logsm.gather(-1, b.completion_ids.unsqueeze(-1)).squeeze(-1)
    terms = grpo.policy_loss(logp, logp.detach(), b.advantages, b.completion_mask, loss_agg="dapo")
    t2 = time.process_time()
    terms.loss.backward()
    t3 = time.process_time()
    torch.nn.utils.clip_grad_norm_([p for p in pol.parameters() if p.requires_grad], 1.0, foreach=True); opt.step(); opt.zero_grad(set_to_none=True)
    t4 = time.process_time()
    for k, v in zip(("fwd","tail","bwd","opt"), (t1-t0, t2-t1, t3-t2, t4-t3)): ts[k] += v
print({k: round(v/20*1e3, 2) for k, v in ts.items()}, "ms/step")
