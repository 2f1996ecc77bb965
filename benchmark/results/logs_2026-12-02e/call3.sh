#!/usr/bin/env bash
# Call 3 (2026-12-02, afternoon session), the working tree: every GPU test; one request with
# transformers in the same run (run_gpu.sh single) and twice more alone; py-spy at 100 samples
# a second over the official workload (the host's time at large batches).
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
OUT=$OUT timeout 330 bash benchmark/run_gpu.sh tests,single > /dev/null 2>&1
tail -4 $OUT/gpu_tests.log; grep -c PASSED $OUT/gpu_tests.log; grep -E "FAILED|ERROR" $OUT/gpu_tests.log | head
grep -v "Writing\|Loading" $OUT/offline_single.log
export PYTHONPATH=/tmp/site:$PWD/solutions
for i in 1 2; do
  timeout 60 python3 benchmark/offline.py --workload single --model random-qwen3-0.6b \
      --dtype bfloat16 --variants minisgl --step-times --json $OUT/results.jsonl 2>&1 \
      | grep -v "Writing\|Loading\|^model\|^workload"
done | tee $OUT/single_more.log
timeout 100 /tmp/site/bin/py-spy record -r 100 -f raw -o $OUT/pyspy_official.txt -- \
    python3 benchmark/offline.py --workload official --model random-qwen3-0.6b \
    --dtype bfloat16 --variants minisgl 2>&1 | grep -v "Writing\|Loading" | tail -3
gzip -f $OUT/pyspy_official.txt
