"""FlashInfer for prefills and large decodes, our Triton decode for small ones:
attention_backend="hybrid".

The two backends read the same KV pool through the same page table, so a step may take either.
This one routes each batch by what it is: a decode batch of at most `triton_max_rows` rows
(of its CUDA graph's rows, when it replays one) goes to the Triton backend of chapter 22, which
describes a batch with one small copy and splits each context over the SMs; any other batch
(prefills, mixed batches, larger decodes) goes to FlashInfer's.

A layer's forward follows the metadata that `prepare_metadata` (or `prepare_for_graph`) left on
the batch, so it runs the kernels the batch was prepared for, inside a graph too, where the
batch the layers see is not the one the scheduler built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from minisgl.attention.base import ATTENTION_BACKENDS, AttnSetup, BackendEntry, BaseAttnBackend
from minisgl.attention.fi import FlashInferBackend
from minisgl.attention.triton import TritonAttnBackend, TritonAttnMetadata, chosen_by_name_only
from minisgl.env import ENV

if TYPE_CHECKING:
    from minisgl.core import Batch

# Decode batches up to this many rows run on Triton: a graph batch size. On an H100 Triton's
# decode step was the faster at every batch size from 1 to 256 where all contexts were 512
# tokens, yet the hybrid ran the official workload slower than FlashInfer alone, up to 16 rows
# on Triton or up to 64, in every comparison where it ran second and one of three where it ran
# first (2026-12-07, chapter 22's page and benchmark/gpu_report.md).
TRITON_MAX_ROWS = 16


class HybridAttnBackend(BaseAttnBackend):
    def __init__(
        self, flashinfer: FlashInferBackend, triton: TritonAttnBackend, triton_max_rows: int
    ) -> None:
        self.flashinfer, self.triton, self.triton_max_rows = flashinfer, triton, triton_max_rows

    def backend_for(self, is_decode: bool, rows: int) -> BaseAttnBackend:
        """Triton's backend for a decode of at most triton_max_rows rows, else FlashInfer's."""
        small_decode = is_decode and rows <= self.triton_max_rows
        return self.triton if small_decode else self.flashinfer

    def prepare_metadata(self, batch: Batch) -> None:
        self.backend_for(batch.is_decode, batch.size).prepare_metadata(batch)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        prepared_by_triton = isinstance(batch.attn_metadata, TritonAttnMetadata)
        backend = self.triton if prepared_by_triton else self.flashinfer
        return backend.forward(q, k, v, layer_id, batch)

    # ----- CUDA graphs (chapter 18): each graph is captured on the backend of its size --------

    def init_cuda_graph(self, max_batch_size: int) -> None:
        self.flashinfer.init_cuda_graph(max_batch_size)
        self.triton.init_cuda_graph(min(max_batch_size, self.triton_max_rows))

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None:
        backend = self.backend_for(True, graph_batch_size)
        backend.prepare_for_graph(batch, graph_batch_size, pad_page)


def create_hybrid_backend(setup: AttnSetup) -> HybridAttnBackend:
    """Both backends over the engine's setup, each built by its own row of
    ATTENTION_BACKENDS; ConfigError where either cannot be. MINISGL_TRITON_DECODE_ROWS sets the
    largest decode that runs on Triton: a CUDA graph batch size, so that a batch runs the same
    kernels replayed or not."""
    triton = cast(TritonAttnBackend, ATTENTION_BACKENDS["triton"].create(setup))
    flashinfer = cast(FlashInferBackend, ATTENTION_BACKENDS["flashinfer"].create(setup))
    rows = ENV.TRITON_DECODE_ROWS
    return HybridAttnBackend(flashinfer, triton, TRITON_MAX_ROWS if rows is None else rows)


# "auto" does not pick it, as it does not pick Triton's alone: on an H100 it lost the official
# workload to FlashInfer alone in every comparison where it ran second, and in one of the three
# where it ran first (benchmark/gpu_report.md, "2026-12-07, day").
HYBRID_BACKEND = BackendEntry(create=create_hybrid_backend, usable=chosen_by_name_only, priority=0)
