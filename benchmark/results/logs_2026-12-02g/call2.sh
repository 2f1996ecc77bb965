#!/usr/bin/env bash
# Call 2 (2026-12-02, night session), HEAD 6664f5e, the same machine as call 1 (warm): the engine
# and transformers in one run again (run_gpu.sh hf), then the engine alone in a fresh process.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
echo "== hf"
OUT=$OUT HF_VARIANTS=minisgl,transformers timeout 330 bash benchmark/run_gpu.sh hf > /dev/null 2>&1
grep -v "Writing\|Loading" $OUT/offline_hf.log
export PYTHONPATH=/tmp/site:$PWD/solutions
echo "== official alone"
timeout 80 python3 benchmark/offline.py --workload official --model random-qwen3-0.6b --dtype bfloat16 \
    --variants minisgl --step-times --json $OUT/results.jsonl 2>&1 | grep -v "Writing\|Loading" | tee $OUT/official_alone.log
