"""Chapter 22's Triton paged attention compiled for a GPU, against the torch backend.

On the CPU, tests/test_ch22_paged_attention.py runs the kernels in Triton's interpreter on tiny
shapes; here they are compiled and run at Qwen3-0.6B's shapes (16 query heads, 8 KV heads of
128), in bfloat16 and float32, over pages of 1, 16 and 256 slots, with the split counts the
engine picks for an H200 and more. Then the engine on `models/tiny-qwen3` in float32 must give
the torch backend's greedy tokens with the triton backend, with and without CUDA graphs.
Skipped without CUDA. Run this file alone: a process that imported minisgl.kernels under
TRITON_INTERPRET=1 keeps interpreting.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_MODELS, greedy, guarded_llm, require_model
from test_gpu_attention import qwen3_h128  # noqa: F401 - the checkpoint fixture, shared

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CUDA = torch.device("cuda")
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128  # Qwen3-0.6B
# Differences from the torch backend: float32 sums in another order; bfloat16 rounds the
# softmax weights before the second product (both backends do, at different points).
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def random_batch(
    ledgers: list[tuple[int, int]], page_size: int, dtype: torch.dtype
) -> tuple[object, torch.Tensor, list]:
    """A one-layer pool of random K/V on CUDA, a page table placing each request (cached_len,
    device_len) on random pages, and the requests."""
    from minisgl.core import Req, SamplingParams
    from minisgl.kvcache import MHAKVCache

    gen = torch.Generator().manual_seed(len(ledgers) + page_size)
    longest = max(device for _, device in ledgers)
    pages_per_row = -(-longest // page_size)
    num_pages = len(ledgers) * pages_per_row + 1
    pages = torch.randperm(num_pages, generator=gen)[: len(ledgers) * pages_per_row]
    slots = pages.view(len(ledgers), pages_per_row, 1) * page_size + torch.arange(page_size)
    table = slots.view(len(ledgers), -1).to(CUDA, torch.int32).contiguous()
    pool = MHAKVCache(num_pages * page_size, 1, KV_HEADS, HEAD_DIM, dtype, CUDA)
    on_gpu = torch.Generator(device=CUDA).manual_seed(len(ledgers))  # GBs: fill them there
    for cache in (pool.k_cache(0), pool.v_cache(0)):
        cache.copy_(torch.randn(cache.shape, generator=on_gpu, device=CUDA))
    reqs = [
        Req(torch.zeros(device, dtype=torch.int32), row, cached, 4, row, SamplingParams())
        for row, (cached, device) in enumerate(ledgers)
    ]
    return pool, table, reqs


def both_backends(ledgers: list[tuple[int, int]], page_size: int, dtype: torch.dtype, phase: str):
    from minisgl.attention import TorchAttnBackend
    from minisgl.attention.triton import TritonAttnBackend
    from minisgl.core import Batch

    pool, table, reqs = random_batch(ledgers, page_size, dtype)
    outputs = []
    for backend in (TorchAttnBackend(pool, table), TritonAttnBackend(pool, table, KV_HEADS)):
        batch = Batch(reqs, phase)
        batch.out_loc = torch.cat([table[r.table_idx, r.cached_len : r.device_len] for r in reqs])
        k, v = pool.k_cache(0)[batch.out_loc.long()], pool.v_cache(0)[batch.out_loc.long()]
        q = torch.randn(
            len(batch.out_loc), HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1)
        ).to(CUDA, dtype)
        backend.prepare_metadata(batch)
        outputs.append(backend.forward(q, k, v, 0, batch).float())
    return outputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("page_size", [1, 16, 256])
@pytest.mark.parametrize("batch_size", [1, 7, 64, 256])
def test_decode_kernel_matches_the_torch_backend(batch_size, page_size, dtype) -> None:
    lengths = [1 + (97 * i) % 2048 for i in range(batch_size)]  # ragged, up to 2,048
    lengths[0] = 2048
    want, got = both_backends([(n - 1, n) for n in lengths], page_size, dtype, "decode")
    assert (got - want).abs().max().item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("num_splits", [1, 2, 5, 32])
def test_every_split_count_gives_the_same_decode(num_splits) -> None:
    from minisgl.kernels.paged_attention import decode_attention

    pool, table, reqs = random_batch([(1499, 1500), (0, 1), (299, 300)], 16, torch.float32)
    rows = torch.tensor([r.table_idx for r in reqs], dtype=torch.int32, device=CUDA)
    lens = torch.tensor([r.device_len for r in reqs], dtype=torch.int32, device=CUDA)
    q = torch.randn(3, HEADS, HEAD_DIM, device=CUDA)
    args = (q, pool.k_cache(0), pool.v_cache(0), table, rows, lens)
    error = (decode_attention(*args, num_splits) - decode_attention(*args, 1)).abs().max()
    assert error.item() <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_prefill_kernel_matches_the_torch_backend(page_size, dtype) -> None:
    ledgers = [(0, 1000), (512, 640), (16, 17), (5, 300), (0, 1)]
    want, got = both_backends(ledgers, page_size, dtype, "prefill")
    assert (got - want).abs().max().item() <= TOLERANCE[dtype]


def engine_tokens(backend: str, graph_max_bs: int) -> list[list[int]]:
    from minisgl.engine.graph import GraphRunner

    prompts = [[1 + (37 * i + 11 * j) % 5000 for j in range(5 + 9 * i)] for i in range(13)]
    llm = guarded_llm(
        require_model(TINY_MODELS["qwen3"]),
        device="cuda",
        dtype=torch.float32,
        attention_backend=backend,
        page_size=16,
        max_running_req=16,
        cuda_graph_max_bs=graph_max_bs,
        show_progress=False,
    )
    with llm:
        runner = llm.scheduler.engine.runner
        assert isinstance(runner, GraphRunner) == bool(graph_max_bs)
        outs = llm.generate(prompts, [greedy(8 + 3 * i) for i in range(len(prompts))])
    return [out["token_ids"] for out in outs]


@pytest.mark.parametrize("graph_max_bs", [0, 16], ids=["eager", "graphs"])
def test_triton_backend_gives_the_torch_backends_greedy_tokens_in_float32(graph_max_bs) -> None:
    assert engine_tokens("triton", graph_max_bs) == engine_tokens("torch", 0)


def test_hybrid_backend_decodes_on_triton_as_close_to_torch_as_flashinfer(
    qwen3_h128,  # noqa: F811 - the fixture imported above
    monkeypatch,
) -> None:
    """16 prompts x 32 greedy tokens in bf16, teacher-forced on the torch backend's tokens (as
    tests/test_gpu_attention.py does for FlashInfer): the hybrid backend, which prefills on
    FlashInfer and decodes these 16 rows on Triton, picks the torch backend's token as often."""
    from minisgl.attention.triton import TritonAttnBackend
    from test_gpu_attention import HandBatch, long_prompts

    monkeypatch.setenv("MINISGL_TRITON_DECODE_ROWS", "16")
    prompts, steps = long_prompts(16, seed=2), 32
    runs = {name: HandBatch(qwen3_h128, name, prompts, steps) for name in ("hybrid", "torch")}
    assert isinstance(runs["hybrid"].engine.attn_backend.backend_for(True, 16), TritonAttnBackend)
    agree, tokens = 0, None
    for _ in range(steps):
        picks = {name: run.step(tokens).argmax(-1) for name, run in runs.items()}
        agree += int((picks["hybrid"] == picks["torch"]).sum())
        tokens = picks["torch"].tolist()
    print(f"hybrid's greedy tokens equal to the torch backend's (bf16): {agree / (16 * steps):.1%}")
    assert agree / (16 * steps) >= 0.95
