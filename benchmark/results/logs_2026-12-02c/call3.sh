#!/usr/bin/env bash
# Call 3 (2026-12-02, day): split-KV off in FlashInfer's decode graphs; GPU idle time over
# the official workload; the official workload with split-KV off from 64 or 128 rows.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 150 python3 .gpu/exp3.py attn $OUT/exp3.jsonl 2>&1 | tee $OUT/attn3.log
timeout 200 python3 .gpu/exp3.py nosplit $OUT/exp3.jsonl \
    minisgl,nosplit64,nosplit128,minisgl,nosplit64,nosplit128 2>&1 | grep -v Writing | tee $OUT/nosplit.log
timeout 150 python3 .gpu/exp3.py idle $OUT/exp3.jsonl 2>&1 | grep -v Writing | tee $OUT/idle.log
