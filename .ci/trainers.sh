#!/usr/bin/env bash
# The trainers the recipes are checked against (tests/test_trainer_schemas.py, tests/test_trainer_runs.py):
# their release wheels, unpacked and never installed, into $RACE_TRAINER_SOURCES. Called by .ci/run.
#
# Neither installs on a CPU machine as its users install it: OpenRLHF 0.11.2 pins flash-attn==2.8.3,
# whose source build needs torch at build time (and CUDA), deepspeed and transformers==5.15.0; verl
# 0.9.1 pins transformers<5.11 and needs vLLM for its rollout config. So CI runs the trainers' own
# code that does not need a GPU straight from the unpacked wheels, in subprocesses without RACE:
# verl's Hydra config, its reward-function loader (verl/utils/import_utils.py); OpenRLHF's argument
# parser, its reward loader (openrlhf/utils/agent.py), its dataset and batching code.
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
