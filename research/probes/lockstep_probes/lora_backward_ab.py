import torch, time, statistics
torch.set_num_threads(1)
from race.run.api import build_config
from race.flops.grid import plan_grid
from race.engine.seed_axis import SeedAxisEngine
from race.tasks.taskdata import task_problems
import race.engine.backends.lean as L
new_bw = L._LoRAGroup.backward
def old_bw(ctx, g):
    x, weight, xa, A_all, *Bs = ctx.saved_tensors
    r = ctx.rank
    x2, g2, xa2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]), xa.reshape(-1, xa.shape[-1])
    gbs, dBs = [], []
    for j, ((lo, hi), B) in enumerate(zip(ctx.slices, Bs)):
        gi = g2[:, lo:hi]
        gbs.append((gi @ B.to(g.dtype)) * ctx.scale)
        dBs.append((gi.t() @ xa2[:, j * r:(j + 1) * r]).to(B.dtype))
    gb = torch.cat(gbs, dim=1) if len(gbs) > 1 else gbs[0]
    dA_all = (gb.t() @ x2).to(A_all.dtype)
    grad_x = None
    if ctx.needs_input_grad[0]:
        grad_x = (g2 @ weight + gb @ A_all.to(g.dtype)).view_as(x)
    grads = []
    for j, dB in enumerate(dBs):
        grads += [dA_all[j * r:(j + 1) * r], dB]
    return (grad_x, None, None, None, None, *grads)
cfg = build_config(None)
res={}
for idx in (2,3):
    sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[idx]
    e=SeedAxisEngine(cfg, sch, [0]); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    times={"old":[], "new":[]}
    i=0
    for rnd in range(6):
        for name, bw in (("old", old_bw), ("new", new_bw)) if rnd%2==0 else (("new", new_bw), ("old", old_bw)):
            L._LoRAGroup.backward = staticmethod(bw)
            for _ in range(8):
                before=e.walls[0]["update"]; t=time.process_time()
                e.step([0],[train[(i%100)*8:(i%100+1)*8]]); i+=1
                times[name].append(time.process_time()-t)
    print(idx, sch.n_gen, sch.n_train, sch.mu, {k: round(statistics.median(v)*1e3,1) for k,v in times.items()})
