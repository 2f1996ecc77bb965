#!/usr/bin/env bash
# Call 1 (2026-12-02, day): GEMMs and decode attention inside CUDA graphs, then the official
# workload on FlashInfer and on chapter 22's Triton backend, alternating twice in one process.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 100 python3 .gpu/exp1.py gemm $OUT/exp1.jsonl 2>&1 | tee $OUT/gemm.log
timeout 200 python3 benchmark/offline.py --workload official --model random-qwen3-0.6b \
    --dtype bfloat16 --variants minisgl,triton-backend,minisgl,triton-backend --step-times \
    --json $OUT/results.jsonl 2>&1 | grep -v Writing | tee $OUT/offline.log
timeout 200 python3 .gpu/exp1.py attn $OUT/exp1.jsonl 2>&1 | tee $OUT/attn.log
tar czf $OUT/ficache.tgz .ficache
