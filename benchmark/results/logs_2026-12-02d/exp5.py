"""Call 3 of 2026-12-02 (evening session): a length-balanced Triton decode.

Chapter 22's decode cuts each request's context into NUM_SPLITS chunks of its own length /
NUM_SPLITS. Balanced: every request's chunks are ceil(longest / NUM_SPLITS) keys (the batch's
longest context, read from a device scalar), so a short request has fewer non-empty chunks and
every program that works does about the same work; the split count can then aim at more waves.

attn:   per layer inside a CUDA graph of 28 layers, contexts drawn from [100, 2048]: FlashInfer's
        tensor-core decode, chapter 22's decode (waves 2 and 8), balanced (waves 4, 8, 16).
hybrid: the official workload: FlashInfer's prefill, and for decode graphs of at most EXP_T
        rows the balanced Triton decode (waves EXP_WAVES), FlashInfer's above; alternating.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from itertools import accumulate
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, "benchmark")
sys.path.insert(0, ".gpu")
from minisgl.kernels import paged_attention as pa  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS, POOLS, PAGE = 16, 8, 128, 28, 4, 256
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/exp5.jsonl")
dev = torch.device("cuda")


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")


@triton.jit
def balanced_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, page_table_ptr, rows_ptr, seq_lens_ptr, max_len_ptr,
    partial_out_ptr, partial_lse_ptr, q_token_stride, q_head_stride, cache_slot_stride,
    cache_head_stride, table_row_stride, sm_scale, head_dim,
    GROUP: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    req = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + req)
    row = tl.load(rows_ptr + req).to(tl.int64)
    longest = tl.load(max_len_ptr)
    chunk = tl.cdiv(tl.cdiv(longest, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    groups = tl.arange(0, BLOCK_GROUP)
    dims = tl.arange(0, BLOCK_DIM)
    heads = kv_head * GROUP + groups
    row_ok = groups < GROUP
    dim_ok = dims < head_dim
    part = (req * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split
    if start >= end:  # an empty chunk: zeros and an LSE of -inf, which the merge weighs 0
        tl.store(partial_out_ptr + part[:, None] * BLOCK_DIM + dims[None, :],
                 tl.zeros([BLOCK_GROUP, BLOCK_DIM], tl.float32), mask=row_ok[:, None])
        tl.store(partial_lse_ptr + part, tl.full([BLOCK_GROUP], float("-inf"), tl.float32), mask=row_ok)
    else:
        q = tl.load(q_ptr + req * q_token_stride + heads[:, None] * q_head_stride + dims[None, :],
                    mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
        m_i = tl.full([BLOCK_GROUP], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_GROUP], dtype=tl.float32)
        acc = tl.zeros([BLOCK_GROUP, BLOCK_DIM], dtype=tl.float32)
        for block_start in range(start, end, BLOCK_N):
            pos = block_start + tl.arange(0, BLOCK_N)
            key_ok = pos < end
            k, v = pa.load_kv_block(k_cache_ptr, v_cache_ptr, page_table_ptr + row * table_row_stride,
                                    pos, key_ok, kv_head * cache_head_stride, cache_slot_stride, dims, dim_ok)
            m_i, l_i, acc = pa.online_softmax_step(q, k, v, key_ok[None, :], m_i, l_i, acc, sm_scale, DOT_PRECISION)
        out = acc / l_i[:, None]
        tl.store(partial_out_ptr + part[:, None] * BLOCK_DIM + dims[None, :], out, mask=row_ok[:, None])
        tl.store(partial_lse_ptr + part, m_i + tl.log(l_i), mask=row_ok)


def balanced_decode(q, k_cache, v_cache, table, rows, seq_lens, max_len, num_splits, cfg):
    batch, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = num_heads // kv_heads
    partial_out = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    partial_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    balanced_decode_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, table, rows, seq_lens, max_len, partial_out, partial_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), table.stride(0),
        head_dim**-0.5, head_dim, GROUP=group, NUM_SPLITS=num_splits,
        BLOCK_GROUP=max(16, triton.next_power_of_2(group)), BLOCK_N=cfg.block_n, BLOCK_DIM=head_dim,
        DOT_PRECISION=pa.dot_precision(q.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    out = torch.empty_like(q)
    pa.merge_partials(partial_out, partial_lse, out)
    return out


def attn() -> None:
    import flashinfer
    from exp1 import graph_seconds

    from minisgl.attention.triton import sm_count

    sms = sm_count(dev)
    for batch in (16, 32, 64, 96, 128, 192, 256):
        rng = random.Random(batch)
        lens = [rng.randint(100, 2048) for _ in range(batch)]
        npages = [-(-n // PAGE) for n in lens]
        num_pages = sum(npages)
        pages = torch.randperm(num_pages, generator=torch.Generator().manual_seed(0)).to(torch.int32)
        kv = [(torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev),
               torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev))
              for _ in range(POOLS)]
        q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
        floor = sum(lens) * KV_HEADS * HEAD_DIM * 2 * 2 / 4.8e12
        indptr_host = torch.tensor([0, *accumulate(npages)], dtype=torch.int32)
        last_host = torch.tensor([n - (p - 1) * PAGE for n, p in zip(lens, npages)], dtype=torch.int32)
        row: dict[str, float] = {}
        ws = torch.zeros(128 * 2**20, dtype=torch.uint8, device=dev)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            ws, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=True,
            paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=dev),
            paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device=dev),
            paged_kv_last_page_len_buffer=torch.ones(batch, dtype=torch.int32, device=dev))
        w.plan(indptr_host, pages.to(dev), last_host, num_qo_heads=HEADS, num_kv_heads=KV_HEADS,
               head_dim=HEAD_DIM, page_size=PAGE, q_data_type=torch.bfloat16,
               kv_data_type=torch.bfloat16, non_blocking=True)
        ref = w.run(q, kv[0]).float()
        row["fi-tc"] = graph_seconds(lambda: [w.run(q, kv[i % POOLS]) for i in range(LAYERS)])
        starts = indptr_host.tolist()
        table = torch.zeros(batch, max(lens), dtype=torch.int32)
        for i, n in enumerate(lens):
            req_pages = pages[starts[i]: starts[i + 1]].long()
            table[i, :n] = (req_pages[:, None] * PAGE + torch.arange(PAGE)).flatten()[:n].to(torch.int32)
        table = table.to(dev)
        rows = torch.arange(batch, dtype=torch.int32, device=dev)
        seq = torch.tensor(lens, dtype=torch.int32, device=dev)
        longest = torch.tensor([max(lens)], dtype=torch.int32, device=dev)
        flat = [(k.flatten(0, 1), v.flatten(0, 1)) for k, v in kv]
        variants = []
        for waves in (2, 8):
            variants.append((f"ch22-x{waves}", waves, False))
        for waves in (4, 8, 16):
            variants.append((f"bal-x{waves}", waves, True))
        for name, waves, balanced in variants:
            cfg = pa.DecodeConfig(waves=waves)
            splits = pa.num_decode_splits(batch, KV_HEADS, sms, waves)
            if balanced:
                fn = lambda i: balanced_decode(q, *flat[i % POOLS], table, rows, seq, longest, splits, cfg)  # noqa: E731
            else:
                fn = lambda i: pa.decode_attention(q, *flat[i % POOLS], table, rows, seq, splits, cfg)  # noqa: E731
            err = (fn(0).float() - ref).abs().max().item()
            if err > 0.05:
                print(f"  {name} differs by {err}")
            row[name] = graph_seconds(lambda: [fn(i) for i in range(LAYERS)])
        per_layer = {k: v / LAYERS * 1e6 for k, v in row.items()}
        print(f"spread U[100,2048] batch {batch:4d} floor {floor * 1e6:6.1f} us | "
              + " ".join(f"{k} {v:6.1f}" for k, v in per_layer.items()), flush=True)
        emit({"benchmark": "graph_attention_balanced", "kind": "spread", "batch": batch,
              "floor_us": floor * 1e6, "us_per_layer": per_layer})
        del kv, flat
        torch.cuda.empty_cache()


def register_hybrid(threshold: int, waves: int) -> None:
    from minisgl.attention.base import BackendEntry, register_backend
    from minisgl.attention.fi import FlashInferMetadata, create_flashinfer_backend, flashinfer_usable
    from minisgl.attention.triton import TritonAttnBackend, TritonAttnMetadata
    from minisgl.utils import make_device_tensor

    cfg = pa.DecodeConfig(waves=waves)

    class Hybrid(TritonAttnBackend):
        def __init__(self, setup):
            super().__init__(setup.kv_cache, setup.page_table, setup.num_kv_heads)
            self.fi = create_flashinfer_backend(setup)
            self._longest = torch.zeros(1, dtype=torch.int32, device=self.device)

        def num_splits(self, batch_size: int) -> int:
            return pa.num_decode_splits(batch_size, self.num_kv_heads, self.sm_count, waves)

        def prepare_metadata(self, batch) -> None:
            self.fi.prepare_metadata(batch)  # eager batches (prefill, and decode without graphs)

        def init_cuda_graph(self, max_batch_size: int) -> None:
            super().init_cuda_graph(max_batch_size)
            self.fi.init_cuda_graph(max_batch_size)

        def prepare_for_graph(self, batch, graph_batch_size: int, pad_page: int) -> None:
            if graph_batch_size > threshold:
                return self.fi.prepare_for_graph(batch, graph_batch_size, pad_page)
            pad = [0] * (graph_batch_size - batch.size)
            lens = [req.device_len for req in batch.reqs]
            host = [[req.table_idx for req in batch.reqs] + pad, lens + pad,
                    [max(lens, default=1)] + [0] * (graph_batch_size - 1)]
            fixed = self._graph_batch[:, :graph_batch_size]
            fixed.copy_(make_device_tensor(host, torch.int32, self.device), non_blocking=True)
            batch.attn_metadata = TritonAttnMetadata(
                last_indices=self._graph_rows[:graph_batch_size], rows=fixed[0], seq_lens=fixed[1],
                cached_lens=fixed[2], qo_indptr=self._graph_indptr[: graph_batch_size + 1],
                max_extend_len=1, num_splits=self.num_splits(graph_batch_size))

        def forward(self, q, k, v, layer_id, batch):
            meta = batch.attn_metadata
            if isinstance(meta, FlashInferMetadata):
                return self.fi.forward(q, k, v, layer_id, batch)
            self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
            return balanced_decode(q, self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id),
                                   self.page_table, meta.rows, meta.seq_lens, meta.cached_lens[:1],
                                   meta.num_splits, cfg)

    register_backend("hybrid", BackendEntry(create=Hybrid, usable=flashinfer_usable, priority=0))


def hybrid(variants: str) -> None:
    import offline

    register_hybrid(int(os.environ.get("EXP_T", "128")), int(os.environ.get("EXP_WAVES", "8")))
    offline.VARIANTS["hybrid"] = {"attention_backend": "hybrid"}
    offline.main(["--workload", "official", "--model", "random-qwen3-0.6b", "--dtype", "bfloat16",
                  "--variants", variants, "--step-times", "--json", str(OUT)])


if __name__ == "__main__":
    if sys.argv[1] == "attn":
        attn()
    else:
        hybrid(sys.argv[3] if len(sys.argv) > 3 else "minisgl,hybrid,minisgl,hybrid")
