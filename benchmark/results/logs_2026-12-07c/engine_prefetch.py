"""The engine with a side stream that reads each decoder projection's weight into L2 ahead of
its GEMM (l2_prefetch.py's kernels), run through a benchmark subcommand.

    python engine_prefetch.py MODE DISTANCE PROGRAMS SUBCOMMAND [its options]
    python engine_prefetch.py prefetch 1 32 offline --workload single ...

MODE is off, load or prefetch. Before projection i of a forward of at most MAX_ROWS rows, the
side stream reads the weight of projection i + DISTANCE (at i = 0, projections 1..DISTANCE);
after the last projection the forward's stream waits for the side stream, as a CUDA graph's
capture requires. The hooks go on when chapter 19's extension fuses the model's layers
(`fuse_layers`, patched here), so they are in every graph the engine captures.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[2])]

import minisgl.kernels.fused_layers as fused_layers  # noqa: E402
from l2_prefetch import prefetch_l2_kernel, read_into_l2_kernel  # noqa: E402
from minisgl.layers import Linear  # noqa: E402

MAX_ROWS = 256  # prefills are compute-bound: no prefetch there


class Prefetcher:
    def __init__(self, weights: list[torch.nn.Parameter], method: str, distance: int, programs: int) -> None:
        self.weights, self.method, self.distance, self.programs = weights, method, distance, programs
        self.side = torch.cuda.Stream()
        self.sink = torch.zeros(programs, dtype=torch.float32, device="cuda")

    def fetch(self, weight: torch.Tensor) -> None:
        if self.method == "load":
            read_into_l2_kernel[(self.programs,)](
                weight, weight.numel(), self.sink, BLOCK=8192, num_warps=8
            )
        else:
            prefetch_l2_kernel[(self.programs,)](weight, weight.numel(), LINES=256, num_warps=8)

    def before(self, index: int, rows: int) -> None:
        if rows > MAX_ROWS:
            return
        wanted = range(1, self.distance + 1) if index == 0 else [index + self.distance]
        targets = [j for j in wanted if j < len(self.weights)]
        if not targets:
            return
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream())
        self.side.wait_event(ready)
        with torch.cuda.stream(self.side):
            for j in targets:
                self.fetch(self.weights[j].data)

    def join(self) -> None:
        done = torch.cuda.Event()
        done.record(self.side)
        torch.cuda.current_stream().wait_event(done)


def install(model: torch.nn.Module, method: str, distance: int, programs: int) -> int:
    layers = model.model.layers
    projections = [m for m in layers.modules() if isinstance(m, Linear)]
    prefetcher = Prefetcher([p.weight for p in projections], method, distance, programs)
    for index, projection in enumerate(projections):
        projection.register_forward_pre_hook(
            lambda module, args, i=index: prefetcher.before(i, args[0].reshape(-1, args[0].shape[-1]).shape[0])
        )
    projections[-1].register_forward_hook(lambda module, args, out: prefetcher.join())
    return len(projections)


def main() -> int:
    method, distance, programs, subcommand, *rest = sys.argv[1:]
    if method != "off":
        original = fused_layers.fuse_layers

        def fuse_and_prefetch(model: torch.nn.Module) -> int:
            changed = original(model)
            count = install(model, method, int(distance), int(programs))
            print(f"L2 prefetch: {method}, {count} projections, distance {distance}, {programs} programs")
            return changed

        fused_layers.fuse_layers = fuse_and_prefetch
    from benchmark.__main__ import SUBCOMMANDS

    module = importlib.import_module(f"benchmark.{SUBCOMMANDS[subcommand][0]}")
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
