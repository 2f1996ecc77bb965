"""Chapter 19's Triton kernels compiled for a GPU, against the torch code they replace.

On the CPU, tests/test_ch19_kernels.py runs the same kernels in Triton's interpreter; here they
are compiled for the device and run at Qwen3-0.6B's shapes (8 KV heads of 128, bf16, pages of
16, batches of 256). Also: the engine picks the kernels on CUDA unless MINISGL_KERNELS=torch, a
scheduler with CUDA graphs gives the same greedy tokens either way, and the chapter's main
prints its timing table. Skipped without CUDA. Run this file alone: a process that imported
minisgl.kernels under TRITON_INTERPRET=1 keeps interpreting.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODELS, require_model, run_until_idle

from minisgl.core import Batch, Req, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")
KV_HEADS, HEAD_DIM, PAGE = 8, 128, 16


@pytest.mark.parametrize("tokens", [1, 37, 256, 4096])
def test_store_kv_kernel_matches_the_torch_store_on_the_gpu(tokens: int) -> None:
    from minisgl.kernels.kv_store import store_cache
    from minisgl.kvcache import MHAKVCache

    pools = [MHAKVCache(8192, 2, KV_HEADS, HEAD_DIM, torch.bfloat16, CUDA) for _ in (0, 1)]
    noise = torch.randn(8192, KV_HEADS, HEAD_DIM, device=CUDA, dtype=torch.bfloat16)
    for pool in pools:
        pool.k_cache(1).copy_(noise)
        pool.v_cache(1).copy_(noise)
    qkv = torch.randn(tokens, (16 + 2 * KV_HEADS) * HEAD_DIM, device=CUDA, dtype=torch.bfloat16)
    k = qkv[:, 16 * HEAD_DIM : 24 * HEAD_DIM].reshape(tokens, KV_HEADS, HEAD_DIM).contiguous()
    v = qkv[:, 24 * HEAD_DIM :].view(tokens, KV_HEADS, HEAD_DIM)
    out_loc = torch.randperm(8192, device=CUDA)[:tokens].int()
    kernel_pool, torch_pool = pools
    store_cache(kernel_pool.k_cache(1), kernel_pool.v_cache(1), k, v, out_loc)
    torch_pool.store_kv(k, v, out_loc, 1)
    assert torch.equal(kernel_pool._buffer, torch_pool._buffer)


def decode_and_prefill_batches() -> list[list[tuple[int, int, int]]]:
    """(row, cached_len, device_len) ledgers: 256 decoding requests, and a mixed prefill."""
    decode = [(row, 100 + 3 * row, 101 + 3 * row) for row in range(256)]
    prefill = [(7, 0, 1000), (3, 512, 640), (200, 16, 17), (11, 5, 300)]
    return [decode, prefill]


@pytest.mark.parametrize("ledgers", decode_and_prefill_batches(), ids=["decode", "prefill"])
def test_step_input_kernels_match_the_torch_code_on_the_gpu(ledgers) -> None:  # noqa: ANN001
    from minisgl.kernels.step_inputs import prepare_inputs, write_next_tokens
    from minisgl.scheduler import TableManager

    pages = torch.randperm(256 * 64, device=CUDA).view(256, 64, 1)
    table = (pages * PAGE + torch.arange(PAGE, device=CUDA)).view(256, 1024).int()
    managers = [TableManager(256, table) for _ in (0, 1)]
    tokens = torch.randint(0, 151_936, table.shape, device=CUDA, dtype=torch.int32)
    for manager in managers:
        manager.token_pool.copy_(tokens)
    kernel_table, torch_table = managers
    reqs = [
        Req(torch.arange(device, dtype=torch.int32), row, cached, 8, uid, SamplingParams())
        for uid, (row, cached, device) in enumerate(ledgers)
    ]
    reqs[1].max_device_len = reqs[1].device_len  # one request samples no token
    batches = [Batch(reqs, "prefill") for _ in (0, 1)]
    prepare_inputs(batches[0], kernel_table.token_pool, table)
    torch_table.prepare_inputs(batches[1])
    for field in ("positions", "input_ids", "out_loc"):
        assert torch.equal(getattr(batches[0], field), getattr(batches[1], field)), field
    sampled = torch.randint(0, 151_936, (len(reqs),), device=CUDA)
    write_next_tokens(batches[0], sampled, kernel_table.token_pool)
    torch_table.write_next_tokens(batches[1], sampled)
    assert torch.equal(kernel_table.token_pool, torch_table.token_pool)


def test_the_engine_uses_the_kernels_on_cuda_unless_told_not_to(monkeypatch) -> None:  # noqa: ANN001
    from minisgl.engine import Engine, EngineConfig
    from minisgl.kernels.fused_layers import FusedRMSNorm
    from minisgl.kernels.kv_store import KernelKVCache
    from minisgl.kernels.extension import kernel_table_manager
    from minisgl.kernels.step_inputs import KernelTableManager

    def build() -> Engine:
        model = str(require_model(TINY_MODELS["qwen3"]))
        config = EngineConfig(model, num_pages=64, cuda_graph_max_bs=0, show_progress=False)
        return Engine(config)

    engine = build()
    assert isinstance(engine.kv_cache, KernelKVCache)
    assert kernel_table_manager(engine) is KernelTableManager  # the scheduler's, it offers
    assert isinstance(engine.model.model.norm, FusedRMSNorm)  # bf16: the layers are fused
    monkeypatch.setenv("MINISGL_KERNELS", "torch")
    engine = build()
    assert not isinstance(engine.kv_cache, KernelKVCache)
    assert not isinstance(engine.model.model.norm, FusedRMSNorm)


def greedy_tokens(kernels: str) -> list[list[int]]:
    from minisgl.scheduler import Scheduler, SchedulerConfig

    os.environ["MINISGL_KERNELS"] = kernels
    try:
        scheduler = Scheduler(
            SchedulerConfig(
                str(require_model(TINY_MODELS["qwen3"])),
                dtype=torch.float32,
                page_size=PAGE,
                num_pages=512,
                max_running_req=16,
                max_extend_tokens=64,
                show_progress=False,
            )
        )
    finally:
        del os.environ["MINISGL_KERNELS"]
    prompts = [[1 + i, *range(100 + 7 * i, 100 + 7 * i + 3 + 9 * i)] for i in range(12)]
    uids = [
        scheduler.add_request(p, SamplingParams(max_tokens=24, ignore_eos=True)) for p in prompts
    ]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    for outputs in run_until_idle(scheduler):
        for out in outputs:
            tokens[out.uid].append(out.token)
    return [tokens[uid] for uid in uids]


def test_greedy_tokens_are_the_same_with_and_without_the_kernels() -> None:
    assert greedy_tokens("triton") == greedy_tokens("torch")


def test_main_prints_the_timing_of_kernel_against_torch() -> None:
    """The chapter's main on the GPU: its checks hold, and its timing table is printed."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ch19_kernels.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "False" not in run.stdout and run.stdout.count("triton") >= 4
