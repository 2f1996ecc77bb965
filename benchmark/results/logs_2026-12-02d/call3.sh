#!/usr/bin/env bash
# Call 3 (2026-12-02, evening session): a length-balanced Triton decode against FlashInfer's
# per layer at spread contexts, then the official workload with it in a hybrid backend.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 230 python3 .gpu/exp5.py attn $OUT/exp5.jsonl 2>&1 | grep -v Writing | tee $OUT/attn.log
EXP_T=${EXP_T:-128} EXP_WAVES=${EXP_WAVES:-8} timeout 230 python3 .gpu/exp5.py hybrid $OUT/exp5.jsonl \
    2>&1 | grep -v Writing | tee $OUT/hybrid.log
