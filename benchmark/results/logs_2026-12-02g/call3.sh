#!/usr/bin/env bash
# Call 3 (2026-12-02, night session), HEAD 6664f5e: one request's time per output token
# (run_gpu.sh single), the decode step at batch 1, 64, 256 (steps), then every GPU test (tests).
set -uo pipefail
OUT=$OUT timeout 560 bash benchmark/run_gpu.sh single,steps,tests > $OUT/run_gpu.log 2>&1
grep -v "Writing\|Loading" $OUT/offline_single.log
cat $OUT/decode_step.log | tail -20
grep -E "passed|failed|FAILED|ERROR" $OUT/gpu_tests.log | tail -15
