#!/usr/bin/env bash
# Call 3 (2026-12-02, evening session): does a run compile Triton kernels inside its timing?
# On a fresh machine (Triton's cache empty), the official workload twice with the working tree
# (write_next_tokens_kernel compiled once for every batch size: do_not_specialize), then twice
# with a57b7f6 (.gpu/head/solutions); then the working tree with transformers in the same run
# (run_gpu.sh hf); then the GPU tests the last call's timeout cut.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
rm -rf .ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
run() {  # tree workload
  local src=$PWD/solutions; [[ $1 == head ]] && src=$PWD/.gpu/head/solutions
  echo "== $1 $2"
  PYTHONPATH=/tmp/site:$src timeout 90 python3 benchmark/offline.py --workload $2 \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $OUT/offline_$1.jsonl 2>&1 | grep -v "Writing\|Loading\|^model\|^workload"
}
{ for t in new new head head; do run $t official; done; } 2>&1 | tee $OUT/ab.log
ls .ficache/triton | wc -l
OUT=$OUT HF_VARIANTS=minisgl,transformers timeout 290 bash benchmark/run_gpu.sh hf > /dev/null 2>&1
grep -v "Writing\|Loading" $OUT/offline_hf.log
timeout 100 python3 -m pytest tests/test_gpu_speculative.py tests/test_gpu_tp.py -v -p no:cacheprovider \
    --timeout 90 -k "not float32" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|ERROR|passed|failed" | tee $OUT/gpu_tests_rest.log
