"""Time paged decode attention kernels alone, against the floor of reading the KV cache.

    python benchmark/attention_kernels.py --batch-sizes 64,256 --contexts 512,2048 --json r.jsonl

One layer of Qwen3-0.6B's attention (16 query heads, 8 KV heads of 128, bf16), every request
`context` tokens long, pages (of `--page-sizes` slots) scattered over the pool as a long run
leaves them. For each kernel (FlashInfer's decode on CUDA cores or on tensor cores,
TensorRT-LLM's XQA as FlashInfer ships it), page size and KV layout (NHD: a page is
[page_size, kv_heads, head_dim]; HND: [kv_heads, page_size, head_dim]), the kernel is set up
once (FlashInfer's plan) and timed with CUDA events (`median_seconds`); every output is
compared with the first variant's. The floor is the KV bytes the kernel must read, at the GPU's
memory bandwidth given by `--bandwidth` (H200: 4.8 TB/s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from minisgl.benchmark import append_result

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128


KERNELS = (
    "flashinfer",
    "flashinfer-tc",
    "flashinfer-fa3",
    "xqa",
)  # FlashInfer decode (CUDA cores, tensor cores through FA2 or FA3's prefill kernel), XQA


def decode_runner(
    kernel: str, batch_size: int, context: int, page_size: int, layout: str
) -> Callable[[], torch.Tensor]:
    """A function that runs one decode of `kernel` over a random pool (the same values for the
    same batch, context, page size and layout, whatever the kernel)."""
    import flashinfer

    device = torch.device("cuda")
    pages_per_req = -(-context // page_size)
    num_pages = batch_size * pages_per_req
    generator = torch.Generator(device="cpu").manual_seed(0)
    pages = torch.randperm(num_pages, generator=generator).to(device, torch.int32)
    torch.manual_seed(0)
    shape = (
        (num_pages, page_size, KV_HEADS, HEAD_DIM)
        if layout == "NHD"
        else (num_pages, KV_HEADS, page_size, HEAD_DIM)
    )
    k_cache = torch.randn(shape, dtype=torch.bfloat16, device=device)
    v_cache = torch.randn(shape, dtype=torch.bfloat16, device=device)
    q = torch.randn(batch_size, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    workspace = torch.zeros(128 * 2**20, dtype=torch.uint8, device=device)
    if kernel == "xqa":
        from flashinfer.decode import xqa_batch_decode_with_kv_cache

        block_tables = pages.view(batch_size, pages_per_req)
        seq_lens = torch.full((batch_size,), context, dtype=torch.uint32, device=device)
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
    indptr = torch.arange(0, num_pages + 1, pages_per_req, dtype=torch.int32)
    last_page_len = torch.full(
        (batch_size,), context - (pages_per_req - 1) * page_size, dtype=torch.int32
    )
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        kv_layout=layout,
        use_tensor_cores=kernel != "flashinfer",
        backend="fa3" if kernel == "flashinfer-fa3" else "auto",
    )
    wrapper.plan(
        indptr,
        pages,
        last_page_len,
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        page_size,
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,64,256")
    parser.add_argument("--contexts", default="512,2048")
    parser.add_argument("--page-sizes", default="16")
    parser.add_argument("--layouts", default="NHD,HND")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=", ".join(KERNELS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes per second")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
