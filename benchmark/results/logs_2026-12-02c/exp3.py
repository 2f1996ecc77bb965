"""Call 3 of 2026-12-02 (day).

attn:    FlashInfer's tensor-core decode in graph mode with and without split-KV
         (plan(disable_split_kv=True): no merge kernel), and chapter 22's Triton decode, per
         layer inside a CUDA graph of 28 layers, at uniform contexts and at contexts drawn
         uniformly from [100, 2048] (the official workload's spread).
idle:    the official workload under torch.profiler (CUDA activity only): how much of the
         timed generate's span the GPU runs no kernel, and in which gaps.
nosplit: the official workload with split-KV disabled in the decode graphs of >= T rows,
         against the default, alternating.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, "benchmark")
sys.path.insert(0, ".gpu")
from exp1 import graph_seconds  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS, POOLS, PAGE = 16, 8, 128, 28, 4, 256
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/exp3.jsonl")
dev = torch.device("cuda")


def emit(record: dict) -> None:
    record["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with OUT.open("a") as f:
        f.write(json.dumps(record) + "\n")


def attn() -> None:
    import flashinfer

    from minisgl.attention.triton import sm_count
    from minisgl.kernels.paged_attention import DecodeConfig, decode_attention, num_decode_splits

    sms = sm_count(dev)
    cases = [("uniform", c) for c in (1024,)] + [("spread", 0)]
    for kind, context in cases:
        for batch in (16, 32, 64, 128, 192, 256):
            rng = random.Random(batch)
            lens = [context] * batch if kind == "uniform" else [rng.randint(100, 2048) for _ in range(batch)]
            npages = [-(-n // PAGE) for n in lens]
            num_pages = sum(npages)
            gen = torch.Generator().manual_seed(0)
            pages = torch.randperm(num_pages, generator=gen).to(torch.int32)
            kv = [
                (
                    torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev),
                    torch.randn(num_pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev),
                )
                for _ in range(POOLS)
            ]
            q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=dev)
            floor = sum(lens) * KV_HEADS * HEAD_DIM * 2 * 2 / 4.8e12
            indptr_host = torch.tensor([0] + list(__import__("itertools").accumulate(npages)), dtype=torch.int32)
            last_host = torch.tensor([n - (p - 1) * PAGE for n, p in zip(lens, npages)], dtype=torch.int32)
            row: dict[str, float] = {}
            for name, nosplit in (("fi-tc", False), ("fi-tc-nosplit", True)):
                ws = torch.zeros(128 * 2**20, dtype=torch.uint8, device=dev)
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    ws, kv_layout="NHD", use_cuda_graph=True, use_tensor_cores=True,
                    paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=dev),
                    paged_kv_indices_buffer=torch.zeros(num_pages, dtype=torch.int32, device=dev),
                    paged_kv_last_page_len_buffer=torch.ones(batch, dtype=torch.int32, device=dev),
                )
                w.plan(indptr_host, pages.to(dev), last_host, num_qo_heads=HEADS, num_kv_heads=KV_HEADS,
                       head_dim=HEAD_DIM, page_size=PAGE, q_data_type=torch.bfloat16,
                       kv_data_type=torch.bfloat16, non_blocking=True, disable_split_kv=nosplit)
                if name == "fi-tc":
                    ref = w.run(q, kv[0]).float()
                else:
                    err = (w.run(q, kv[0]).float() - ref).abs().max().item()
                    if err > 0.05:
                        print(f"  nosplit differs by {err}")
                row[name] = graph_seconds(lambda: [w.run(q, kv[i % POOLS]) for i in range(LAYERS)])
            # Triton over the same pages: request i's slots, position by position
            starts = indptr_host.tolist()
            width = max(lens)
            table = torch.zeros(batch, width, dtype=torch.int32)
            for i, n in enumerate(lens):
                req_pages = pages[starts[i] : starts[i + 1]].long()
                slots = (req_pages[:, None] * PAGE + torch.arange(PAGE)).flatten()[:n]
                table[i, :n] = slots.to(torch.int32)
            table = table.to(dev)
            rows = torch.arange(batch, dtype=torch.int32, device=dev)
            seq = torch.tensor(lens, dtype=torch.int32, device=dev)
            flat = [(k.flatten(0, 1), v.flatten(0, 1)) for k, v in kv]
            for name, cfg in (("triton", DecodeConfig()),
                              ("t-n32-x4", DecodeConfig(block_n=32, num_warps=2, num_stages=3, waves=4))):
                splits = num_decode_splits(batch, KV_HEADS, sms, cfg.waves)
                err = (decode_attention(q, *flat[0], table, rows, seq, splits, cfg).float() - ref).abs().max().item()
                if err > 0.05:
                    print(f"  {name} differs by {err}")
                row[name] = graph_seconds(
                    lambda: [decode_attention(q, *flat[i % POOLS], table, rows, seq, splits, cfg) for i in range(LAYERS)]
                )
            per_layer = {k: v / LAYERS * 1e6 for k, v in row.items()}
            print(f"{kind:7s} ctx {context or 'U[100,2048]':>11} batch {batch:4d} floor {floor * 1e6:6.1f} us | "
                  + " ".join(f"{k} {v:6.1f}" for k, v in per_layer.items()), flush=True)
            emit({"benchmark": "graph_attention_split", "kind": kind, "context": context, "batch": batch,
                  "floor_us": floor * 1e6, "us_per_layer": per_layer})
            del kv, flat
            torch.cuda.empty_cache()


def patch_nosplit() -> None:
    """Decode graphs of >= EXP_NOSPLIT rows plan without split-KV (no merge kernel)."""
    from minisgl.attention.fi import FlashInferBackend

    def plan_decode(self, wrapper, described) -> None:  # noqa: ANN001
        threshold = int(os.environ.get("EXP_NOSPLIT", "0") or 0)
        rows = len(described.kv_indptr) - 1
        nosplit = bool(threshold) and wrapper is not self.decode_wrapper and rows >= threshold
        wrapper.plan(
            described.kv_indptr, described.kv_indices, described.last_page_len,
            head_dim=self.head_dim, disable_split_kv=nosplit, **self._plan_common(),
        )

    FlashInferBackend.plan_decode = plan_decode


def idle() -> None:
    import offline
    from minisgl.benchmark import WORKLOADS, make_workload
    from minisgl.llm import LLM

    generate = LLM.generate
    calls = []

    def profiled(llm, *args, **kwargs):  # noqa: ANN001
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = generate(llm, *args, **kwargs)
            torch.cuda.synchronize()
        calls.append(prof)
        return out

    LLM.generate = profiled
    model = offline.resolve_model(offline.RANDOM_MODEL, torch.bfloat16)
    work = make_workload(WORKLOADS["official"], 0)
    start = time.perf_counter()
    result = offline.run_variant(model, "official", work, torch.bfloat16, "minisgl", 1)
    print(f"profiled official run: {result.seconds:.2f} s (whole variant {time.perf_counter() - start:.0f} s)")
    prof = calls[-1]
    spans = []
    for e in prof.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA:
            spans.append((e.start_ns(), e.start_ns() + e.duration_ns()))
    spans.sort()
    busy, gaps = 0, []
    cur_s, cur_e = spans[0]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = spans[-1][1] - spans[0][0]
    hist = {}
    for lo, hi in ((0, 2e3), (2e3, 10e3), (10e3, 50e3), (50e3, 200e3), (200e3, 1e12)):
        sel = [g for g in gaps if lo <= g < hi]
        hist[f"{lo / 1e3:g}-{hi / 1e3:g}us"] = (len(sel), sum(sel) / 1e9)
    print(f"GPU span {span / 1e9:.3f} s, busy {busy / 1e9:.3f} s ({busy / span:.1%}), idle {(span - busy) / 1e9:.3f} s "
          f"in {len(gaps)} gaps; {len(spans)} kernels/copies")
    for k, (n, s) in hist.items():
        print(f"  gaps {k:>14}: {n:7d}  {s:.3f} s")
    emit({"benchmark": "official_gpu_idle", "span_s": span / 1e9, "busy_s": busy / 1e9, "gaps": hist,
          "events": len(spans), "run_s": result.seconds})


def nosplit(variants: str) -> None:
    import offline

    patch_nosplit()
    for t in (64, 128):
        offline.VARIANTS[f"nosplit{t}"] = {}
        offline.VARIANT_ENV[f"nosplit{t}"] = {"EXP_NOSPLIT": str(t)}
    offline.main([
        "--workload", "official", "--model", "random-qwen3-0.6b", "--dtype", "bfloat16",
        "--variants", variants, "--json", str(OUT.parent / "results.jsonl"),
    ])


if __name__ == "__main__":
    {"attn": attn, "idle": idle}.get(sys.argv[1], lambda: nosplit(sys.argv[3]))()
