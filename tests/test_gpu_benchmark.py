"""The benchmark package on a GPU: the timing waits for queued kernels, the offline comparison
does the same work on both sides on CUDA, and results name the GPU. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_MODELS, require_model

from minisgl.benchmark import WorkloadSpec, make_workload, run_engine, run_transformers, speedups
from minisgl.benchmark.offline import device_sync, timed
from minisgl.benchmark.results import machine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_timed_includes_the_kernels_a_run_only_queued() -> None:
    """Queue ~tens of ms of matmuls; CUDA events measure the device time, and `timed`'s wall
    time must cover it (a clock stopped at the return of the launches would not)."""
    a = torch.randn(4096, 4096, device="cuda")
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run() -> None:
        begin.record()
        for _ in range(50):
            a @ a
        end.record()

    _, seconds = timed(run, warmup=lambda: a @ a, sync=device_sync)
    device_ms = begin.elapsed_time(end)
    assert device_ms > 5, f"the queued work is too small to tell: {device_ms:.2f} ms"
    assert seconds * 1e3 >= device_ms * 0.95, (seconds * 1e3, device_ms)


def test_offline_run_on_cuda_does_the_same_work_in_the_engine_and_transformers() -> None:
    model = require_model(TINY_MODELS["qwen3"])
    work = make_workload(WorkloadSpec(12, (8, 64), (4, 32)), 2)
    engine = run_engine(model, work, torch.float32, {"attention_backend": "torch"}, "minisgl")
    hf = run_transformers(model, work, torch.float32, batch_size=4)
    for result in (engine, hf):
        assert [len(t) for t in result.tokens] == work.output_lens, result.variant
    assert speedups([hf, engine])["minisgl"] > 0


def test_results_name_the_gpu() -> None:
    assert torch.cuda.get_device_name() in machine()
