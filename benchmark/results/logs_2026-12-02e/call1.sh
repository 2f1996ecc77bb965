#!/usr/bin/env bash
# Call 1 (2026-12-02, afternoon session): the host's time in a batch-1 decode step; the single
# workload on HEAD (.gpu/head/solutions) and on the working tree (graph plans kept while the
# pages per request stay), alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 200 python3 .gpu/exp6.py $OUT/exp6.jsonl 2>&1 | grep -v "Writing\|Loading" | tee $OUT/exp6.log
for tree in head new head new; do
  src=$PWD/solutions; [[ $tree == head ]] && src=$PWD/.gpu/head/solutions
  echo "== $tree"
  PYTHONPATH=/tmp/site:$src timeout 100 python3 benchmark/offline.py --workload single \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $OUT/single_$tree.jsonl 2>&1 | grep -v "Writing\|Loading"
done 2>&1 | tee $OUT/single_ab.log
