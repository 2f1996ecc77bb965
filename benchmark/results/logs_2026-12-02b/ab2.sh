#!/usr/bin/env bash
# Host-cost A/B: decode steps at fixed batches (steady state, --parts) and the official workload,
# for HEAD's tree (old), the working tree (new) and the working tree with make_device_tensor
# building lists in pinned memory directly (C), alternating.
set -uo pipefail
FINAL=${OUT:-build/gpu_out}
L=/tmp/logs; mkdir -p $L "$FINAL"
OUT=$L OFFLINE_VARIANTS=minisgl timeout 200 bash benchmark/run_gpu.sh offline > $L/warm.log 2>&1
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.ficache
export TRITON_CACHE_DIR=$PWD/.ficache/triton
rm -rf /tmp/old /tmp/C && mkdir -p /tmp/old /tmp/C
tar -xzf .gpu/old_solutions.tgz -C /tmp/old && tar -xzf .gpu/treeC.tgz -C /tmp/C
tree() { case $1 in old) echo /tmp/old/solutions;; new) echo $PWD/solutions;; C) echo /tmp/C/solutions;; esac; }
for t in old new C old new C; do
  echo "== steps $t"
  PYTHONPATH=/tmp/site:$(tree $t) timeout 70 python3 benchmark/decode_step.py --batch-sizes 256 \
      --parts --steps 60 2>&1 | grep -v Warn | tail -12
done
for t in new old; do
  echo "== official $t"
  PYTHONPATH=/tmp/site:$(tree $t) timeout 100 python3 benchmark/offline.py --workload official \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $L/results_$t.jsonl 2>&1 | grep -A9 "^workload"
done
cp $L/results_*.jsonl "$FINAL/"
