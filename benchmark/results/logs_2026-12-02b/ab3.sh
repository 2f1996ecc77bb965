#!/usr/bin/env bash
# Which change moves the official workload: HEAD (old), the ledger's buffer alone (A), the
# sampler's single copy and page_lists' accumulate alone (B), both (new), alternating.
set -uo pipefail
FINAL=${OUT:-build/gpu_out}
L=/tmp/logs; mkdir -p $L "$FINAL"
OUT=$L OFFLINE_VARIANTS=minisgl timeout 200 bash benchmark/run_gpu.sh offline > $L/warm.log 2>&1
grep -A1 "^workload" $L/warm.log
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.ficache
export TRITON_CACHE_DIR=$PWD/.ficache/triton
for t in old trA trB; do rm -rf /tmp/$t && mkdir -p /tmp/$t; done
tar -xzf .gpu/old_solutions.tgz -C /tmp/old; tar -xzf .gpu/trA.tgz -C /tmp/trA; tar -xzf .gpu/trB.tgz -C /tmp/trB
tree() { case $1 in new) echo $PWD/solutions;; *) echo /tmp/$1/solutions;; esac; }
for t in old trA trB new old trA trB new; do
  echo "== official $t"
  PYTHONPATH=/tmp/site:$(tree $t) timeout 60 python3 benchmark/offline.py --workload official \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $L/results_$t.jsonl 2>&1 | grep -A9 "^workload" | tail -8
done
cp $L/results_*.jsonl "$FINAL/"
