import torch, sys
torch.set_num_threads(1)
from race.run.api import build_config
from race.flops.grid import plan_grid
from race.engine.pilot import PilotEngine
from race.tasks.taskdata import task_problems
from race.engine.lean_engine import LockstepEngine
cfg = build_config(None)
sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[2]
mode=sys.argv[1]
if mode=="solo":
    e=PilotEngine(cfg, sch, 0); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    f=lambda i: e.step(train[i*8:(i+1)*8])
else:
    e=LockstepEngine(cfg, sch, [0,1,2]); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    f=lambda i: e.step([0,1,2],[train[i*8:(i+1)*8]]*3)
for i in range(3): f(i)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(3,13): f(i)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
