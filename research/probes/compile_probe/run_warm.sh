#!/bin/bash
# usage: run_warm.sh LOG "which part variant [N]" ...  : rerun with the cache a cold run left (warm FX/AOT caches)
HERE=$(cd "$(dirname "$0")" && pwd)     # run from anywhere, in the venv of the repository
export PYTHONPATH=$(dirname "$(dirname "$HERE")")
cd "$HERE"; mkdir -p logs cache
log=$1; shift
for spec in "$@"; do
  set -- $spec
  export TORCHINDUCTOR_CACHE_DIR=$HERE/cache/$1_$2_${3//:/_}
  echo "== WARM $spec $(date +%T)" >> $log
  TORCH_LOGS=recompiles timeout 900 nice -n 5 python bench.py $spec > logs/warm_$1_$2_${3//:/_}.out 2>&1
  grep RESULT logs/warm_$1_$2_${3//:/_}.out >> $log || tail -5 logs/warm_$1_$2_${3//:/_}.out >> $log
done
echo "== done $(date +%T)" >> $log
