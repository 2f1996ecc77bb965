#!/usr/bin/env bash
# Call 6 (2026-12-02, day): norm_rope as one program per (token, q or k) against HEAD's one
# per (token, head): GPU tests, a 16,384-token prefill's kernels, the official workload
# alternating HEAD and the change twice.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.ficache
export TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
python3 -c 'import sys' && mkdir -p /tmp/old && tar -xzf .gpu/old_solutions.tgz -C /tmp/old
tree() { case $1 in new) echo $PWD/solutions;; old) echo /tmp/old/solutions;; esac; }
export PYTHONPATH=/tmp/site:$PWD/solutions
python3 tools/provision.py tiny --tokenizer-from .gpu/tokenizer > /dev/null 2>&1 || exit 1
python3 -c 'import sys, torch; sys.path.insert(0, "benchmark")
from offline import RANDOM_MODEL, resolve_model; resolve_model(RANDOM_MODEL, torch.bfloat16)' > /dev/null 2>&1
timeout 100 python3 -m pytest tests/test_gpu_kernels.py \
    "tests/test_gpu_attention.py::test_fused_layers_stay_within_bf16_tolerance_of_the_torch_layers" \
    -q -p no:cacheprovider --timeout 90 2>&1 | tail -5 | tee $OUT/gpu_tests.log
for t in new old new old; do
  echo "== official $t" | tee -a $OUT/official.log
  PYTHONPATH=/tmp/site:$(tree $t) timeout 50 python3 benchmark/offline.py --workload official \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $OUT/results_$t.jsonl 2>&1 | grep -A9 "^workload" | tail -8 | tee -a $OUT/official.log
done
for t in new; do
  PYTHONPATH=/tmp/site:$(tree $t) timeout 60 python3 benchmark/profile_step.py --page-size 256 \
      --max-extend-tokens 16384 --top 12 --json $OUT/results_$t.jsonl 2>&1 | grep -v Writing \
      | grep -B1 -A12 "^prefill" | tee -a $OUT/profile_prefill.log
done
