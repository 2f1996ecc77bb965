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
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
from torch import nn

from minisgl.core import Batch, Context


class GraphAttnBackend(Protocol):
    """What an attention backend must offer to run inside captured decode graphs."""

    def init_cuda_graph(self, max_batch_size: int) -> None: ...

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None: ...


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The batch sizes to capture: 1, 2, 4, then every multiple of 8, up to max_batch_size."""
    sizes = [n for n in (1, 2, 4) if n < max_batch_size]
    sizes += list(range(8, max_batch_size, 8)) + [max_batch_size]
    return sorted(set(sizes))


class GraphRunner:
    """Captures the decode forward at each graph batch size, and replays it for a batch."""

    def __init__(
        self,
        model: nn.Module,
        ctx: Context,
        backend: GraphAttnBackend,
        max_batch_size: int,
        pad_page: int,
    ) -> None:
        self.model, self.ctx, self.backend = model, ctx, backend
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
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}  # each graph's output, overwritten per replay
        self.capture_seconds = 0.0
        self.capture_bytes = 0
        backend.init_cuda_graph(self.max_batch_size)

    def _graph_batch(self, size: int, attn_metadata: object) -> Batch:
        """A decode batch of `size` rows over the fixed inputs, to capture with."""
        batch = Batch([], "decode")
        batch.input_ids, batch.out_loc = self.input_ids[:size], self.out_loc[:size]
        # A fresh view each time: the rotary layer caches cos/sin per positions *object*, and
        # must compute them inside the graph, not reuse values from the warm-up run.
        batch.positions = self.positions[:size]
        batch.attn_metadata = attn_metadata
        return batch

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every graph, largest first, all sharing one memory pool."""
        start, free_before = time.perf_counter(), torch.cuda.mem_get_info()[0]
        stream = torch.cuda.Stream()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.batch_sizes):
            # Plan before capturing: planning runs on the host, and only its results (in the
            # backend's fixed buffers) may be read by the graph. All rows are padding here.
            planned = Batch([], "decode")
            self.backend.prepare_for_graph(planned, size, self.pad_page)
            graph = torch.cuda.CUDAGraph()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up: lazy initialisation stays out of the graph
                with self.ctx.forward_batch(self._graph_batch(size, planned.attn_metadata)):
                    self.model()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                with self.ctx.forward_batch(self._graph_batch(size, planned.attn_metadata)):
                    self.logits[size] = self.model()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        self.capture_bytes = free_before - torch.cuda.mem_get_info()[0]

    def can_run(self, batch: Batch) -> bool:
        return batch.is_decode and batch.size <= self.max_batch_size

    def graph_size(self, batch_size: int) -> int:
        """The smallest captured batch size that holds `batch_size` rows."""
        return next(n for n in self.batch_sizes if n >= batch_size)

    def prepare(self, batch: Batch) -> None:
        """Plan the attention of the graph this batch will replay (its metadata)."""
        self.backend.prepare_for_graph(batch, self.graph_size(batch.size), self.pad_page)

    def replay(self, batch: Batch) -> torch.Tensor:
        """Copy the batch into the fixed inputs, replay its graph; logits [batch size, vocab]."""
        size, graph_size = batch.size, self.graph_size(batch.size)
        self.input_ids[:size].copy_(batch.input_ids)
        self.positions[:size].copy_(batch.positions)
        self.out_loc[:size].copy_(batch.out_loc)
        # Rows past the batch may hold a larger earlier batch's slots: point them at the spare
        # page again, or the padding would overwrite live K/V.
        self.out_loc[size:graph_size].fill_(self.pad_slot)
        self.graphs[graph_size].replay()
        return self.logits[graph_size][:size]
