#!/usr/bin/env bash
# Wheels that the lent GPU machine lacks (it has no network): optuna and pydantic (config schema) and what they need beyond that
# machine's packages, for Python 3.12 on x86_64, into .whl/ (git-ignored). Run here, before the
# device call, then name .whl in the device tool's `carry`; bench/device_check.sh installs them
# into /tmp/site when the folder is there, and then also runs a small `race pilot --device cuda`.
#
#   bash bench/device_wheels.sh            # .whl/site.tar.xz, ~3.6 MB
#
# The device tool carries at most 64 MiB (the tracked tree, ~63 MB with the committed research data,
# plus what `carry` names), and the wheels alone are 8 MB: so they are unpacked here into one site
# folder, SQLAlchemy without its optional Cython speed-ups (each has a pure-Python twin it falls back
# to) and its test package, and packed as one xz tarball that device_check.sh unpacks into /tmp/site.
set -euo pipefail
PY=${PY_VERSION:-3.12}
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 mako==1.4.3 \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
site=$(mktemp -d)
for w in .whl/*.whl; do python3 -m zipfile -e "$w" "$site"; done
find "$site/sqlalchemy" -name '*.so' -delete
rm -rf "$site/sqlalchemy/testing"
find "$site" -name __pycache__ -prune -exec rm -rf {} +
rm -f .whl/*.whl
tar -C "$site" -cJf .whl/site.tar.xz .
rm -rf "$site"
ls -la .whl
