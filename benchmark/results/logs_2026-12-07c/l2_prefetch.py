"""Can a side stream that pulls the next projection's weight into L2 speed up a batch-1 step?

A batch-1 decode step of Qwen3-0.6B reads 1.2 GB of weights through 112 projections, each of
which cuBLAS runs at 21-54% of the H100's bandwidth (gpu_report, 2026-12-07): a kernel that
small never has enough bytes in flight. Between the projections the step runs norms, RoPE and
attention, which read little. This probe times a CUDA graph of Qwen3-0.6B's 28 layers at one row
(the engine's fused RMSNorm and SiLU-and-mul, cuBLAS projections with o_proj and down_proj stored
column-major as the engine stores them, a spin standing in for attention, and the LM head), with
and without a second stream in the graph that reads a projection's weight ahead of its GEMM.

    python l2_prefetch.py [--spin-cycles 10000]

Prints one line per variant: microseconds per step, the median of --replays replays.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from minisgl.kernels.fused_layers import rmsnorm, silu_and_mul

HIDDEN, Q, KV, MLP, VOCAB, LAYERS = 1024, 2048, 1024, 3072, 151936, 28


@triton.jit
def read_into_l2_kernel(ptr, n, sink_ptr, BLOCK: tl.constexpr):
    """Read ptr[0:n] (grid-strided, BLOCK elements a program a pass), keeping it in L2; the sum
    is stored only if it is an impossible value, so the loads cannot be dropped."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        x = tl.load(ptr + offsets, mask=offsets < n, other=0.0, eviction_policy="evict_last")
        acc += x.to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(sink_ptr + pid, total, mask=total == 1.2345e-30)


@triton.jit
def prefetch_l2_kernel(ptr, n, LINES: tl.constexpr):
    """Issue prefetch.global.L2 for every 128-byte line of ptr[0:n] (bf16), grid-strided: the
    thread does not wait for the data."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * LINES * 64
    for start in range(pid * LINES * 64, n, step):
        offsets = start + tl.arange(0, LINES) * 64
        tl.inline_asm_elementwise(
            "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;",
            "=r,l",
            [ptr + offsets],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


class Weights:
    def __init__(self, device: torch.device, distinct_layers: int) -> None:
        def make(n: int, k: int, column_major: bool) -> torch.Tensor:
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
            return w.t().contiguous().t() if column_major else w

        made = [
            [make(Q + 2 * KV, HIDDEN, False), make(HIDDEN, Q, True),
             make(2 * MLP, HIDDEN, False), make(HIDDEN, MLP, True)]
            for _ in range(distinct_layers)
        ]
        self.layers = [made[i % distinct_layers] for i in range(LAYERS)]
        self.norm = torch.ones(HIDDEN, device=device, dtype=torch.bfloat16)
        self.lm_head = make(VOCAB, HIDDEN, False)

    def sequence(self) -> list[torch.Tensor]:
        """Every projection weight in the order the step reads them."""
        return [w for layer in self.layers for w in layer]


def step(
    w: Weights, x: torch.Tensor, spin: int, before_gemm: Callable[[int], None]
) -> torch.Tensor:
    residual = torch.zeros_like(x)
    index = 0
    for qkv_w, o_w, gu_w, d_w in w.layers:
        h, residual = rmsnorm(x, w.norm, 1e-6, residual)
        before_gemm(index)
        qkv = F.linear(h, qkv_w)
        q = (qkv[:, :Q] * 1.0).contiguous()  # stands in for norm-RoPE
        if spin:
            torch.cuda._sleep(spin)  # stands in for the KV store and the attention
        before_gemm(index + 1)
        o = F.linear(q, o_w)
        h, residual = rmsnorm(o, w.norm, 1e-6, residual)
        before_gemm(index + 2)
        gu = F.linear(h, gu_w)
        s = silu_and_mul(gu)
        before_gemm(index + 3)
        x = F.linear(s, d_w)
        index += 4
    h, _ = rmsnorm(x, w.norm, 1e-6, residual)
    return F.linear(h, w.lm_head)


def time_graph(build: Callable[[], None], replays: int) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        build()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spin-cycles", type=int, default=10000)
    parser.add_argument("--replays", type=int, default=30)
    args = parser.parse_args()
    device = torch.device("cuda")
    print(torch.cuda.get_device_name(), "L2", torch.cuda.get_device_properties(0).L2_cache_size)
    x = torch.randn(1, HIDDEN, device=device, dtype=torch.bfloat16)
    sink = torch.zeros(1024, device=device, dtype=torch.float32)
    distinct = Weights(device, LAYERS)
    hot = Weights(device, 1)
    weights = distinct.sequence()

    def plain(w: Weights) -> Callable[[], None]:
        return lambda: step(w, x, args.spin_cycles, lambda i: None)

    def ahead(distance: int, programs: int, method: str) -> Callable[[], None]:
        """Before GEMM i, a side stream reads the weight of GEMM i + distance (the first
        `distance` are read at the step's start)."""

        def fetch(t: torch.Tensor) -> None:
            if method == "load":
                read_into_l2_kernel[(programs,)](t, t.numel(), sink, BLOCK=8192, num_warps=8)
            else:
                prefetch_l2_kernel[(programs,)](t, t.numel(), LINES=256, num_warps=8)

        def build() -> None:
            side = torch.cuda.Stream()
            main_stream = torch.cuda.current_stream()

            def launch(targets: list[int]) -> None:
                ready = torch.cuda.Event()
                ready.record(main_stream)
                side.wait_event(ready)
                with torch.cuda.stream(side):
                    for j in targets:
                        if j < len(weights):
                            fetch(weights[j])

            launch(list(range(distance)))
            step(distinct, x, args.spin_cycles, lambda i: launch([i + distance]))
            done = torch.cuda.Event()
            done.record(side)
            main_stream.wait_event(done)

        return build

    variants: dict[str, Callable[[], None]] = {
        "plain (28 distinct layers)": plain(distinct),
        "hot (one layer's weights 28 times, L2 upper bound)": plain(hot),
    }
    for method in ("load", "prefetch"):
        for distance in (1, 2):
            for programs in (8, 16, 32, 66):
                variants[f"{method} ahead {distance}, {programs} programs"] = ahead(
                    distance, programs, method
                )
    variants["plain again"] = plain(distinct)
    timed: dict[str, float] = {}
    for name, build in variants.items():
        try:
            us = time_graph(build, args.replays)
        except Exception as error:  # a variant that cannot compile is reported, not fatal
            print(f"{name:<52} failed: {str(error)[:200]}")
            continue
        timed[name] = us
        print(f"{name:<52} {us:9.1f} us a step", flush=True)
    # The fastest side-stream variant, as "BEST method distance programs" for the shell.
    ahead_times = {n: us for n, us in timed.items() if " ahead " in n}
    if ahead_times:
        best = min(ahead_times, key=ahead_times.__getitem__)
        method, _, distance, programs = best.replace(",", "").split()[:4]
        print("BEST", method, distance, programs)


if __name__ == "__main__":
    main()
