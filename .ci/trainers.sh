#!/usr/bin/env bash
# The trainers whose schemas the recipes are checked against (tests/test_trainer_schemas.py): their
# wheels, unpacked and never installed (no GPU stack), into $RACE_TRAINER_SOURCES. Called by .ci/run.
#
# The pins are the versions docs/recipes.md names. To move one: change it here and in
# race/recipes.py VERSIONS, run the test, and fix the recipe where the trainer's schema moved.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${RACE_TRAINER_SOURCES:-.ci/cache/trainers}"
mkdir -p "$DEST"
for pin in "verl==0.8.0" "openrlhf==0.11.0"; do
    name="${pin%%==*}"
    [ -d "$DEST/$name" ] && continue
    tmp="$(mktemp -d)"
    python -m pip download --quiet --no-deps --dest "$tmp" "$pin"
    mkdir -p "$DEST/$name"
    python -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$tmp"/*.whl "$DEST/$name"
    rm -rf "$tmp"
done
echo "trainer sources in $DEST: verl 0.8.0, openrlhf 0.11.0 (unpacked, not installed)"
