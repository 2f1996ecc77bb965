"""Call 1 of 2026-12-02 (evening session): FlashInfer's plan against fast_decode_plan for a
CUDA-graph decode wrapper, and where the host's time goes in a decode step of 256 requests.

Part 1: one graph wrapper per batch size (1, 16, 64, 128, 256 rows; pages of 256 tokens, 1-4
pages a request; Qwen3-0.6B's heads), planned once with `plan`; then `plan` and
`fast_decode_plan` timed alone, N calls each, alternating twice (host time, perf_counter).
Part 2: the engine (random Qwen3-0.6B, bf16, pages of 256, graphs) with 256 requests of
512-token prompts in steady decode: 40 scheduler steps under cProfile, the top functions.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, "benchmark")
from decode_step import fill_decode_batch  # noqa: E402
from offline import resolve_model  # noqa: E402

OUT = Path(sys.argv[1])
N = 200


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with (OUT / "exp8.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


def plans() -> None:
    import flashinfer

    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device="cuda")
    common = dict(num_qo_heads=16, num_kv_heads=8, head_dim=128, page_size=256,
                  q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, non_blocking=True)
    rng = random.Random(0)
    for rows in (1, 16, 64, 128, 256):
        pages = [rng.randint(1, 4) for _ in range(rows)]
        indptr = torch.tensor([0] + [sum(pages[: i + 1]) for i in range(rows)], dtype=torch.int32)
        indices = torch.arange(int(indptr[-1]), dtype=torch.int32, device="cuda")
        last = torch.tensor([rng.randint(1, 256) for _ in range(rows)], dtype=torch.int32)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device="cuda"),
            paged_kv_indices_buffer=torch.zeros(4 * rows, dtype=torch.int32, device="cuda"),
            paged_kv_last_page_len_buffer=torch.ones(rows, dtype=torch.int32, device="cuda"),
        )
        wrapper.plan(indptr, indices, last, **common)
        calls = {
            "plan": lambda: wrapper.plan(indptr, indices, last, **common),
            "fast_decode_plan": lambda: flashinfer.fast_decode_plan(
                wrapper, indptr, indices, last, **common),
        }
        for _round in range(2):
            for name, call in calls.items():
                call()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(N):
                    call()
                host_us = (time.perf_counter() - start) / N * 1e6
                torch.cuda.synchronize()
                print(f"rows {rows:>4}  {name:<17} {host_us:8.1f} us", flush=True)
                emit({"benchmark": "graph_plan_host", "rows": rows, "plan": name,
                      "host_us": host_us, "calls": N, "page_size": 256})


def profile_steps() -> None:
    from minisgl.llm import LLM

    model = resolve_model("random-qwen3-0.6b", torch.bfloat16)
    with LLM(str(model), max_running_req=256, page_size=256, show_progress=False,
             max_seq_len=2048) as llm:
        sched = llm.scheduler
        fill_decode_batch(sched, 256, 512, 400)
        for _ in range(20):
            sched.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(40):
            sched.step()
        torch.cuda.synchronize()
        step_ms = (time.perf_counter() - start) / 40 * 1e3
        print(f"decode step, 256 rows, no profiler: {step_ms:.3f} ms", flush=True)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(40):
            sched.step()
        profiler.disable()
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    plans()
    profile_steps()
