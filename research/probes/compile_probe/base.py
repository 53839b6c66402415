import os, time, torch
torch.set_num_threads(1)
from race.run.api import build_config; from race.flops.grid import plan_grid; from race.engine.seed_axis import SeedAxisEngine; from race.tasks.taskdata import task_problems
import sys
which = sys.argv[1]
if which == "arith":
    cfg = build_config(None); sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[2]
else:
    cfg = build_config(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "pilots", "tiny-reasoner.yaml")); sch = plan_grid(cfg).schedules[1]
print(sch)
e = SeedAxisEngine(cfg, sch, [0])
train = task_problems(cfg, e.backend.tok, split="train", seed=0)
print(type(e.policy), e.policy.config.num_hidden_layers, e.policy.config.hidden_size, e.policy.config.vocab_size, cfg.grpo)
for i in range(int(sys.argv[2])):
    w0 = dict(e.walls[0]); t = time.process_time()
    e.step([0], [train[i*8:(i+1)*8]])
    print(i, {k: round(e.walls[0][k]-w0[k], 4) for k in ("rollout","update","sync","reward")}, round(time.process_time()-t, 4))
