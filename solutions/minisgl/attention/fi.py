"""Paged attention with FlashInfer's kernels: the GPU backend.

The torch backend gathers every request's keys into a padded block and then attends; FlashInfer's
kernels read the KV pool in place, page by page, so there is no gather, no padding and no mask.
What they need instead is a description of the batch in CSR form, computed once per batch and
shared by every layer:

- `qo_indptr`: where each request's query tokens start in the batch (prefill only);
- `kv_indptr`: where each request's pages start in `kv_indices`;
- `kv_indices`: the pages of every request, in order (a page is `page_size` consecutive slots);
- `last_page_len`: how many slots of each request's last page are in use.

`plan` hands that description to a wrapper, which schedules the work (how to split long
sequences over thread blocks) on the host and copies the schedule to the device, once per
batch. Every layer then calls `run`.

flashinfer is imported only when this backend is built: the rest of minisgl runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from minisgl.attention.base import BaseAttnBackend, BaseAttnMetadata
from minisgl.kvcache.base import BaseKVCachePool
from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from minisgl.core import Batch

WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's scratch space for split-KV partial results


def gather_page_indices(
    page_table: torch.Tensor,
    rows: torch.Tensor,
    num_pages: torch.Tensor,
    kv_indptr: torch.Tensor,
    total_pages: int,
    page_size: int,
) -> torch.Tensor:
    """The pages of every request of a batch, concatenated: FlashInfer's `kv_indices`.

    page_table: [rows, max_seq_len] slot of each token; rows, num_pages: [batch] each request's
    table row and page count; kv_indptr: [batch + 1] their running sum. Page k of a request is
    the slot of its token k * page_size, divided by page_size. Everything is computed on the
    device from these small tensors, with no loop over requests and no wait for the device.
    """
    device = page_table.device
    batch_size = rows.shape[0]
    owner = torch.repeat_interleave(
        torch.arange(batch_size, device=device), num_pages, output_size=total_pages
    )  # request of each output page
    page_in_req = torch.arange(total_pages, device=device) - kv_indptr[owner]
    first_slots = page_table[rows[owner], page_in_req * page_size]
    return (first_slots // page_size).to(torch.int32)


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    wrapper: Any  # the planned FlashInfer wrapper (prefill, decode, or a graph's decode)


class FlashInferBackend(BaseAttnBackend):
    """FlashInfer's paged prefill and decode kernels over minisgl's KV pool (CUDA only)."""

    def __init__(
        self,
        kv_cache: BaseKVCachePool,
        page_table: torch.Tensor,
        page_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        import flashinfer

        self.kv_cache = kv_cache
        self.page_table = page_table
        self.page_size = page_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.device = page_table.device
        self.dtype = kv_cache.k_cache(0).dtype
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", backend="fa2"
        )
        # Tensor cores pay off when many query heads share a KV head (FlashInfer's advice).
        self.use_tensor_cores = num_heads // num_kv_heads >= 4
        self.decode_wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", use_tensor_cores=self.use_tensor_cores
        )
        # CUDA graphs (chapter 18): fixed buffers the captured kernels read, one wrapper per
        # captured batch size. Set up by init_cuda_graph.
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._graph_rows = torch.empty(0, dtype=torch.int64, device=self.device)

    # ----- metadata -------------------------------------------------------------------------

    def _describe(
        self, batch: Batch, pad_to: int = 0, pad_page: int = 0
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The batch in FlashInfer's CSR form: kv_indices on the device, the rest on the host.

        Every per-request number goes into one pinned host tensor, copied to the device once.
        With `pad_to`, rows are added up to that batch size, each one page long (`pad_page`):
        a CUDA graph captured for a larger batch computes them, and nobody reads their output.
        """
        reqs, size = batch.reqs, batch.size
        seq_lens = [req.device_len for req in reqs]
        num_pages = [div_ceil(n, self.page_size) for n in seq_lens]
        kv_indptr = [0]
        for n in num_pages:
            kv_indptr.append(kv_indptr[-1] + n)
        qo_indptr = [0]
        for req in reqs:
            qo_indptr.append(qo_indptr[-1] + req.extend_len)
        last_page_len = [n - (p - 1) * self.page_size for n, p in zip(seq_lens, num_pages)]
        real_pages = kv_indptr[-1]
        num_pad = max(0, pad_to - size)
        kv_indptr += [real_pages + i + 1 for i in range(num_pad)]
        qo_indptr += [qo_indptr[-1] + i + 1 for i in range(num_pad)]
        last_page_len += [1] * num_pad
        packed = torch.tensor(
            [req.table_idx for req in reqs] + num_pages + kv_indptr + qo_indptr + last_page_len,
            dtype=torch.int32,
            pin_memory=True,
        )
        n_all = size + num_pad
        host = dict(
            zip(
                ("rows", "num_pages", "kv_indptr", "qo_indptr", "last_page_len"),
                packed.split([size, size, n_all + 1, n_all + 1, n_all]),
            )
        )
        on_device = packed.to(self.device, non_blocking=True)
        rows, pages, indptr = on_device[:size], on_device[size : 2 * size], on_device[2 * size :]
        kv_indices = gather_page_indices(
            self.page_table, rows.long(), pages, indptr[: size + 1], real_pages, self.page_size
        )
        if num_pad:
            pad = torch.full((num_pad,), pad_page, dtype=torch.int32, device=self.device)
            kv_indices = torch.cat([kv_indices, pad])
        qo_start = 2 * size + n_all + 1
        last_indices = on_device[qo_start + 1 : qo_start + 1 + size].long() - 1
        return kv_indices, host | {"last_indices": last_indices}

    def _plan_common(self) -> dict[str, Any]:
        return dict(
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            page_size=self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            non_blocking=True,
        )

    def _plan_decode(
        self, wrapper: Any, kv_indices: torch.Tensor, host: dict[str, torch.Tensor]
    ) -> None:
        wrapper.plan(
            host["kv_indptr"],
            kv_indices,
            host["last_page_len"],
            head_dim=self.head_dim,
            **self._plan_common(),
        )

    def prepare_metadata(self, batch: Batch) -> None:
        """Describe the batch and plan the prefill or decode wrapper: once per batch."""
        kv_indices, host = self._describe(batch)
        if batch.is_decode:
            wrapper = self.decode_wrapper
            self._plan_decode(wrapper, kv_indices, host)
        else:
            wrapper = self.prefill_wrapper
            # causal: query i of a request sees keys up to position cached_len + i.
            wrapper.plan(
                host["qo_indptr"],
                host["kv_indptr"],
                kv_indices,
                host["last_page_len"],
                head_dim_qk=self.head_dim,
                causal=True,
                **self._plan_common(),
            )
        batch.attn_metadata = FlashInferMetadata(last_indices=host["last_indices"], wrapper=wrapper)

    # ----- the attention --------------------------------------------------------------------

    def _paged(self, cache: torch.Tensor) -> torch.Tensor:
        """[slots, kv_heads, head_dim] -> [pages, page_size, kv_heads, head_dim] (a view)."""
        return cache.view(-1, self.page_size, *cache.shape[1:])

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """Store k, v at out_loc, then run the planned kernel over the paged KV pool."""
        self.kv_cache.store_kv(k, v, batch.out_loc, layer_id)
        meta: FlashInferMetadata = batch.attn_metadata
        paged_kv = (
            self._paged(self.kv_cache.k_cache(layer_id)),
            self._paged(self.kv_cache.v_cache(layer_id)),
        )
        return meta.wrapper.run(q.contiguous(), paged_kv)

    # ----- CUDA graphs (chapter 18) ---------------------------------------------------------

    def init_cuda_graph(self, max_batch_size: int) -> None:
        """Allocate the fixed buffers that captured decode kernels read their batch from."""
        max_pages = max_batch_size * div_ceil(self.page_table.shape[1], self.page_size)
        self._graph_buffers = (
            torch.zeros(max_batch_size + 1, dtype=torch.int32, device=self.device),  # indptr
            torch.zeros(max_pages, dtype=torch.int32, device=self.device),  # indices
            torch.ones(max_batch_size, dtype=torch.int32, device=self.device),
        )  # last page len
        # A graph computes logits for all its rows: every row is a last token.
        self._graph_rows = torch.arange(max_batch_size, device=self.device)

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None:
        """Plan the decode wrapper of the graph captured for `graph_batch_size` rows.

        Planning writes into the fixed buffers, so the next replay reads this batch; rows
        past batch.size are padding, one page (`pad_page`) each.
        """
        import flashinfer

        if self._graph_buffers is None:
            raise RuntimeError("call init_cuda_graph before preparing a graph batch")
        wrapper = self._graph_wrappers.get(graph_batch_size)
        if wrapper is None:
            indptr, indices, last_page_len = self._graph_buffers
            wrapper = self._graph_wrappers[graph_batch_size] = (
                flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace,
                    kv_layout="NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=self.use_tensor_cores,
                    paged_kv_indptr_buffer=indptr[: graph_batch_size + 1],
                    paged_kv_indices_buffer=indices,
                    paged_kv_last_page_len_buffer=last_page_len[:graph_batch_size],
                )
            )
        kv_indices, host = self._describe(batch, pad_to=graph_batch_size, pad_page=pad_page)
        self._plan_decode(wrapper, kv_indices, host)
        # A fixed tensor, since the captured LM head reads it on every replay.
        batch.attn_metadata = FlashInferMetadata(
            last_indices=self._graph_rows[:graph_batch_size], wrapper=wrapper
        )
