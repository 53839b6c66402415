#!/bin/bash
# usage: run_variants.sh LOG  "which part variant [N]" ...   (each run: a fresh, cold inductor cache)
HERE=$(cd "$(dirname "$0")" && pwd)     # run from anywhere, in the venv of the repository
export PYTHONPATH=$(dirname "$(dirname "$HERE")")
cd "$HERE"; mkdir -p logs cache
log=$1; shift
for spec in "$@"; do
  set -- $spec
  dir=$HERE/cache/$1_$2_${3//:/_}
  rm -rf $dir; export TORCHINDUCTOR_CACHE_DIR=$dir
  echo "== $spec $(date +%T)" >> $log
  TORCH_LOGS=recompiles timeout 900 nice -n 5 python bench.py $spec > logs/$1_$2_${3//:/_}.out 2>&1
  grep RESULT logs/$1_$2_${3//:/_}.out >> $log || tail -5 logs/$1_$2_${3//:/_}.out >> $log
done
echo "== done $(date +%T)" >> $log
