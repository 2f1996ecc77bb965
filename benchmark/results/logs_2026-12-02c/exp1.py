"""Call 1 of 2026-12-02 (day): kernels as the engine runs them, inside CUDA graphs.

attn: one decode attention per layer over 28 layers (4 distinct KV pools in turn, so the L2
      cannot hold them), captured in one CUDA graph and replayed: per-layer time including
      the gaps between kernels, as in the engine's decode graphs. FlashInfer's tensor-core
      decode in graph mode (the engine's wrapper) against chapter 22's Triton decode tilings.
gemm: the four projections of 28 Qwen3-0.6B layers (distinct weights) and the LM head, in
      one graph, per batch size M, with torch's default BLAS and with cuBLASLt preferred.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, "benchmark")
from minisgl.attention.triton import sm_count  # noqa: E402
from minisgl.kernels.paged_attention import (  # noqa: E402
    DecodeConfig,
    decode_attention,
    decode_partials,
    num_decode_splits,
)

HEADS, KV_HEADS, HEAD_DIM, LAYERS, POOLS, PAGE = 16, 8, 128, 28, 4, 256
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/exp1.jsonl")
dev = torch.device("cuda")


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")


def graph_seconds(body, replays: int = 20) -> float:
    body()  # warm-up / compile outside the graph
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(replays):
            g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3 / replays)
    del g
    return sorted(times)[2]


TRITON = {
    "triton": DecodeConfig(),
    "t-n32-w2-s3-x4": DecodeConfig(block_n=32, num_warps=2, num_stages=3, waves=4),
    "t-n64-w4-s3-x4": DecodeConfig(block_n=64, num_warps=4, num_stages=3, waves=4),
    "t-n64-w4-s4-x2": DecodeConfig(block_n=64, num_warps=4, num_stages=4, waves=2),
    "t-n128-w4-s3-x2": DecodeConfig(block_n=128, num_warps=4, num_stages=3, waves=2),
    "t-n128-w8-s2-x2": DecodeConfig(block_n=128, num_warps=8, num_stages=2, waves=2),
    "t-n64-w4-s2-x8": DecodeConfig(block_n=64, num_warps=4, num_stages=2, waves=8),
}


def attn(batches: list[int], contexts: list[int]) -> None:
    import flashinfer

    sms = sm_count(dev)
    for context in contexts:
        for batch in batches:
            pages_per_req = -(-context // PAGE)
            num_pages = batch * pages_per_req
            gen = torch.Generator().manual_seed(0)
            pages = torch.randperm(num_pages, generator=gen).to(dev, torch.int32)
            kv = [
                (
                    torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev),
                    torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev),
                )
                for _ in range(POOLS)
            ]
            q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
            floor = batch * context * KV_HEADS * HEAD_DIM * 2 * 2 / 4.8e12
            row: dict[str, float] = {}
            # FlashInfer, graph mode, as minisgl's FlashInferBackend sets it up
            ws = torch.zeros(128 * 2**20, dtype=torch.uint8, device=dev)
            indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
            indices = torch.zeros(num_pages, dtype=torch.int32, device=dev)
            last = torch.ones(batch, dtype=torch.int32, device=dev)
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                ws, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=True,
                paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last,
            )
            w.plan(
                torch.arange(0, num_pages + 1, pages_per_req, dtype=torch.int32),
                pages,
                torch.full((batch,), context - (pages_per_req - 1) * PAGE, dtype=torch.int32),
                num_qo_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, page_size=PAGE,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, non_blocking=True,
            )
            ref = w.run(q, kv[0])
            row["fi-tc"] = graph_seconds(lambda: [w.run(q, kv[i % POOLS]) for i in range(LAYERS)])
            per_req = pages.view(batch, -1).long()
            table = (per_req[:, :, None] * PAGE + torch.arange(PAGE, device=dev)).view(batch, -1)
            table = table[:, :context].to(torch.int32).contiguous()
            rows = torch.arange(batch, dtype=torch.int32, device=dev)
            lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
            flat = [(k.flatten(0, 1), v.flatten(0, 1)) for k, v in kv]
            for name, cfg in TRITON.items():
                splits = num_decode_splits(batch, KV_HEADS, sms, cfg.waves)
                try:
                    out = decode_attention(q, *flat[0], table, rows, lens, splits, cfg)
                    err = (out.float() - ref.float()).abs().max().item()
                    row[name] = graph_seconds(
                        lambda: [
                            decode_attention(q, *flat[i % POOLS], table, rows, lens, splits, cfg)
                            for i in range(LAYERS)
                        ]
                    )
                    if name == "triton":
                        row["triton-nomerge"] = graph_seconds(
                            lambda: [
                                decode_partials(q, *flat[i % POOLS], table, rows, lens, splits, cfg)
                                for i in range(LAYERS)
                            ]
                        )
                    if err > 0.05:
                        print(f"  {name} differs from FlashInfer by {err}")
                except Exception as exc:  # a tiling may not fit shared memory
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}")
            per_layer = {k: v / LAYERS * 1e6 for k, v in row.items()}
            best = min((v, k) for k, v in per_layer.items() if k != "triton-nomerge")
            print(
                f"ctx {context:5d} batch {batch:4d} floor {floor * 1e6:6.1f} us | "
                + " ".join(f"{k} {v:6.1f}" for k, v in per_layer.items())
                + f" | best {best[1]}",
                flush=True,
            )
            emit({"benchmark": "graph_attention", "context": context, "batch": batch,
                  "page_size": PAGE, "floor_us": floor * 1e6, "us_per_layer": per_layer})
            del kv, flat, ws
            torch.cuda.empty_cache()


def gemm(ms: list[int]) -> None:
    shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
    weights = {
        n: [torch.randn(o, i, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(LAYERS)]
        for n, (o, i) in shapes.items()
    }
    lm = torch.randn(151936, 1024, dtype=torch.bfloat16, device=dev) * 0.02
    for lib in ("default", "cublaslt", "cublas"):
        if lib != "default":
            torch.backends.cuda.preferred_blas_library(lib)
        for m in ms:
            xs = {n: torch.randn(m, i, dtype=torch.bfloat16, device=dev) for n, (o, i) in shapes.items()}
            row = {}
            for n in shapes:
                row[n] = graph_seconds(lambda: [F.linear(xs[n], w) for w in weights[n]]) * 1e6
            row["lm_head"] = graph_seconds(lambda: F.linear(xs["qkv"], lm)) * 1e6
            row["all"] = graph_seconds(
                lambda: [F.linear(xs[n], weights[n][i]) for i in range(LAYERS) for n in shapes]
                + [F.linear(xs["qkv"], lm)]
            ) * 1e6
            floor = (sum(o * i for o, i in shapes.values()) * LAYERS + 151936 * 1024) * 2 / 4.8e12 * 1e6
            print(f"{lib:9s} M {m:4d}: " + " ".join(f"{k} {v:7.1f}" for k, v in row.items())
                  + f" us/step (floor {floor:.1f})", flush=True)
            emit({"benchmark": "graph_gemm", "blas": lib, "m": m, "us_per_step": row,
                  "floor_us": floor})


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "attn":
        attn([1, 4, 16, 32, 64, 128, 192, 256], [512, 1024, 2048])
    elif what == "gemm":
        gemm([1, 4, 16, 32, 64, 128, 192, 256])
