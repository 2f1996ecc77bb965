#!/usr/bin/env bash
# Chapter 20 at full depth (48 layers): the engine on the official workload, then transformers
# on the first 32 requests, one run (run_gpu.sh moe).
set -uo pipefail
df -h /dev/shm | tail -1; free -g | head -2
OUT=$OUT timeout 575 bash benchmark/run_gpu.sh moe > /dev/null 2>&1
echo "rc=$?"
grep -v "Writing\|Loading" $OUT/moe.log | tail -30
