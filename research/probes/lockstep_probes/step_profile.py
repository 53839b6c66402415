import torch, sys
torch.set_num_threads(1)
from race.run.api import build_config
from race.flops.grid import plan_grid
from race.engine.seed_axis import SeedAxisEngine
from race.tasks.taskdata import task_problems
cfg = build_config(None)
sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[2]
mode=sys.argv[1]
if mode=="solo":
    e=SeedAxisEngine(cfg, sch, [0]); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    f=lambda i: e.step([0],[train[i*8:(i+1)*8]])[0]
else:
    e=SeedAxisEngine(cfg, sch, [0,1,2]); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    f=lambda i: e.step([0,1,2],[train[i*8:(i+1)*8]]*3)
for i in range(3): f(i)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(3,13): f(i)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
