#!/usr/bin/env bash
# Call 2 (2026-12-02, day): a skinny Triton GEMM against cuBLAS in graphs; the official
# workload with FlashInfer prefill + chapter 22's Triton decode against the default.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 220 python3 .gpu/exp2.py hybrid $OUT/exp2.jsonl 2>&1 | grep -v Writing | tee $OUT/hybrid.log
timeout 280 python3 .gpu/exp2.py gemm $OUT/exp2.jsonl 2>&1 | tee $OUT/gemm2.log
tar czf $OUT/ficache.tgz .ficache
