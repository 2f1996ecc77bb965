"""A decode step's projections alone: cuBLAS (weights row- or column-major) against chapter 19's
few-rows kernel, at Qwen3-0.6B's four shapes and a few rows (GPU).

    python -m benchmark projection-kernels --json results.jsonl
    python -m benchmark projection-kernels --rows 1 --sweep     # the kernel's tilings too

Each product reads a weight the L2 cache cannot be holding: a CUDA graph calls it on `--copies`
weights in turn (together several times the L2), `--repeat` rounds, and the graph's time over its
calls is one call's time, as in a decode step's graph. The floor is the weight's bytes at the
GPU's bandwidth (scheduler_probes.BANDWIDTH).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minisgl.benchmark import append_result

from .scheduler_probes import bandwidth_of

# Qwen3-0.6B's projections (hidden 1024, 16 q heads and 8 kv heads of 128, MLP 3072): name ->
# (output columns N, input size K).
SHAPES: dict[str, tuple[int, int]] = {
    "qkv_proj": (4096, 1024),
    "o_proj": (1024, 2048),
    "gate_up_proj": (6144, 1024),
    "down_proj": (1024, 3072),
}
SWEEP = list(itertools.product((4, 8, 16, 32), (256, 512, 1024), (4, 8)))


def graph_us(call: Callable[[int], object], copies: int, repeat: int) -> float:
    """Microseconds per call of `call(i)` over i = 0..copies-1, `repeat` times, in one graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for i in range(copies):  # compile and warm up outside the capture
            call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            for i in range(copies):
                call(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (copies * repeat)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmark projection-kernels", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rows", default="1,2,4,8", help="comma-separated row counts")
    parser.add_argument("--copies", type=int, default=16, help="weights called in turn")
    parser.add_argument("--repeat", type=int, default=8, help="rounds over them in the graph")
    parser.add_argument(
        "--sweep", action="store_true", help="also every (BLOCK_N, BLOCK_K, warps) of SWEEP"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("projection-kernels needs a GPU")
    from minisgl.kernels.few_rows_linear import FEW_ROWS, few_rows_linear, tiling

    device, dtype = torch.device("cuda"), torch.bfloat16
    bandwidth = bandwidth_of(torch.cuda.get_device_name())
    print(
        f"{'projection':<13} {'rows':>4} {'kernel':<28} {'us':>7} {'floor us':>8} {'of floor':>8}"
    )
    for name, (n, k) in SHAPES.items():
        row_major = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(args.copies)]
        column_major = [w.t().contiguous().t() for w in row_major]
        floor_us = n * k * 2 / bandwidth * 1e6 if bandwidth else None
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, device=device, dtype=dtype)
            kernels: dict[str, Callable[[int], object]] = {
                "cublas row-major": lambda i: F.linear(x, row_major[i]),
                "cublas column-major": lambda i: F.linear(x, column_major[i]),
            }
            if rows <= FEW_ROWS:
                block = tiling(rows)
                configs = [block] + ([c for c in SWEEP if c != block] if args.sweep else [])
                for config in configs:
                    label = "few-rows {}x{} w{}".format(*config)
                    kernels[label] = lambda i, c=config: few_rows_linear(x, row_major[i], None, c)
                kernels["few-rows column-major"] = lambda i: few_rows_linear(x, column_major[i])
            for label, call in kernels.items():
                # A tiling Triton cannot compile (registers, shared memory) is reported, not fatal.
                try:
                    us = graph_us(call, args.copies, args.repeat)
                except Exception as error:
                    print(f"{name:<13} {rows:>4} {label:<28} failed: {str(error)[:80]}")
                    continue
                share = f"{floor_us / us:8.0%}" if floor_us else f"{'-':>8}"
                floor = f"{floor_us:8.2f}" if floor_us else f"{'-':>8}"
                print(f"{name:<13} {rows:>4} {label:<28} {us:7.2f} {floor} {share}")
                if args.json:
                    append_result(
                        args.json,
                        {
                            "benchmark": "projection_kernel",
                            "projection": name,
                            "n": n,
                            "k": k,
                            "rows": rows,
                            "kernel": label,
                            "us": round(us, 3),
                            "floor_us": round(floor_us, 3) if floor_us else None,
                        },
                    )
    return 0
