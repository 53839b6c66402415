#!/usr/bin/env bash
# The one command for a lent GPU machine (one CUDA GPU, no network; torch, transformers, peft and
# pytest there, no optuna, no vLLM), run from the repository root:
#
#   bash bench/device_check.sh        # results under $OUT (the device tool's folder), else ./device-check
#
# 1. bench/gpu_check.py: the table for docs/benchmarks.md (Qwen2.5-1.5B first, then 0.5B; it starts
#    no further model after 200 s, and rewrites $OUT/gpu_check.json after every model);
# 2. the gpu-marked tests (tests/test_gpu.py: bf16 log-probs, a CUDA pilot, the memory plan).
# Expected wall time on an H200: under 8 minutes in all.
set -u -o pipefail
OUT=${OUT:-device-check}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1
python -c "import sys, torch, transformers, peft; print('python', sys.version.split()[0], 'torch', torch.__version__,
'transformers', transformers.__version__, 'peft', peft.__version__)" 2>&1 | tee "$OUT/versions.txt"
timeout 300 python bench/gpu_check.py --max-seconds 200 --json "$OUT/gpu_check.json" 2>&1 | tee "$OUT/gpu_check.txt"
check=$?
timeout 240 python -m pytest -m gpu -q -p no:cacheprovider -rA tests/test_gpu.py 2>&1 | tee "$OUT/pytest_gpu.txt"
tests=$?
echo "gpu_check exit $check, gpu tests exit $tests" | tee "$OUT/summary.txt"
exit $(( check != 0 || tests != 0 ))
