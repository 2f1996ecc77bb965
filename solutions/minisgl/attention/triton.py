"""Paged attention with our own Triton kernels (chapter 22): attention_backend="triton".

Where FlashInfer wants the batch as CSR page lists and a plan made on the host, our kernels
read the page table itself, so a batch is described by four small numbers per request: its
table row, its length (device_len), its cached length and where its new tokens start in the
batch. They go to the device in one copy, once per batch; every layer's kernels read them
there, so the step path never waits for the device.

Decode cuts each context into `num_splits` chunks (kernels/paged_attention.py), a number
chosen from the batch size alone. That is what CUDA graphs need (chapter 18): a graph replays
a fixed grid, so each captured batch size gets its split count, and its kernels read the
batch from fixed device buffers that `prepare_for_graph` refills before each replay.

triton is imported only when this backend is built: the engine runs without it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minisgl.attention.base import (
    AttnSetup,
    BackendEntry,
    BaseAttnBackend,
    BaseAttnMetadata,
)
from minisgl.env import ENV
from minisgl.kvcache.base import BaseKVCachePool
from minisgl.utils import ConfigError, make_device_tensor

if TYPE_CHECKING:
    from minisgl.core import Batch

# The interpreter runs one program at a time, so a CPU has no SMs to fill; this many keeps
# split-KV (and its merge) in play in the CPU runs, as it is on a GPU.
CPU_SM_COUNT = 4


@dataclass
class TritonAttnMetadata(BaseAttnMetadata):
    rows: torch.Tensor  # [batch] int32: each request's page-table row
    seq_lens: torch.Tensor  # [batch] int32: its tokens so far, device_len (0 for a padding row)
    cached_lens: torch.Tensor  # [batch] int32: of them already in the KV cache
    qo_indptr: torch.Tensor  # [batch + 1] int32: where each request's new tokens start
    max_extend_len: int  # the longest extend: sizes the prefill grid
    num_splits: int  # chunks per context in decode


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors the decode grid should fill (CPU_SM_COUNT on a CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SM_COUNT


class TritonAttnBackend(BaseAttnBackend):
    def __init__(
        self, kv_cache: BaseKVCachePool, page_table: torch.Tensor, num_kv_heads: int
    ) -> None:
        from minisgl.kernels import paged_attention  # imports triton: only when built

        self.kernels = paged_attention
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.num_kv_heads = num_kv_heads
        self.device = page_table.device
        self.sm_count = sm_count(self.device)
        # CUDA graphs: the fixed buffers the captured kernels read, set up by init_cuda_graph.
        self._graph_batch = torch.empty(3, 0, dtype=torch.int32, device=self.device)
        self._graph_indptr = torch.empty(0, dtype=torch.int32, device=self.device)
        self._graph_rows = torch.empty(0, dtype=torch.int64, device=self.device)

    def num_splits(self, batch_size: int) -> int:
        return self.kernels.num_decode_splits(batch_size, self.num_kv_heads, self.sm_count)

    def prepare_metadata(self, batch: Batch) -> None:
        """Copy each request's table row, lengths and first query row to the device, once.

        Pack [rows, seq_lens (device_len), cached_lens, qo_indptr (batch + 1, from 0, adding
        up extend_len)] into one host list, one make_device_tensor(..., torch.int32) copy, and
        split it on the device. last_indices = qo_indptr[1:] - 1 (int64), max_extend_len from
        the host's ledgers, num_splits from the batch size. No host sync: every number the
        host needs comes from the ledgers.
        """
        size = batch.size
        extend_lens = [req.extend_len for req in batch.reqs]
        qo_indptr = [0]
        for n in extend_lens:
            qo_indptr.append(qo_indptr[-1] + n)
        host = (
            [req.table_idx for req in batch.reqs]
            + [req.device_len for req in batch.reqs]
            + [req.cached_len for req in batch.reqs]
            + qo_indptr
        )
        packed = make_device_tensor(host, torch.int32, self.device)
        rows, seq_lens, cached_lens, indptr = packed.split([size, size, size, size + 1])
        batch.attn_metadata = TritonAttnMetadata(
            last_indices=indptr[1:].long() - 1,
            rows=rows,
            seq_lens=seq_lens,
            cached_lens=cached_lens,
            qo_indptr=indptr,
            max_extend_len=max(extend_lens),
            num_splits=self.num_splits(size),
        )

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """Store k, v at out_loc, then run the decode or the prefill kernel over the pool.

        Store first (the new tokens attend to themselves). A decode batch runs
        decode_attention with the metadata's rows, seq_lens and num_splits; a prefill batch
        runs prefill_attention with rows, seq_lens, cached_lens, qo_indptr and max_extend_len.
        Both read this layer's k_cache and v_cache and the page table.
        """
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta: TritonAttnMetadata = batch.attn_metadata
        k_cache, v_cache = self.kv_cache.k_cache(layer_id), self.kv_cache.v_cache(layer_id)
        if batch.is_decode:
            return self.kernels.decode_attention(
                q, k_cache, v_cache, self.page_table, meta.rows, meta.seq_lens, meta.num_splits
            )
        return self.kernels.prefill_attention(
            q,
            k_cache,
            v_cache,
            self.page_table,
            meta.rows,
            meta.seq_lens,
            meta.cached_lens,
            meta.qo_indptr,
            meta.max_extend_len,
        )

    # ----- CUDA graphs (chapter 18) ---------------------------------------------------------

    def init_cuda_graph(self, max_batch_size: int) -> None:
        """Allocate the fixed buffers the captured kernels read their batch from."""
        # rows, seq_lens and cached_lens of up to max_batch_size requests, one row each
        self._graph_batch = torch.zeros(3, max_batch_size, dtype=torch.int32, device=self.device)
        # Every row of a graph is one query token, and a last token (it computes their
        # logits): fixed tensors too, since the captured LM head reads them at every replay.
        self._graph_indptr = torch.arange(max_batch_size + 1, dtype=torch.int32, device=self.device)
        self._graph_rows = torch.arange(max_batch_size, device=self.device)

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None:
        """Write the batch into the fixed buffers of the graph of `graph_batch_size` rows.

        Rows past the batch are padding: length 0, so their kernels read no key (and the
        spare page `pad_page`, where their K/V go, is never read). The metadata's tensors are
        views of the fixed buffers, the same at capture and at every replay, and its split
        count is the one of graph_batch_size: the grid the graph recorded.
        """
        if graph_batch_size > self._graph_batch.shape[1]:
            raise RuntimeError("call init_cuda_graph before preparing a graph batch")
        pad = [0] * (graph_batch_size - batch.size)
        host = [
            [req.table_idx for req in batch.reqs] + pad,
            [req.device_len for req in batch.reqs] + pad,
            [req.cached_len for req in batch.reqs] + pad,
        ]
        fixed = self._graph_batch[:, :graph_batch_size]
        fixed.copy_(make_device_tensor(host, torch.int32, self.device), non_blocking=True)
        batch.attn_metadata = TritonAttnMetadata(
            last_indices=self._graph_rows[:graph_batch_size],
            rows=fixed[0],
            seq_lens=fixed[1],
            cached_lens=fixed[2],
            qo_indptr=self._graph_indptr[: graph_batch_size + 1],
            max_extend_len=1,
            num_splits=self.num_splits(graph_batch_size),
        )


def create_triton_backend(setup: AttnSetup) -> TritonAttnBackend:
    """The backend for the engine's setup, or ConfigError where Triton cannot run its kernels:
    triton is not installed, or the device is a CPU, where only Triton's interpreter runs
    them (slow: the course's tests use it), which must be chosen before triton is imported."""
    if importlib.util.find_spec("triton") is None:
        raise ConfigError(
            "attention_backend='triton' needs the triton package (wheels for Linux only); "
            "use attention_backend='torch'"
        )
    if setup.device.type == "cpu" and not ENV.TRITON_INTERPRET:
        raise ConfigError(
            "attention_backend='triton' on a CPU runs only in Triton's interpreter: set "
            "TRITON_INTERPRET=1 before starting (slow; what the tests use), or use "
            "attention_backend='torch'"
        )
    return TritonAttnBackend(setup.kv_cache, setup.page_table, setup.num_kv_heads)


def chosen_by_name_only(setup: AttnSetup) -> bool:
    """ "auto" never picks this backend: it runs where it is asked for by name, and "auto" keeps
    meaning what chapter 17 made it (FlashInfer where it runs, else torch), whatever chapter a
    tree stops at."""
    return False


TRITON_BACKEND = BackendEntry(create=create_triton_backend, usable=chosen_by_name_only, priority=0)
