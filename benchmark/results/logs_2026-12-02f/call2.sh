#!/usr/bin/env bash
# Call 2 (2026-12-02, evening session), the working tree (5536bd6): every GPU test; the official
# workload with transformers in the same run (run_gpu.sh hf, engine and transformers only);
# the official workload once more alone.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
OUT=$OUT timeout 200 bash benchmark/run_gpu.sh tests > /dev/null 2>&1
tail -3 $OUT/gpu_tests.log; grep -c PASSED $OUT/gpu_tests.log; grep -E "FAILED|ERROR" $OUT/gpu_tests.log | head
OUT=$OUT HF_VARIANTS=minisgl,transformers timeout 300 bash benchmark/run_gpu.sh hf > /dev/null 2>&1
grep -v "Writing\|Loading" $OUT/offline_hf.log
export PYTHONPATH=/tmp/site:$PWD/solutions
timeout 60 python3 benchmark/offline.py --workload official --model random-qwen3-0.6b \
    --dtype bfloat16 --variants minisgl --step-times --json $OUT/results.jsonl 2>&1 \
    | grep -v "Writing\|Loading\|^model\|^workload" | tee $OUT/official_alone.log
