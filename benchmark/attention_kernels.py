"""Time paged attention kernels alone, against the floor of reading the KV cache.

    python -m benchmark attention-kernels --batch-sizes 64,256 --contexts 512,2048 --json r.jsonl

One layer of Qwen3-0.6B's attention (16 query heads, 8 KV heads of 128, bf16), every request
`context` tokens long, pages (of `--page-sizes` slots) scattered over the pool as a long run
leaves them. For each kernel (FlashInfer's decode on CUDA cores or on tensor cores,
TensorRT-LLM's XQA as FlashInfer ships it, chapter 22's Triton decode in a few tilings), page
size and KV layout (NHD: a page is [page_size, kv_heads, head_dim]; HND: [kv_heads, page_size,
head_dim]; the Triton kernel reads minisgl's pool, NHD only), the kernel is set up once
(FlashInfer's plan) and timed with CUDA events (`median_seconds`); every output is compared
with the first variant's. The floor is the KV bytes the kernel must read, at the GPU's memory
bandwidth given by `--bandwidth` (H200: 4.8 TB/s).

With --prefill it also times causal prefill over paged KV, FlashInfer's against chapter 22's,
at the sizes of PREFILL_CASES (one line each, kernel "flashinfer-prefill" or "triton-prefill").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from minisgl.benchmark import append_result
from minisgl.kernels.paged_attention import DecodeConfig

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
XQA_PAGE_SIZES = (16, 32, 64, 128)  # the pages flashinfer 0.6.6's XQA compiles for
# Chapter 22's decode in three tilings, so one GPU run can pick the best: the default (blocks of
# 64 keys, 4 warps, splits for 2 programs per SM), small blocks with more programs in flight,
# and large blocks with 8 warps.
TRITON_DECODE = {
    "triton": DecodeConfig(),
    "triton-n32-x4": DecodeConfig(block_n=32, num_warps=2, num_stages=3, waves=4),
    "triton-n128-w8": DecodeConfig(block_n=128, num_warps=8, num_stages=2, waves=2),
}


KERNELS = (
    "flashinfer",
    "flashinfer-tc",
    "flashinfer-fa3",
    "xqa",
    *TRITON_DECODE,
)  # FlashInfer decode (CUDA cores; tensor cores through FA2's or FA3's prefill kernel), XQA,
# chapter 22's Triton decode
# (batch, new tokens, cached tokens) of each prefill case: one long prompt, a batch of prompts,
# and chunked-prefill tails after a long cached prefix.
PREFILL_CASES = ((1, 4096, 0), (8, 512, 0), (4, 512, 3584))


class RandomPool(NamedTuple):
    """Random bf16 keys and values of `batch` requests of `context` tokens each, on shuffled
    pages of a pool, FlashInfer's CSR lists of them, and random queries."""

    pages: torch.Tensor  # [num_pages] int32 on the GPU: request i owns its i-th run of pages
    k_cache: torch.Tensor  # [num_pages, page_size, kv heads, head dim] (NHD) or HND
    v_cache: torch.Tensor
    q: torch.Tensor  # [queries, heads, head dim]
    kv_indptr: torch.Tensor  # [batch + 1] int32 on the host
    last_page_len: torch.Tensor  # [batch] int32 on the host


def random_pool(
    batch_size: int, context: int, page_size: int, layout: str, queries: int, seed: int
) -> RandomPool:
    """The same pool for the same arguments, whichever kernel reads it."""
    device = torch.device("cuda")
    pages_per_req = -(-context // page_size)
    num_pages = batch_size * pages_per_req
    generator = torch.Generator(device="cpu").manual_seed(seed)
    pages = torch.randperm(num_pages, generator=generator).to(device, torch.int32)
    torch.manual_seed(seed)
    shape = (
        (num_pages, page_size, KV_HEADS, HEAD_DIM)
        if layout == "NHD"
        else (num_pages, KV_HEADS, page_size, HEAD_DIM)
    )
    k_cache = torch.randn(shape, dtype=torch.bfloat16, device=device)
    v_cache = torch.randn(shape, dtype=torch.bfloat16, device=device)
    q = torch.randn(queries, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    kv_indptr = torch.arange(0, num_pages + 1, pages_per_req, dtype=torch.int32)
    last_page_len = torch.full(
        (batch_size,), context - (pages_per_req - 1) * page_size, dtype=torch.int32
    )
    return RandomPool(pages, k_cache, v_cache, q, kv_indptr, last_page_len)


def decode_runner(
    kernel: str, batch_size: int, context: int, page_size: int, layout: str
) -> Callable[[], torch.Tensor]:
    """A function that runs one decode of `kernel` over a random pool (the same values for the
    same batch, context, page size and layout, whatever the kernel)."""
    import flashinfer

    pool = random_pool(batch_size, context, page_size, layout, queries=batch_size, seed=0)
    q, k_cache, v_cache, pages = pool.q, pool.k_cache, pool.v_cache, pool.pages
    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device=q.device)
    if kernel in TRITON_DECODE:
        return triton_decode_runner(TRITON_DECODE[kernel], q, k_cache, v_cache, pages, context)
    if kernel == "xqa":
        from flashinfer.decode import xqa_batch_decode_with_kv_cache

        block_tables = pages.view(batch_size, -1)
        seq_lens = torch.full((batch_size,), context, dtype=torch.uint32, device=q.device)
        return lambda: xqa_batch_decode_with_kv_cache(
            q,
            (k_cache, v_cache),
            workspace,
            block_tables,
            seq_lens,
            context,
            bmm1_scale=HEAD_DIM**-0.5,
            kv_layout=layout,
        )
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        kv_layout=layout,
        use_tensor_cores=kernel != "flashinfer",
        backend="fa3" if kernel == "flashinfer-fa3" else "auto",
    )
    wrapper.plan(
        pool.kv_indptr,
        pages,
        pool.last_page_len,
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        page_size,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
    )
    return lambda: wrapper.run(q, (k_cache, v_cache))


def slot_table(pages: torch.Tensor, batch_size: int, page_size: int, context: int) -> torch.Tensor:
    """minisgl's page table for requests on `pages` (in order, pages_per_req each): entry
    [request, pos] is the pool slot of token pos."""
    per_req = pages.view(batch_size, -1).long()
    slots = per_req[:, :, None] * page_size + torch.arange(page_size, device=pages.device)
    return slots.view(batch_size, -1)[:, :context].to(torch.int32).contiguous()


def triton_decode_runner(
    config: DecodeConfig,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pages: torch.Tensor,
    context: int,
) -> Callable[[], torch.Tensor]:
    """Chapter 22's decode over the same NHD pages, as minisgl's pool and page table see them,
    with the split count the engine would pick for this batch on this GPU."""
    from minisgl.attention.triton import sm_count
    from minisgl.kernels.paged_attention import decode_attention, num_decode_splits

    batch_size, page_size = q.shape[0], k_cache.shape[1]
    table = slot_table(pages, batch_size, page_size, context)
    rows = torch.arange(batch_size, dtype=torch.int32, device=q.device)
    seq_lens = torch.full((batch_size,), context, dtype=torch.int32, device=q.device)
    splits = num_decode_splits(batch_size, KV_HEADS, sm_count(q.device), config.waves)
    pool_k, pool_v = k_cache.flatten(0, 1), v_cache.flatten(0, 1)  # [slots, kv_heads, head_dim]
    return lambda: decode_attention(q, pool_k, pool_v, table, rows, seq_lens, splits, config)


def prefill_runner(
    kernel: str, batch_size: int, extend: int, cached: int, page_size: int
) -> Callable[[], torch.Tensor]:
    """Causal prefill of `extend` new tokens per request after `cached` cached ones, by
    FlashInfer ("flashinfer-prefill") or chapter 22's kernel ("triton-prefill"), over the same
    random NHD pages."""
    import flashinfer

    from minisgl.kernels.paged_attention import prefill_attention

    context = cached + extend
    pool = random_pool(batch_size, context, page_size, "NHD", batch_size * extend, seed=1)
    q, k_cache, v_cache, pages = pool.q, pool.k_cache, pool.v_cache, pool.pages
    device = q.device
    qo_indptr = torch.arange(0, batch_size * extend + 1, extend, dtype=torch.int32)
    if kernel == "triton-prefill":
        table = slot_table(pages, batch_size, page_size, context)
        rows = torch.arange(batch_size, dtype=torch.int32, device=device)
        seq_lens = torch.full((batch_size,), context, dtype=torch.int32, device=device)
        cached_lens = torch.full((batch_size,), cached, dtype=torch.int32, device=device)
        pool_k, pool_v = k_cache.flatten(0, 1), v_cache.flatten(0, 1)
        dev_indptr = qo_indptr.to(device)
        return lambda: prefill_attention(
            q, pool_k, pool_v, table, rows, seq_lens, cached_lens, dev_indptr, extend
        )
    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    wrapper.plan(
        qo_indptr,
        pool.kv_indptr,
        pages,
        pool.last_page_len,
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        page_size,
        causal=True,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
    )
    return lambda: wrapper.run(q, (k_cache, v_cache))


def median_seconds(run: Callable[[], torch.Tensor], repeat: int, inner: int = 20) -> float:
    """Median device seconds of one `run()`, after three warm-up runs.

    Each sample times `inner` runs queued back to back between two CUDA events: timing a single
    run would add the host's launch cost (tens of microseconds) to a kernel that is idle-waited
    for. A kernel shorter than its launch stays host-bound even so (batch 1)."""
    for _ in range(3):
        run()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark attention-kernels", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--batch-sizes", default="1,64,256")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--page-sizes", default="16")
    parser.add_argument("--layouts", default="NHD,HND")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=", ".join(KERNELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes per second")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--prefill", action="store_true", help="also time prefill kernels")
    args = parser.parse_args(argv)
    print(f"{'batch':>6}{'context':>8}  {'kernel':<30}{'us':>9}{'floor us':>9}{'TB/s':>7}")
    for batch_size in map(int, args.batch_sizes.split(",")):
        for context in map(int, args.contexts.split(",")):
            kv_bytes = 2 * batch_size * context * KV_HEADS * HEAD_DIM * 2
            floor = kv_bytes / args.bandwidth
            variants = [
                (kernel, page_size, layout)
                for kernel in args.kernels.split(",")
                for page_size in map(int, args.page_sizes.split(","))
                for layout in args.layouts.split(",")
                if layout == "NHD" or kernel not in TRITON_DECODE  # minisgl's pool is NHD
                if kernel != "xqa" or page_size in XQA_PAGE_SIZES
            ]
            references: dict[tuple[int, str], torch.Tensor] = {}
            for kernel, page_size, layout in variants:
                run = decode_runner(kernel, batch_size, context, page_size, layout)
                start = time.perf_counter()
                out = run()  # the first call compiles what is not compiled yet
                first_s = time.perf_counter() - start
                # kernels over the same values must agree
                reference = references.setdefault((page_size, layout), out)
                error = (out.float() - reference.float()).abs().max().item()
                seconds = median_seconds(run, args.repeat)
                label = f"{kernel}, page {page_size}, {layout}"
                print(
                    f"{batch_size:>6}{context:>8}  {label:<30}{seconds * 1e6:>9.1f}"
                    f"{floor * 1e6:>9.1f}{kv_bytes / seconds / 1e12:>7.2f}"
                    f"  max diff {error:.2e}, first call {first_s:.1f} s",
                    flush=True,
                )
                if args.json:
                    append_result(
                        args.json,
                        {
                            "benchmark": "attention_kernel",
                            "phase": "decode",
                            "kernel": kernel,
                            "page_size": page_size,
                            "layout": layout,
                            "max_diff": error,
                            "batch": batch_size,
                            "context": context,
                            "seconds": seconds,
                            "floor_s": floor,
                        },
                    )
    if args.prefill:
        time_prefill(args)
    return 0


def time_prefill(args: argparse.Namespace) -> None:
    """FlashInfer's and chapter 22's causal prefill at each PREFILL_CASES size and page size.
    Prefill is bound by arithmetic, not by reading the KV cache; the floor is still reported
    (every key and value read once) to show how far above it the work puts the kernels."""
    for batch_size, extend, cached in PREFILL_CASES:
        context = cached + extend
        kv_bytes = 2 * batch_size * context * KV_HEADS * HEAD_DIM * 2
        floor = kv_bytes / args.bandwidth
        for page_size in map(int, args.page_sizes.split(",")):
            reference = None
            for kernel in ("flashinfer-prefill", "triton-prefill"):
                run = prefill_runner(kernel, batch_size, extend, cached, page_size)
                out = run()
                reference = out if reference is None else reference
                error = (out.float() - reference.float()).abs().max().item()
                seconds = median_seconds(run, args.repeat)
                print(
                    f"prefill {batch_size} x {extend} after {cached}, page {page_size}: "
                    f"{kernel:<20}{seconds * 1e6:>9.1f} us (KV floor {floor * 1e6:.1f} us)"
                    f"  max diff {error:.2e}",
                    flush=True,
                )
                if args.json:
                    append_result(
                        args.json,
                        {
                            "benchmark": "attention_kernel",
                            "phase": "prefill",
                            "kernel": kernel,
                            "page_size": page_size,
                            "layout": "NHD",
                            "max_diff": error,
                            "batch": batch_size,
                            "extend": extend,
                            "context": context,
                            "seconds": seconds,
                            "floor_s": floor,
                        },
                    )
