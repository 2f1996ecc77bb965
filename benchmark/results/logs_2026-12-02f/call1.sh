#!/usr/bin/env bash
# Call 1 (2026-12-02, evening session): the working tree (graph wrappers planned again with
# fast_decode_plan; TokenOutput not frozen) against HEAD (.gpu/head/solutions): GPU tests of
# attention and kernels, plan vs fast_decode_plan and a cProfile of 256-row steps (exp8.py),
# decode steps at 1, 64, 256, the official workload alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
timeout 150 python3 -m pytest tests/test_gpu_attention.py tests/test_gpu_kernels.py -q -x \
    -p no:cacheprovider --timeout 120 2>&1 | tail -15 | tee $OUT/gpu_tests.log
timeout 120 python3 .gpu/exp8.py $OUT 2>&1 | grep -v "Writing\|Loading" > $OUT/exp8.log
head -20 $OUT/exp8.log
timeout 90 python3 benchmark/decode_step.py --batch-sizes 1,64,256 --parts --json $OUT/results.jsonl \
    2>&1 | grep -v "Writing\|Loading" | tee $OUT/decode_step.log
run() {  # tree workload
  local src=$PWD/solutions; [[ $1 == head ]] && src=$PWD/.gpu/head/solutions
  echo "== $1 $2"
  PYTHONPATH=/tmp/site:$src timeout 90 python3 benchmark/offline.py --workload $2 \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $OUT/offline_$1.jsonl 2>&1 | grep -v "Writing\|Loading\|^model\|^workload"
}
{ for t in new head new head; do run $t official; done; } 2>&1 | tee $OUT/ab.log
