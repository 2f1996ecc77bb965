"""Call 2 of 2026-12-02 (day).

gemm:   a skinny Triton GEMM (y = x W^T, bf16, fp32 accumulation, optional split-K with a
        reduce kernel) in a sweep of tilings, against cuBLAS (x W^T and x Wt with the weight
        stored transposed), each as 28 layers of distinct weights in one CUDA graph.
hybrid: the official workload with FlashInfer's prefill and chapter 22's Triton decode
        (tiling chosen by the graph's batch size, no merge when a context is one chunk),
        against the engine's default, alternating.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, "benchmark")
sys.path.insert(0, ".gpu")
from exp1 import graph_seconds  # noqa: E402

OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/exp2.jsonl")
LAYERS = 28
dev = torch.device("cuda")


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")


@triton.jit
def skinny_gemm_kernel(
    x_ptr, w_ptr, y_ptr, part_ptr, M, N, K, sxm, swn, sym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_chunk = K // SPLIT_K
    offs_k = pid_k * k_chunk + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * sxm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * swn + offs_k[None, :]
    m_ok = offs_m[:, None] < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k_chunk, BLOCK_K):
        x = tl.load(x_ptrs, mask=m_ok, other=0.0)
        w = tl.load(w_ptrs)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SPLIT_K == 1:
        tl.store(y_ptr + offs_m[:, None] * sym + offs_n[None, :], acc.to(tl.bfloat16), mask=m_ok)
    else:
        tl.store(part_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=m_ok)


@triton.jit
def split_reduce_kernel(part_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.load(part_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(y_ptr + offs, acc.to(tl.bfloat16), mask=ok)


def skinny_gemm(x, w, cfg):
    block_m, block_n, block_k, split_k, warps, stages = cfg
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    part = torch.empty(split_k, M, N, dtype=torch.float32, device=x.device) if split_k > 1 else y
    grid = (N // block_n, split_k, triton.cdiv(M, block_m))
    skinny_gemm_kernel[grid](
        x, w, y, part, M, N, K, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        num_warps=warps, num_stages=stages,
    )
    if split_k > 1:
        split_reduce_kernel[(triton.cdiv(M * N, 1024),)](part, y, M * N, SPLIT_K=split_k, BLOCK=1024)
    return y


def gemm() -> None:
    shapes = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
    weights = {
        n: [torch.randn(o, i, dtype=torch.bfloat16, device=dev) * 0.02 for _ in range(LAYERS)]
        for n, (o, i) in shapes.items()
    }
    transposed = {n: [w.t().contiguous() for w in ws] for n, ws in weights.items()}
    for m in (1, 16, 64, 128, 256):
        block_ms = [16] if m <= 16 else [64] if m <= 128 else [64, 128]
        totals = {"cublas": 0.0, "cublas-t": 0.0, "best": 0.0}
        for name, (n_out, k_in) in shapes.items():
            x = torch.randn(m, k_in, dtype=torch.bfloat16, device=dev)
            ws, wts = weights[name], transposed[name]
            res = {
                "cublas": graph_seconds(lambda: [F.linear(x, w) for w in ws]) / LAYERS * 1e6,
                "cublas-t": graph_seconds(lambda: [x @ w for w in wts]) / LAYERS * 1e6,
            }
            ref = F.linear(x, ws[0]).float()
            for bm in block_ms:
                for bn in (32, 64, 128):
                    for bk in (128, 256):
                        for sk in (1, 2, 4):
                            if k_in % (sk * bk) or n_out % bn:
                                continue
                            for warps, stages in ((4, 4), (4, 6)) if bk == 128 else ((4, 4),):
                                cfg = (bm, bn, bk, sk, warps, stages)
                                try:
                                    err = (skinny_gemm(x, ws[0], cfg).float() - ref).abs().max().item()
                                    if err > 0.05:
                                        print(f"  {name} M {m} {cfg}: error {err}")
                                        continue
                                    res[str(cfg)] = graph_seconds(
                                        lambda: [skinny_gemm(x, w, cfg) for w in ws]
                                    ) / LAYERS * 1e6
                                except Exception as exc:
                                    print(f"  {cfg}: {type(exc).__name__} {str(exc)[:80]}")
            tri = {k: v for k, v in res.items() if k.startswith("(")}
            best = min(tri, key=tri.get)
            top = sorted(tri, key=tri.get)[:4]
            print(
                f"M {m:4d} {name:8s} cublas {res['cublas']:5.2f} us  cublas-t {res['cublas-t']:5.2f}"
                f"  triton best {tri[best]:5.2f} {best}  next: "
                + ", ".join(f"{k} {tri[k]:.2f}" for k in top[1:]),
                flush=True,
            )
            totals["cublas"] += res["cublas"] * LAYERS
            totals["cublas-t"] += res["cublas-t"] * LAYERS
            totals["best"] += tri[best] * LAYERS
            emit({"benchmark": "graph_skinny_gemm", "m": m, "shape": name, "us_per_call": res})
        print(f"M {m:4d} per step (28 layers, 4 GEMMs): " + "  ".join(f"{k} {v:.0f} us" for k, v in totals.items()), flush=True)


# ----- hybrid attention ----------------------------------------------------------------------

def register_hybrid() -> None:
    from minisgl.attention.base import BackendEntry, register_backend
    from minisgl.attention.fi import create_flashinfer_backend, flashinfer_usable
    from minisgl.attention.triton import TritonAttnBackend
    from minisgl.kernels import paged_attention as pa

    def tiling(batch: int) -> pa.DecodeConfig:
        if batch >= 256 or 128 <= batch < 192:
            return pa.DecodeConfig(block_n=32, num_warps=2, num_stages=3, waves=4)
        if batch >= 192:
            return pa.DecodeConfig(block_n=128, num_warps=4, num_stages=3, waves=2)
        return pa.DEFAULT_DECODE

    def decode(q, k_cache, v_cache, table, rows, seq_lens, num_splits, cfg):
        if num_splits > 1:
            return pa.decode_attention(q, k_cache, v_cache, table, rows, seq_lens, num_splits, cfg)
        batch, heads, head_dim = q.shape
        out = torch.empty(batch, heads, head_dim, dtype=q.dtype, device=q.device)
        lse = torch.empty(batch, heads, 1, dtype=torch.float32, device=q.device)
        kv_heads = k_cache.shape[1]
        group = heads // kv_heads
        pa.decode_kernel[(batch, kv_heads, 1)](
            q, k_cache, v_cache, table, rows, seq_lens, out, lse,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), table.stride(0),
            head_dim**-0.5, head_dim, GROUP=group, NUM_SPLITS=1,
            BLOCK_GROUP=max(16, triton.next_power_of_2(group)), BLOCK_N=cfg.block_n,
            BLOCK_DIM=head_dim, DOT_PRECISION="tf32", num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        return out

    class Hybrid(TritonAttnBackend):
        def __init__(self, setup):
            super().__init__(setup.kv_cache, setup.page_table, setup.num_kv_heads)
            self.fi = create_flashinfer_backend(setup)

        def num_splits(self, batch_size: int) -> int:
            return pa.num_decode_splits(batch_size, self.num_kv_heads, self.sm_count, tiling(batch_size).waves)

        def prepare_metadata(self, batch) -> None:
            if batch.is_decode:
                super().prepare_metadata(batch)
            else:
                self.fi.prepare_metadata(batch)

        def forward(self, q, k, v, layer_id, batch):
            if not batch.is_decode:
                return self.fi.forward(q, k, v, layer_id, batch)
            self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
            meta = batch.attn_metadata
            return decode(
                q, self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id),
                self.page_table, meta.rows, meta.seq_lens, meta.num_splits, tiling(q.shape[0]),
            )

    register_backend("hybrid", BackendEntry(create=Hybrid, usable=flashinfer_usable, priority=0))


def hybrid(variants: str) -> None:
    import offline

    register_hybrid()
    offline.VARIANTS["hybrid"] = {"attention_backend": "hybrid"}
    offline.main([
        "--workload", "official", "--model", "random-qwen3-0.6b", "--dtype", "bfloat16",
        "--variants", variants, "--json", str(OUT.parent / "results.jsonl"),
    ])


if __name__ == "__main__":
    if sys.argv[1] == "gemm":
        gemm()
    else:
        hybrid(sys.argv[3] if len(sys.argv) > 3 else "minisgl,hybrid,minisgl,hybrid")
