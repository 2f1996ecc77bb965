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

flashinfer is imported only when this backend is built without `wrappers`: the rest of minisgl
runs without it, and the CPU tests hand in a plain-torch stand-in.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Callable

import torch

from minisgl import features
from minisgl.attention.base import (
    AttnSetup,
    BackendEntry,
    BaseAttnBackend,
    BaseAttnMetadata,
)
from minisgl.kvcache.base import BaseKVCachePool
from minisgl.utils import div_ceil

if TYPE_CHECKING:
    from minisgl.core import Batch

WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's scratch space for split-KV partial results
HEAD_DIMS = (64, 128, 256)  # the head sizes FlashInfer compiles its kernels for


@dataclass
class PageLists:
    """A batch in FlashInfer's CSR form, on the host (its pages are gathered on the device)."""

    num_pages: list[int]  # [batch] pages each request's tokens fill
    kv_indptr: list[int]  # [batch + 1] where each request's pages start in kv_indices
    qo_indptr: list[int]  # [batch + 1] where each request's new tokens start in the batch
    last_page_len: list[int]  # [batch] slots in use in each request's last page, 1..page_size


def page_lists(seq_lens: list[int], extend_lens: list[int], page_size: int) -> PageLists:
    """FlashInfer's host-side lists for requests of seq_lens tokens, extend_lens of them new.

    A request of n tokens fills div_ceil(n, page_size) pages and uses n - (pages - 1) *
    page_size slots of its last one: between 1 and page_size, never 0. kv_indptr and qo_indptr
    start at 0 and add up num_pages and extend_lens, so request i owns the range [ptr[i],
    ptr[i + 1]).
    """
    raise NotImplementedError("ch17: FlashInfer's host-side lists for requests of seq_lens tokens, extend_lens of them new.")


def pad_page_lists(lists: PageLists, pad_to: int) -> PageLists:
    """The lists with padding rows appended up to pad_to rows (a graph's batch size).

    Each padding row is one query token over one page with one slot in use (the spare page,
    whose index the caller appends to kv_indices), so the kernel computes a harmless row that
    nobody reads. Real rows are unchanged; a batch already pad_to rows long is returned as is.
    """
    raise NotImplementedError("written in chapter 18: The lists with padding rows appended up to pad_to rows (a graph's batch size).")


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
    the slot of its token k * page_size, divided by page_size. Compute everything on the device
    from these small tensors, with no loop over requests and no wait for the device
    (torch.repeat_interleave with output_size gives each output page its request).
    """
    raise NotImplementedError("ch17: The pages of every request of a batch, concatenated: FlashInfer's `kv_indices`.")


@dataclass
class FlashInferMetadata(BaseAttnMetadata):
    wrapper: Any  # the planned FlashInfer wrapper (prefill, decode, or a graph's decode)


@dataclass
class DescribedBatch:
    """A batch's page lists as FlashInfer's plan takes them: int32 tensors, kv_indices on the
    device and the rest on the host (plan reads them there to schedule the work)."""

    kv_indices: torch.Tensor
    kv_indptr: torch.Tensor
    qo_indptr: torch.Tensor
    last_page_len: torch.Tensor
    last_indices: torch.Tensor  # [batch] on the device: each request's last token in the batch
    lists: PageLists  # the lists these tensors hold, as host lists (padding included)


class FlashInferBackend(BaseAttnBackend):
    """FlashInfer's paged prefill and decode kernels over minisgl's KV pool (CUDA only).

    `wrappers` is where the two wrapper classes come from: the flashinfer module by default,
    or anything with the same `BatchPrefillWithPagedKVCacheWrapper` and
    `BatchDecodeWithPagedKVCacheWrapper` (the CPU tests pass a plain-torch stand-in).
    """

    def __init__(
        self,
        kv_cache: BaseKVCachePool,
        page_table: torch.Tensor,
        page_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        wrappers: Any = None,
    ) -> None:
        self.wrappers = wrappers or importlib.import_module("flashinfer")
        self.kv_cache = kv_cache
        self.page_table = page_table
        self.page_size = page_size
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.device = page_table.device
        self.dtype = kv_cache.k_cache(0).dtype
        # How describe gathers the pages: chapter 19 offers a kernel that does it in one launch.
        kernel = features.first_offer(features.PAGE_GATHERS, self.device)
        self.gather_pages: Callable[..., torch.Tensor] = kernel or gather_page_indices
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.prefill_wrapper = self.wrappers.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", backend="fa2"
        )
        # Decode on tensor cores (FlashInfer's prefill kernel, one query per request):
        # FlashInfer says they pay off for large GQA groups, and upstream takes them from a
        # ratio of 4; at Qwen3-0.6B's 2 the official workload still runs faster on an H200
        # with them than with the CUDA-core decode kernel (python -m benchmark
        # flashinfer-decode; the chapter 17 page has the figures and the sources).
        self.decode_wrapper = self.wrappers.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, kv_layout="NHD", use_tensor_cores=True
        )
        # CUDA graphs (chapter 18): fixed buffers the captured kernels read, one wrapper per
        # captured batch size. Set up by init_cuda_graph.
        self._graph_wrappers: dict[int, Any] = {}
        self._graph_buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # graph batch size -> the kv_indptr its wrapper was last planned for
        self._graph_plans: dict[int, list[int]] = {}
        self._graph_rows = torch.empty(0, dtype=torch.int64, device=self.device)

    # ----- metadata -------------------------------------------------------------------------

    def describe(self, batch: Batch, pad_to: int = 0, pad_page: int = 0) -> DescribedBatch:
        """The batch in FlashInfer's CSR form, padded with one-page rows up to `pad_to`.

        Every per-request number goes into one host tensor, copied to the device once; the
        pages are gathered there from the page table. Padding rows read `pad_page`.
        """
        size = batch.size
        lists = page_lists(
            [req.device_len for req in batch.reqs],
            [req.extend_len for req in batch.reqs],
            self.page_size,
        )
        real_pages = lists.kv_indptr[-1]
        if pad_to:
            lists = pad_page_lists(lists, pad_to)
        n_all = len(lists.num_pages)
        host = torch.tensor(
            [req.table_idx for req in batch.reqs]
            + lists.num_pages[:size]
            + lists.kv_indptr
            + lists.qo_indptr
            + lists.last_page_len,
            dtype=torch.int32,
            pin_memory=self.device.type == "cuda",  # so the copy below does not wait
        )
        kv_indptr, qo_indptr, last_page_len = host[2 * size :].split([n_all + 1, n_all + 1, n_all])
        on_device = host.to(self.device, non_blocking=True)
        dev_rows, dev_pages, dev_indptr, dev_qo = on_device.split(
            [size, size, n_all + 1, n_all + 1 + n_all]
        )
        kv_indices = self.gather_pages(
            self.page_table,
            dev_rows.long(),
            dev_pages,
            dev_indptr[: size + 1],
            real_pages,
            self.page_size,
        )
        if n_all > size:
            pad = torch.full((n_all - size,), pad_page, dtype=torch.int32, device=self.device)
            kv_indices = torch.cat([kv_indices, pad])
        last_indices = dev_qo[1 : size + 1].long() - 1
        return DescribedBatch(kv_indices, kv_indptr, qo_indptr, last_page_len, last_indices, lists)

    def _plan_common(self) -> dict[str, Any]:
        return dict(
            num_qo_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            page_size=self.page_size,
            q_data_type=self.dtype,
            kv_data_type=self.dtype,
            non_blocking=True,
        )

    def plan_decode(self, wrapper: Any, described: DescribedBatch) -> None:
        """Plan a decode wrapper (the eager one or a graph's) for a described batch."""
        wrapper.plan(
            described.kv_indptr,
            described.kv_indices,
            described.last_page_len,
            head_dim=self.head_dim,
            **self._plan_common(),
        )

    def plan_prefill(self, described: DescribedBatch) -> None:
        """Plan the prefill wrapper, causal: query i of a request sees keys up to position
        cached_len + i (FlashInfer aligns each request's queries to the end of its keys)."""
        self.prefill_wrapper.plan(
            described.qo_indptr,
            described.kv_indptr,
            described.kv_indices,
            described.last_page_len,
            head_dim_qk=self.head_dim,
            causal=True,
            **self._plan_common(),
        )

    def prepare_metadata(self, batch: Batch) -> None:
        """Describe the batch and plan the prefill or the decode wrapper: once per batch.

        Call self.describe(batch) once, then plan_decode(self.decode_wrapper, ...) for a decode
        batch or plan_prefill(...) for a prefill one, and store FlashInferMetadata(last_indices,
        the planned wrapper) in batch.attn_metadata: every layer's forward runs that wrapper.
        """
        raise NotImplementedError("ch17: Describe the batch and plan the prefill or the decode wrapper: once per batch.")

    # ----- the attention --------------------------------------------------------------------

    def paged(self, cache: torch.Tensor) -> torch.Tensor:
        """[slots, kv_heads, head_dim] -> [pages, page_size, kv_heads, head_dim] (a view)."""
        return cache.view(-1, self.page_size, *cache.shape[1:])

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """Store k, v at out_loc, then run the planned wrapper over the paged KV pool.

        Store first (the new tokens attend to themselves), then call the wrapper planned in
        prepare_metadata: wrapper.run(q, (paged k cache, paged v cache)) of this layer, with q
        contiguous. Never plan here: the plan is the same for every layer.
        """
        raise NotImplementedError("ch17: Store k, v at out_loc, then run the planned wrapper over the paged KV pool.")

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

    def _graph_wrapper(self, graph_batch_size: int) -> Any:
        """The decode wrapper of the graph of `graph_batch_size` rows, over the fixed buffers
        (created on first use: during capture)."""
        if self._graph_buffers is None:
            raise RuntimeError("call init_cuda_graph before preparing a graph batch")
        wrapper = self._graph_wrappers.get(graph_batch_size)
        if wrapper is None:
            indptr, indices, last_page_len = self._graph_buffers
            wrapper = self._graph_wrappers[graph_batch_size] = (
                self.wrappers.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace,
                    kv_layout="NHD",
                    use_cuda_graph=True,
                    use_tensor_cores=True,
                    paged_kv_indptr_buffer=indptr[: graph_batch_size + 1],
                    paged_kv_indices_buffer=indices,
                    paged_kv_last_page_len_buffer=last_page_len[:graph_batch_size],
                )
            )
        return wrapper

    def plan_graph_decode(self, graph_batch_size: int, described: DescribedBatch) -> Any:
        """Plan the decode wrapper of graph `graph_batch_size` for a described batch (padded to
        that size), and return it. The batch goes into the fixed buffers the graph reads.

        A plan has two parts: the batch's lists, copied into the fixed buffers, and the split
        of the work over thread blocks, computed on the host and copied into the wrapper's own
        workspace. In FlashInfer 0.6.6 that split depends only on the pages of each request
        (kv_indptr), never on how full a last page is (`PrefillSplitQOKVIndptr` in
        include/flashinfer/attention/scheduler.cuh, which the tensor-core decode plans with).
        So while a graph's batch keeps its page counts (a decode step adds one token to each
        request, and a page holds page_size of them), only the buffers need the new batch.
        When the counts change, the split is computed again with `fast_decode_plan`:
        FlashInfer's plan without the set-up a first plan has done already, and without the
        plan's Python `max()` over the sequence lengths, which walks them one tensor element
        at a time (a few microseconds of the host's time per request).
        """
        wrapper = self._graph_wrapper(graph_batch_size)
        planned_for = self._graph_plans.get(graph_batch_size)
        if planned_for is None:  # the first plan (at capture) also sets the wrapper up
            self.plan_decode(wrapper, described)
        else:
            # The buffers are shared by every graph: rewrite all three.
            indptr, indices, last_page_len = self._graph_buffers
            indptr[: graph_batch_size + 1].copy_(described.kv_indptr, non_blocking=True)
            indices[: len(described.kv_indices)].copy_(described.kv_indices)
            last_page_len[:graph_batch_size].copy_(described.last_page_len, non_blocking=True)
            if planned_for != described.lists.kv_indptr:
                self.wrappers.fast_decode_plan(
                    wrapper,
                    described.kv_indptr,
                    described.kv_indices,
                    described.last_page_len,
                    head_dim=self.head_dim,
                    **self._plan_common(),
                )
        self._graph_plans[graph_batch_size] = described.lists.kv_indptr
        return wrapper

    def prepare_for_graph(self, batch: Batch, graph_batch_size: int, pad_page: int) -> None:
        """Plan the decode wrapper of the graph captured for `graph_batch_size` rows.

        Describe the batch padded to graph_batch_size rows (padding reads pad_page), and plan
        it with self.plan_graph_decode: planning writes into the fixed buffers, so the next
        replay reads this batch. The metadata holds the wrapper it returns, and its
        last_indices must be a fixed tensor too, self._graph_rows[:graph_batch_size], since the
        captured LM head reads it every replay.
        """
        raise NotImplementedError("written in chapter 18: Plan the decode wrapper of the graph captured for `graph_batch_size` rows.")


def create_flashinfer_backend(setup: AttnSetup, wrappers: Any = None) -> FlashInferBackend:
    """The backend for the engine's setup (`wrappers`: see FlashInferBackend)."""
    return FlashInferBackend(
        setup.kv_cache,
        setup.page_table,
        setup.page_size,
        setup.num_heads,
        setup.num_kv_heads,
        setup.head_dim,
        wrappers,
    )


def flashinfer_usable(setup: AttnSetup) -> bool:
    """FlashInfer's kernels apply: a GPU, 16-bit floats, a head size they compile for, and
    the package installed."""
    return (
        setup.device.type == "cuda"
        and setup.dtype in (torch.float16, torch.bfloat16)
        and setup.head_dim in HEAD_DIMS
        and importlib.util.find_spec("flashinfer") is not None
    )


FLASHINFER_BACKEND = BackendEntry(
    create=create_flashinfer_backend, usable=flashinfer_usable, priority=10
)  # also known as "fi", upstream's name for it
