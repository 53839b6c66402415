#!/usr/bin/env bash
# The one command for a lent GPU machine (one CUDA GPU, no network; torch, transformers, peft and
# pytest there, no optuna, no vLLM), run from the repository root:
#
#   bash bench/device_check.sh        # results under $OUT (the device tool's folder), else ./device-check
#
# 1. bench/gpu_check.py: the table for docs/benchmarks.md (Qwen2.5-1.5B solo, then as a lockstep group of 3
#    seeds beside it, then 0.5B; it starts
#    no further model after 180 s, and rewrites $OUT/gpu_check.json after every model);
# 2. the gpu-marked tests (tests/test_gpu.py: bf16 log-probs, a CUDA pilot, the memory plan);
# 3. with .whl/ carried (bench/device_wheels.sh: optuna is not on that machine), a small real
#    `race pilot --device cuda` (3 pilots at 2e10 FLOPs) with its figure, as a user would run it.
# Expected wall time on an H200: under 9 minutes in all; the timeouts (270 + 170 + 110 s) keep it
# under the device tool's 10-minute call limit whatever happens.
set -u -o pipefail
OUT=${OUT:-device-check}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PY=$(command -v python3 || command -v python)   # the device machine: python3 is the one with torch
if [ -f .whl/site.tar.xz ]; then   # bench/device_wheels.sh: pydantic, and optuna for the `race pilot` below
  mkdir -p /tmp/site && tar -C /tmp/site -xJf .whl/site.tar.xz && export PYTHONPATH=.:/tmp/site
fi
# the device tool brings back at most 8 files from $OUT: versions.txt, gpu_check.{txt,json},
# pytest_gpu.txt, pilot.txt, pilot-results.json, pilot.png, summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$PY" -c "import sys, torch, transformers, peft; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__)" 2>&1; } | tee "$OUT/versions.txt"
timeout 270 "$PY" bench/gpu_check.py --max-seconds 180 --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.txt"
check=$?
timeout 170 "$PY" -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.txt"
tests=$?
pilot=skipped
if "$PY" -c "import optuna" 2>/dev/null; then
  # 3. the product path as a user runs it: calibration, plan, 3 pilots on the GPU, the verdict
  timeout 110 "$PY" -m race pilot --device cuda --budget 2e10 --seeds 1 --grid 0.5,0.62,0.74 \
    --out /tmp/race-pilot --plot "$OUT/pilot.png" 2>&1 | tee "$OUT/pilot.txt"
  pilot=$?
  cp /tmp/race-pilot/results.json "$OUT/pilot-results.json" 2>/dev/null
fi
echo "gpu_check exit $check, gpu tests exit $tests, race pilot on cuda: $pilot" | tee "$OUT/summary.txt"
exit $(( check != 0 || tests != 0 ))
