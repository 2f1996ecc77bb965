#!/usr/bin/env bash
# A/B on the official workload: HEAD's core.py (torch.cat per append) vs the working tree's.
set -uo pipefail
OUT=${OUT:-build/gpu_out}
OFFLINE_VARIANTS=minisgl bash benchmark/run_gpu.sh offline > "$OUT/new1.log" 2>&1
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.ficache
rm -rf /tmp/old && cp -r solutions /tmp/old && cp .gpu/old_core.py /tmp/old/minisgl/core.py
run() {  # run TREE LOG [--json FILE]
  PYTHONPATH=/tmp/site:$1 python3 benchmark/offline.py --workload official \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times "${@:3}" \
      > "$OUT/$2" 2>&1
}
run /tmp/old old1.log
run "$PWD/solutions" new2.log --json "$OUT/results.jsonl"

grep -h -A9 "^workload" "$OUT"/new1.log "$OUT"/old1.log "$OUT"/new2.log | grep -v "^--"
