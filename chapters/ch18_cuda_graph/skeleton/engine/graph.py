"""CUDA graphs for decode: record a decode step's kernels once, then replay them with one launch.

A decode step of a small model is hundreds of short kernels, and launching each one from Python
costs more than running it. A CUDA graph records the launches of one forward at a fixed batch
size, with fixed input and output tensors; replaying it launches them all at once. So we capture
one graph per batch size in a small ladder (1, 2, 4, 8, 16, 24, ...), and a batch of 5 replays
the graph of 8 with 3 rows of padding.

What changes between replays must live in the captured tensors: before each replay we copy the
batch's token ids, positions and KV slots into the fixed input buffers, and the attention
backend writes the batch's page lists into its fixed buffers (`prepare_for_graph`). Padding rows
store their K/V into a spare page that no request owns, and their logits are ignored.

The graph itself is a `DeviceGraph`: `CudaGraph` on a GPU. The CPU tests put a stand-in in
`GraphRunner.graph_type` whose replay re-runs the recorded forward on the same fixed tensors,
which is all a replay can see.

`capture_decode_graphs` is a row of features.RUNNERS: every engine on a GPU, with a backend
that can plan into fixed buffers, runs its decode batches with a GraphRunner it offers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol, cast

import torch
from torch import nn

from minisgl.core import Batch, Context
from minisgl.engine.engine import EagerRunner, Engine, EngineExtension

MAX_GRAPH_BATCH_SIZE = 256  # default cap of cuda_graph_max_bs


class GraphAttnBackend(Protocol):
    """What an attention backend must offer to run inside captured decode graphs."""

    def init_cuda_graph(self, max_batch_size: int) -> None: ...

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None: ...


class DeviceGraph(Protocol):
    """A recorded forward: captured once, replayed on the tensors it was captured with."""

    def capture(self, forward: Callable[[], torch.Tensor], pool: object) -> torch.Tensor:
        """Record forward(), allocating from `pool`; returns its output, rewritten per replay."""
        ...

    def replay(self) -> None: ...

    @staticmethod
    def new_pool() -> object:
        """What the graphs of one runner share: a memory pool (one graph runs at a time)."""
        ...

    @staticmethod
    def memory_in_use() -> int:
        """Bytes of device memory in use, after the device finished its queued work."""
        ...


@dataclass(frozen=True)
class CudaCapturePool:
    """What every graph of one runner shares: the memory pool, and the stream they are
    captured on (torch keeps a cuBLAS workspace per stream until the process ends)."""

    handle: object
    stream: torch.cuda.Stream


class CudaGraph:
    """torch.cuda.CUDAGraph, warmed up on the capture stream before it records."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, forward: Callable[[], torch.Tensor], pool: object) -> torch.Tensor:
        assert isinstance(pool, CudaCapturePool)
        pool.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(pool.stream):  # warm up: lazy initialisation stays out of the graph
            forward()
        with torch.cuda.graph(self.graph, pool=pool.handle, stream=pool.stream):
            return forward()

    def replay(self) -> None:
        self.graph.replay()

    @staticmethod
    def new_pool() -> object:
        return CudaCapturePool(torch.cuda.graph_pool_handle(), torch.cuda.Stream())

    @staticmethod
    def memory_in_use() -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The batch sizes to capture: 1, 2, 4, then every multiple of 8, up to max_batch_size.

    Sorted, without duplicates, all <= max_batch_size, and max_batch_size itself always in:
    every batch of 1..max_batch_size rows then has a graph at most 7 rows larger (at most
    twice its size below 8).
    """
    raise NotImplementedError("ch18: The batch sizes to capture: 1, 2, 4, then every multiple of 8, up to max_batch_size.")


class GraphRunner(EagerRunner):
    """Captures the decode forward at each graph batch size, and replays it for a batch;
    batches no graph can run (prefills, larger decodes) run eagerly."""

    graph_type: type[DeviceGraph] = CudaGraph

    def __init__(
        self,
        model: nn.Module,
        ctx: Context,
        backend: GraphAttnBackend,
        max_batch_size: int,
        pad_page: int,
    ) -> None:
        super().__init__(model, ctx, backend)
        self.backend = backend
        self.pad_page = pad_page
        self.pad_slot = pad_page * ctx.page_size
        self.batch_sizes = graph_batch_sizes(max_batch_size)
        self.max_batch_size = self.batch_sizes[-1]
        device = ctx.page_table.device
        # The fixed inputs every graph reads; graph n reads the first n rows.
        self.input_ids = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        self.positions = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.out_loc = torch.full(
            (max_batch_size,), self.pad_slot, dtype=ctx.page_table.dtype, device=device
        )
        self.graphs: dict[int, DeviceGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}  # each graph's output, overwritten per replay
        self.capture_seconds = 0.0
        self.capture_bytes = 0
        backend.init_cuda_graph(self.max_batch_size)

    def _forward(self, size: int, attn_metadata: object) -> torch.Tensor:
        """One decode forward of `size` rows over the fixed inputs: what a graph records."""
        batch = Batch([], "decode")
        # Fresh views at every call: the rotary layer caches cos/sin per positions *object*,
        # and must look them up inside the graph, not reuse the warm-up run's values.
        batch.input_ids, batch.out_loc = self.input_ids[:size], self.out_loc[:size]
        batch.positions = self.positions[:size]
        batch.attn_metadata = attn_metadata
        with self.ctx.forward_batch(batch):
            return self.model()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every graph, largest first, all sharing one memory pool.

        For each size: plan the backend for an all-padding batch of that size first
        (prepare_for_graph on Batch([], "decode"): planning runs on the host, and the graph may
        only read its results in the fixed buffers), then graph = self.graph_type() and
        self.logits[size] = graph.capture(forward of that size, pool). Largest first, so the
        smaller graphs reuse the pool's blocks. Record capture_seconds and capture_bytes
        (graph_type.memory_in_use() before and after).
        """
        raise NotImplementedError("ch18: Capture every graph, largest first, all sharing one memory pool.")

    def can_run(self, batch: Batch) -> bool:
        """True for a decode batch no larger than the largest graph: prefills run eagerly."""
        raise NotImplementedError("ch18: True for a decode batch no larger than the largest graph: prefills run eagerly.")

    def graph_size(self, batch_size: int) -> int:
        """The smallest captured batch size that holds `batch_size` rows."""
        raise NotImplementedError("ch18: The smallest captured batch size that holds `batch_size` rows.")

    def prepare(self, batch: Batch) -> None:
        """Plan the attention of the graph this batch will replay (its metadata), or of its
        eager forward."""
        if self.can_run(batch):
            self.backend.prepare_for_graph(batch, self.graph_size(batch.size), self.pad_page)
        else:
            super().prepare(batch)

    def run(self, batch: Batch) -> torch.Tensor:
        """The logits of a prepared batch: a graph's replay, or the eager forward."""
        return self.replay(batch) if self.can_run(batch) else super().run(batch)

    def replay(self, batch: Batch) -> torch.Tensor:
        """Copy the batch into the fixed inputs, replay its graph; logits [batch size, vocab].

        Copy input_ids, positions and out_loc into the first batch.size rows of the fixed
        buffers (copy_, never a new tensor: the graph reads these very tensors), point the
        padding rows' out_loc up to the graph's size at self.pad_slot, replay the graph of
        graph_size(batch.size), and return the first batch.size rows of its logits.
        """
        raise NotImplementedError("ch18: Copy the batch into the fixed inputs, replay its graph; logits [batch size, vocab].")


def wanted_graph_batch_size(engine: Engine) -> int:
    """Largest decode batch the engine's config asks CUDA graphs for; 0 without a GPU (or
    with cuda_graph_max_bs=0)."""
    if engine.device.type != "cuda":
        return 0
    wanted = engine.config.cuda_graph_max_bs
    if wanted is None:
        wanted = MAX_GRAPH_BATCH_SIZE
    return min(wanted, engine.config.max_running_req)


def graph_max_batch_size(engine: Engine) -> int:
    """Largest decode batch to replay from a CUDA graph; 0 when graphs do not apply: they
    need a GPU and a backend that plans into fixed buffers (FlashInfer's, Triton's)."""
    if not hasattr(engine.attn_backend, "prepare_for_graph"):
        return 0
    return wanted_graph_batch_size(engine)


def reserve_padding_page(engine: Engine) -> None:
    """Before the KV pool is built: keep one page past the scheduler's for the padding rows of
    graphs, where graphs may be captured (a page is all they write: every padding row stores
    its K/V into the same slot)."""
    if wanted_graph_batch_size(engine) > 0:
        engine.spare_pages += 1


# Chapter 18's change to every engine (a row of features.ENGINE_EXTENSIONS): the padding page.
GRAPH_PADDING = EngineExtension(configure=reserve_padding_page)


def capture_decode_graphs(engine: Engine) -> GraphRunner | None:
    """A GraphRunner for the engine with every graph captured (None where graphs do not apply:
    the engine keeps its eager runner; features.RUNNERS asks).

    Padding rows store their K/V into the first spare page past the scheduler's pages, which
    `reserve_padding_page` kept when the pool was sized.
    """
    max_batch_size = graph_max_batch_size(engine)
    if max_batch_size == 0:
        return None
    assert engine.spare_pages > 0, "reserve_padding_page runs wherever graphs may apply"
    backend = cast(GraphAttnBackend, engine.attn_backend)
    runner = GraphRunner(engine.model, engine.ctx, backend, max_batch_size, engine.num_pages)
    runner.capture()
    return runner
