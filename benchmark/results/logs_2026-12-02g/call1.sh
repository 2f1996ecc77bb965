#!/usr/bin/env bash
# Call 1 (2026-12-02, night session), HEAD 6664f5e: the official workload alone once in a fresh
# process (the machine's first run), then the engine and transformers in one run
# (run_gpu.sh hf: each variant in a fresh process of its own); Triton's cache returned.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 NCCL_NVLS_ENABLE=0
export FLASHINFER_WORKSPACE_BASE=$PWD/.ficache TRITON_CACHE_DIR=$PWD/.ficache/triton
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/solutions
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu --format=csv | tee $OUT/env.txt
nproc | tee -a $OUT/env.txt
echo "== official alone"
timeout 90 python3 benchmark/offline.py --workload official --model random-qwen3-0.6b --dtype bfloat16 \
    --variants minisgl --step-times --json $OUT/results.jsonl 2>&1 | grep -v "Writing\|Loading" | tee $OUT/official_alone.log
echo "== hf"
OUT=$OUT HF_VARIANTS=minisgl,transformers timeout 330 bash benchmark/run_gpu.sh hf > /dev/null 2>&1
grep -v "Writing\|Loading" $OUT/offline_hf.log
tar czf $OUT/triton.tgz -C .ficache triton
