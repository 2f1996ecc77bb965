#!/usr/bin/env bash
# Call 4 (2026-12-02, afternoon session): o_proj and down_proj stored column-major on the
# kernel path. The bf16 tolerance and graph GPU tests, decode steps at 1 and 64,
# the single request once (the device time left allowed no more).
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 80 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_attention.py \
    -k "fused_layers_stay or same_tokens_as_eager" 2>&1 | tail -3 | tee $OUT/gpu_tests.log
timeout 80 python3 benchmark/decode_step.py --batch-sizes 1,64 --parts --json $OUT/results.jsonl \
    2>&1 | grep -v "Writing\|Loading" | tee $OUT/decode_step.log
for w in single; do
  timeout 60 python3 benchmark/offline.py --workload $w --model random-qwen3-0.6b \
      --dtype bfloat16 --variants minisgl --step-times --json $OUT/results.jsonl 2>&1 \
      | grep -v "Writing\|Loading\|^model\|^workload"
done 2>&1 | tee $OUT/offline.log
