#!/usr/bin/env bash
# The trainers the recipes are checked against (tests/test_trainer_schemas.py, tests/test_trainer_runs.py),
# into $RACE_TRAINER_SOURCES. Called by .ci/run.
#
# 1. Their release wheels, unpacked and never installed: verl 0.9.1 and OpenRLHF 0.11.2. OpenRLHF does not
#    install on a CPU machine as its users install it (it pins flash-attn==2.8.3, whose source build needs
#    torch at build time and CUDA, deepspeed and transformers==5.15.0), so CI runs the OpenRLHF code that does
#    not need a GPU straight from the unpacked wheel, in subprocesses without RACE: its argument parser, its
#    reward loader (openrlhf/utils/agent.py), its dataset and batching code. verl's Hydra config and reward
#    loader are read the same way, and its tokenizer package runs from the sources in RACE's environment.
# 2. verl 0.9.1 installed as its users install it for math rewards (pip install 'verl[math]==0.9.1', after the
#    CPU torch; the math extra is math-verify, which the emitted race_reward.py's math and format rules need for
#    answers that are not plain numbers), in a virtual environment of its own, $RACE_TRAINER_SOURCES/verl-env:
#    its pins (transformers<5.11) conflict with RACE's, and RACE is not installed there. It works on CPU (about
#    1.5 min); its rollout needs vLLM on a GPU (the vllm extra), which is not installed. tests/test_trainer_runs.py
#    runs verl's RLHFDataset, its rollout's prompt builder and its reward loop there on the emitted files (the
#    default tiny-arith recipe and the reasoner's).
#
# The pins are the versions docs/recipes.md names. To move one: change it here and in
# `VERSION` in race/fullrun/trl.py, verl.py or openrlhf.py, run the tests, and fix the recipe where the trainer moved.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${RACE_TRAINER_SOURCES:-.ci/cache/trainers}"
mkdir -p "$DEST"
for pin in "verl==0.9.1" "openrlhf==0.11.2"; do
    name="${pin%%==*}"
    [ "$(cat "$DEST/$name/.race-pin" 2>/dev/null)" = "$pin" ] && continue
    rm -rf "${DEST:?}/$name"
    tmp="$(mktemp -d)"
    python -m pip download --quiet --no-deps --dest "$tmp" "$pin"
    mkdir -p "$DEST/$name"
    python -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/*.whl "$DEST/$name"
    echo "$pin" > "$DEST/$name/.race-pin"
    rm -rf "$tmp"
done
echo "trainer sources in $DEST: verl 0.9.1, openrlhf 0.11.2 (unpacked, not installed)"
venv="$DEST/verl-env"
if [ "$(cat "$venv/.race-pin" 2>/dev/null)" != "verl[math]==0.9.1" ]; then
    t0=$(date +%s)
    rm -rf "$venv"
    python -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet torch==2.13.0       # the CPU build first, as .ci/run does
    "$venv/bin/python" -m pip install --quiet "verl[math]==0.9.1"
    echo "verl[math]==0.9.1" > "$venv/.race-pin"
    echo "verl 0.9.1 installed in $venv in $(( $(date +%s) - t0 )) s"
fi
"$venv/bin/python" -c "import sys; sys.modules['race'] = None; import verl, transformers, math_verify; from importlib.metadata import version; print('verl', verl.__version__, 'with transformers', transformers.__version__, 'and math-verify', version('math-verify'), 'in', sys.prefix)"
