import torch, sys
torch.set_num_threads(1)
from race.run.api import build_config
from race.flops.grid import plan_grid
from race.engine.seed_axis import SeedAxisEngine
from race.tasks.taskdata import task_problems
sys.path.insert(0, "bench")          # bench/lockstep.py's TRL config, bench/grid_profile.py's matmul peak
mode=sys.argv[1]
if "--trl-config" in sys.argv[2:]:   # bench/step_vs_trl.py's config (4 prompts × 8 rollouts, μ 1)
    from lockstep import _trl_config
    cfg, sch = _trl_config()
else:                                 # the default grid's ρ 0.74 point (8 × 8 → 8, μ 1)
    cfg = build_config(None)
    sch = plan_grid(cfg, prompt_len=5.9, completion_len=3.5).schedules[2]
P = sch.prompts_per_step
shapes = "--shapes" in sys.argv[2:]   # one row per (op, input shapes): each GEMM's time at its own shape
if mode=="solo":
    e=SeedAxisEngine(cfg, sch, [0]); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    f=lambda i: e.step([0],[train[i*P:(i+1)*P]])[0]
else:
    e=SeedAxisEngine(cfg, sch, [0,1,2]); train=task_problems(cfg, e.backend.tok, split="train", seed=0)
    f=lambda i: e.step([0,1,2],[train[i*P:(i+1)*P]]*3)
for i in range(3): f(i)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], record_shapes=shapes) as prof:
    for i in range(3,13): f(i)
print(prof.key_averages(group_by_input_shape=shapes).table(sort_by="self_cpu_time_total", row_limit=25,
      **({"max_name_column_width": 30, "max_shapes_column_width": 70} if shapes else {})))
if shapes:   # the GEMMs' share of the step and their rate, against everything else
    def gemm_flops(name, shp):
        if name == "aten::mm":
            return 2 * shp[0][0] * shp[0][1] * shp[1][1]
        if name == "aten::bmm":
            return 2 * shp[0][0] * shp[0][1] * shp[0][2] * shp[1][2]
        if name == "aten::addmm":
            return 2 * shp[1][0] * shp[1][1] * shp[2][1]
        return None
    gemm_us = gemm_fl = total_us = 0.0
    for ev in prof.key_averages(group_by_input_shape=True):
        total_us += ev.self_cpu_time_total
        fl = gemm_flops(ev.key, ev.input_shapes)
        if fl is not None:
            gemm_us += ev.self_cpu_time_total
            gemm_fl += fl * ev.count
    print(f"per step ({mode}, 10 steps): {total_us / 1e4:.1f} ms self CPU; GEMMs (mm, bmm, addmm) "
          f"{gemm_us / 1e4:.1f} ms at {gemm_fl / gemm_us / 1e3:.1f} GFLOP/s; the rest {(total_us - gemm_us) / 1e4:.1f} ms")
    from grid_profile import matmul_peak
    print(f"one-thread fp32 peak (best 1024³ matmul of 20): {matmul_peak(1) / 1e9:.1f} GFLOP/s")
