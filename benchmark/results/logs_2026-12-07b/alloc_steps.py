"""Which steps of the official workload allocate device or pinned host memory, per backend.

    python benchmark/results/logs_2026-12-07b/alloc_steps.py flashinfer hybrid
    RESERVE_GIB=2 python benchmark/results/logs_2026-12-07b/alloc_steps.py hybrid

For each backend, a fresh LLM (the official workload's settings, random Qwen3-0.6B, bf16),
warmed up as `python -m benchmark offline` does; with RESERVE_GIB, a block of that many GiB is
then allocated and freed, so torch's caching allocator holds it. Then the timed run: every
scheduler step's wall time, the phase and size of the batch it launched, and the cudaMalloc and
cudaHostAlloc calls torch's allocators made in it. Prints the run's time, the totals, and each
step that allocated.
"""

from __future__ import annotations

import os
import sys
import time

import torch

sys.path.insert(0, ".")
from benchmark.checkpoints import RANDOM_MODEL, resolve_model  # noqa: E402
from minisgl.benchmark import WORKLOADS, make_workload  # noqa: E402
from minisgl.benchmark.offline import greedy_params, warmup_workload  # noqa: E402


def allocations() -> tuple[int, int]:
    device = torch.cuda.memory_stats().get("num_device_alloc", 0)
    host = torch.cuda.host_memory_stats().get("num_host_alloc", 0)
    return device, host


def probe(backend: str) -> None:
    from minisgl.llm import LLM
    from minisgl.scheduler import Scheduler

    work = make_workload(WORKLOADS["official"], 0)
    warm = warmup_workload(work)
    model = resolve_model(RANDOM_MODEL, torch.bfloat16)
    reserve = float(os.environ.get("RESERVE_GIB", "0"))
    with LLM(
        str(model),
        dtype=torch.bfloat16,
        max_running_req=256,
        show_progress=False,
        max_seq_len=work.longest + 16,
        page_size=256,
        max_extend_tokens=16384,
        attention_backend=backend,
    ) as llm:
        llm.generate(warm.prompts, greedy_params(warm))
        if reserve:
            del_me = torch.empty(int(reserve * 2**30), dtype=torch.uint8, device="cuda")
            del del_me
        torch.cuda.synchronize()
        step = Scheduler.step
        steps: list[tuple] = []

        def counted_step(scheduler: Scheduler) -> list:
            before = allocations()
            start = time.perf_counter()
            try:
                return step(scheduler)
            finally:
                wall_ms = (time.perf_counter() - start) * 1e3
                new = [a - b for a, b in zip(allocations(), before)]
                phase = tuple(scheduler.stats.steps[-1][:2]) if scheduler.stats.steps else None
                steps.append((len(steps) + 1, phase, round(wall_ms, 1), *new))

        before = allocations()
        Scheduler.step = counted_step
        try:
            start = time.perf_counter()
            llm.generate(work.prompts, greedy_params(work))
            seconds = time.perf_counter() - start
        finally:
            Scheduler.step = step
        total = [a - b for a, b in zip(allocations(), before)]
    print(
        f"{backend} (reserve {reserve} GiB): {seconds:.2f} s, {len(steps)} steps, "
        f"{total[0]} cudaMalloc and {total[1]} cudaHostAlloc in the timed run"
    )
    print("  (step, (phase, rows), ms, cudaMalloc, cudaHostAlloc) of the steps that allocated:")
    for entry in [s for s in steps if s[3] or s[4]][:40]:
        print("  ", entry)
    print("  the first 12 steps:", steps[:12])


if __name__ == "__main__":
    for name in sys.argv[1:]:
        probe(name)
