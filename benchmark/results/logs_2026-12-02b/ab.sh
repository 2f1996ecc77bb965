#!/usr/bin/env bash
# A/B on the official workload: HEAD's tree (.gpu/old_solutions.tgz) vs the working tree,
# alternating, then GPU tests of the touched code, then py-spy on the new tree.
set -uo pipefail
FINAL=${OUT:-build/gpu_out}
L=/tmp/logs; mkdir -p $L "$FINAL"
OUT=$L OFFLINE_VARIANTS=minisgl timeout 200 bash benchmark/run_gpu.sh offline > $L/new1.log 2>&1
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$PWD/.ficache
export TRITON_CACHE_DIR=$PWD/.ficache/triton
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xzf .gpu/old_solutions.tgz -C /tmp/old
run() {  # run TREE LOG
  PYTHONPATH=/tmp/site:$1 timeout 150 python3 benchmark/offline.py --workload official \
      --model random-qwen3-0.6b --dtype bfloat16 --variants minisgl --step-times \
      --json $L/results.jsonl > $L/$2 2>&1
}
run /tmp/old/solutions old1.log
run "$PWD/solutions" new2.log
run /tmp/old/solutions old2.log
run "$PWD/solutions" new3.log
for f in new1 old1 new2 old2 new3; do echo "== $f"; grep -A9 "^workload" $L/$f.log | grep -v "^--"; done
PYTHONPATH=/tmp/site:$PWD/solutions timeout 170 python3 -m pytest tests/test_gpu_parity.py \
    tests/test_gpu_overlap.py tests/test_gpu_speculative.py tests/test_gpu_attention.py -q \
    -p no:cacheprovider --timeout 150 > $L/gpu_tests.log 2>&1; tail -8 $L/gpu_tests.log
OUT=$L timeout 100 bash benchmark/run_gpu.sh pyspy > $L/pyspy_stage.log 2>&1
gzip -f $L/pyspy_official.txt
cp $L/results.jsonl "$FINAL/"; tar -czf "$FINAL/logs.tgz" -C $L .
