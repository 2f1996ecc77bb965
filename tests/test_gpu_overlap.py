"""On a GPU, overlap scheduling must really overlap: preparing and launching batch N+1 may not
wait for the device, whose only wait is the event behind batch N's sampled tokens.

A spin kernel keeps the device busy for about 100 ms behind the batch in flight; an overlapped
step must return long before it ends. A blocking host-to-device copy (a `torch.tensor(...,
device=...)` or a `.to(device)` of pageable memory) or an implicit sync anywhere in the step
path makes the step wait for the spin instead. Skipped without CUDA.
"""

from __future__ import annotations

import time

import pytest
import torch
from conftest import TINY_MODELS

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
