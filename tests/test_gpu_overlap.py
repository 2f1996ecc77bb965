"""On a GPU, overlap scheduling must really overlap: preparing and launching batch N+1 may not
wait for the device, whose only wait is the event behind batch N's sampled tokens.

A spin kernel keeps the device busy for about 100 ms behind the batch in flight; an overlapped
step must return long before it ends. A blocking host-to-device copy (a `torch.tensor(...,
device=...)` or a `.to(device)` of pageable memory) or an implicit sync anywhere in the step
path makes the step wait for the spin instead. The same holds on each GPU attention backend
with CUDA graphs, for a step that launches a prefill as for one that launches a decode; while
those steps run, torch's sync debug mode names any call that synchronizes. Skipped without CUDA.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
import warnings

import pytest
import torch
from conftest import TINY_MODELS
from test_gpu_attention import qwen3_h128  # noqa: F401 - the checkpoint fixture, shared

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SPIN_CYCLES = 200_000_000  # about 100 ms of an H200


@pytest.mark.parametrize(
    ("cache_type", "constrained"), [("naive", False), ("radix", False), ("radix", True)]
)
def test_an_overlapped_step_does_not_wait_for_the_device(cache_type, constrained):
    """With `constrained`, every other request follows a regex (chapter 25): the grammar
    sampler's mask and its copy of the sampled tokens must not wait for the device either."""
    from minisgl.core import SamplingParams
    from minisgl.scheduler import Scheduler, SchedulerConfig
    from minisgl.structured import StructuredParams

    scheduler = Scheduler(
        SchedulerConfig(
            str(TINY_MODELS["qwen3"]),
            device="cuda",
            attention_backend="torch",
            cuda_graph_max_bs=0,
            page_size=16,
            num_pages=512,
            max_running_req=16,
            cache_type=cache_type,
            enable_overlap=True,
            show_progress=False,
        )
    )
    for i in range(8):
        params = SamplingParams(
            max_tokens=64, ignore_eos=True, temperature=0.0 if i % 2 else 0.8, seed=i
        )
        if constrained and i % 2 == 0:  # sampled: a greedy pick could end the text at once
            params = StructuredParams(max_tokens=64, temperature=0.8, seed=i, regex="[a-z ]{1,400}")
        scheduler.add_request([(5 * i + j) % 400 + 1 for j in range(20 + i)], params)
    for _ in range(4):  # prefill, and a few decode steps to warm every kernel up
        scheduler.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(SPIN_CYCLES)
    torch.cuda.synchronize()
    spin_s = time.perf_counter() - start

    step_s = []
    for _ in range(5):
        torch.cuda._sleep(SPIN_CYCLES)  # the device is busy behind the batch in flight
        start = time.perf_counter()
        scheduler.step()
        step_s.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    print(
        f"{cache_type}, constrained={constrained}: steps {[round(s * 1e3, 2) for s in step_s]} ms"
        f" on the CPU while the device spun {spin_s * 1e3:.0f} ms"
    )
    if constrained:
        sampler = scheduler.engine.sampler
        assert sampler.masked_steps >= 9, "the constrained requests ended before the timed steps"
    assert max(step_s) < spin_s / 4, (
        f"overlapped steps took {[round(s * 1e3, 1) for s in step_s]} ms on the CPU while the "
        f"device was busy for {spin_s * 1e3:.0f} ms: something in the step path waits for it"
    )


def allocations() -> tuple[int, int]:
    """(device memory allocations, pinned host ones) torch's caching allocators have made so
    far: each one a cudaMalloc or cudaHostAlloc, which may wait for the device."""
    device = torch.cuda.memory_stats().get("num_device_alloc", 0)
    host = torch.cuda.host_memory_stats().get("num_host_alloc", 0)
    return device, host


def steps_while_the_device_spins(scheduler, count: int) -> tuple[list[tuple], str]:  # noqa: ANN001
    """`count` scheduler steps, each started while the device spins behind the batch in
    flight: the phase each launched, its host time and the device and pinned host allocations
    it made; and where the slowest of them spent that time (its top functions under cProfile)
    with the calls torch's sync debug mode saw synchronize with the device in any of them."""
    steps, slowest = [], (0.0, "")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(count):
                torch.cuda._sleep(SPIN_CYCLES)
                profiler = cProfile.Profile()
                allocs = allocations()
                start = time.perf_counter()
                with profiler:
                    scheduler.step()
                seconds = time.perf_counter() - start
                new = [after - before for after, before in zip(allocations(), allocs)]
                steps.append((scheduler.stats.steps[-1][0], seconds, *new))
                if seconds > slowest[0]:
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(6)
                    slowest = (seconds, text.getvalue())
                torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sorted(
        {f"{w.filename}:{w.lineno}" for w in caught if "called a synchronizing" in str(w.message)}
    )
    return steps, f"syncs seen: {syncs or 'none'}; the slowest step's functions:\n{slowest[1]}"


@pytest.mark.parametrize("backend", ["flashinfer", "triton", "hybrid"])
def test_an_overlapped_step_on_each_gpu_backend_does_not_wait_for_the_device(
    backend,
    qwen3_h128,  # noqa: F811 - the fixture imported above
):
    """bf16 with CUDA graphs, on Qwen3-0.6B's attention shape: 12 prompts admitted under a
    budget of 64 tokens a step (prefills between decodes), then decodes of 12 rows (on Triton's
    kernels in the hybrid), after a pass over prompts of the same lengths. A step that
    launches a prefill must not wait for the device any more than one that launches a decode:
    the official workload interleaves nine of them with its first decodes."""
    from minisgl.core import SamplingParams
    from minisgl.scheduler import Scheduler, SchedulerConfig

    scheduler = Scheduler(
        SchedulerConfig(
            str(qwen3_h128),
            device="cuda",
            dtype=torch.bfloat16,
            attention_backend=backend,
            cuda_graph_max_bs=32,
            page_size=16,
            num_pages=512,
            max_running_req=32,
            max_extend_tokens=64,
            enable_overlap=True,
            show_progress=False,
        )
    )
    # The same lengths once before the clock (other ids, so the prefix cache matches nothing):
    # a library's first use of a shape may wait for the device once per process (cuBLAS did
    # at a new row count, 2026-12-07), which is not what this test is about.
    for warm_up in (True, False):
        for i in range(12):
            prompt = [(7 * i + j + warm_up) % 400 + 1 for j in range(40 + i)]
            scheduler.add_request(prompt, SamplingParams(max_tokens=64, ignore_eos=True))
        while warm_up and scheduler.has_work:
            scheduler.step()
    scheduler.step()  # the first prefill: nothing to process yet
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(SPIN_CYCLES)
    torch.cuda.synchronize()
    spin_s = time.perf_counter() - start
    steps, where = steps_while_the_device_spins(scheduler, 24)
    shown = [(phase, round(s * 1e3, 1), *allocs) for phase, s, *allocs in steps]
    heading = f"{backend}: steps (phase, ms, cudaMallocs, cudaHostAllocs) {shown}"
    print(f"{heading} while the device spun {spin_s * 1e3:.0f} ms; {where}")
    assert {phase for phase, *_ in steps} == {"prefill", "decode"}
    assert max(s for _, s, *_ in steps) < spin_s / 4, (
        f"{heading}, overlapped, on the CPU while the device was busy for {spin_s * 1e3:.0f} ms; "
        f"{where}"
    )
