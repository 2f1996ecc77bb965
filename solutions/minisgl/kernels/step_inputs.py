"""The index work of a step as Triton kernels: gather the step's inputs, write back its tokens.

Before a forward, `TableManager.prepare_inputs` turns the batch's ledgers into three flat
tensors: each new token's position, its token id (from the token pool) and its KV slot (from
the page table). torch builds one small tensor per request on the host and then gathers with
advanced indexing, a handful of launches and as many host ops as there are requests. Here the
host packs four numbers per request into one tensor, copies it once, and one launch does the
rest. After sampling, `write_next_tokens` is the mirror image: one launch scatters each
request's token into its token-pool row. And FlashInfer's page lists (chapter 17) take the
pages of every request from the page table: `gather_page_indices` does it in one launch where
torch needs about ten.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from minisgl.scheduler.table import TableManager
from minisgl.utils import make_device_tensor

if TYPE_CHECKING:
    from minisgl.core import Batch

TOKENS_PER_PROGRAM = 128  # new tokens of one request that one program handles
REQUESTS_PER_PROGRAM = 64  # requests whose sampled token one program writes back


@triton.jit
def prepare_inputs_kernel(
    rows_ptr,
    cached_lens_ptr,
    extend_lens_ptr,
    token_starts_ptr,
    token_pool_ptr,
    page_table_ptr,
    row_stride,
    positions_ptr,
    input_ids_ptr,
    out_loc_ptr,
    BLOCK: tl.constexpr,
):
    """Positions, token ids and KV slots of one block of one request's new tokens.

    Program (req, block) of a [requests, cdiv(max extend_len, BLOCK)] grid handles the request's
    new tokens block * BLOCK + arange(BLOCK), masked to < extend_len. Token i of the request
    sits at position cached_len + i, is output number token_start + i of the batch, and reads
    cell (row, position) of the token pool and of the page table (row * row_stride +
    position, in int64).
    """
    req = tl.program_id(0)
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < tl.load(extend_lens_ptr + req)
    positions = tl.load(cached_lens_ptr + req) + offsets
    cells = tl.load(rows_ptr + req).to(tl.int64) * row_stride + positions
    out = tl.load(token_starts_ptr + req) + offsets
    tl.store(positions_ptr + out, positions, mask=inside)
    tl.store(input_ids_ptr + out, tl.load(token_pool_ptr + cells, mask=inside), mask=inside)
    tl.store(out_loc_ptr + out, tl.load(page_table_ptr + cells, mask=inside), mask=inside)


def prepare_inputs(batch: Batch, token_pool: torch.Tensor, page_table: torch.Tensor) -> None:
    """Fill batch.positions, input_ids and out_loc: one host-to-device copy, one launch.

    Pack each request's table_idx, cached_len, extend_len and token start (the running sum of
    the extend_lens before it) into one int32 tensor with make_device_tensor, allocate the three
    outputs (positions int64, input_ids like the token pool, out_loc like the page table), and
    launch prepare_inputs_kernel on a grid (requests, cdiv(max extend_len, TOKENS_PER_PROGRAM)).
    """
    reqs = batch.reqs
    extend_lens = [req.extend_len for req in reqs]
    token_starts = list(accumulate(extend_lens, initial=0))
    num_tokens = token_starts.pop()
    per_req = make_device_tensor(
        [req.table_idx for req in reqs]
        + [req.cached_len for req in reqs]
        + extend_lens
        + token_starts,
        torch.int32,
        page_table.device,
    )
    rows, cached_lens, extend_lens_t, token_starts_t = per_req.view(4, len(reqs))
    batch.positions = torch.empty(num_tokens, dtype=torch.int64, device=page_table.device)
    batch.input_ids = torch.empty(num_tokens, dtype=token_pool.dtype, device=page_table.device)
    batch.out_loc = torch.empty(num_tokens, dtype=page_table.dtype, device=page_table.device)
    grid = (len(reqs), triton.cdiv(max(extend_lens), TOKENS_PER_PROGRAM))
    prepare_inputs_kernel[grid](
        rows,
        cached_lens,
        extend_lens_t,
        token_starts_t,
        token_pool,
        page_table,
        page_table.stride(0),
        batch.positions,
        batch.input_ids,
        batch.out_loc,
        BLOCK=TOKENS_PER_PROGRAM,
    )


# Triton compiles a kernel once per kind of integer argument it meets (1, a multiple of 16,
# any other): num_writers changes every step, and a kind met first in the middle of a run would
# stop the step for the compilation. One compiled kernel serves every batch size.
@triton.jit(do_not_specialize=["num_writers"])
def write_next_tokens_kernel(
    next_tokens_ptr,
    batch_index_ptr,
    rows_ptr,
    cols_ptr,
    num_writers,
    token_pool_ptr,
    row_stride,
    BLOCK: tl.constexpr,
):
    """Write the sampled tokens of one block of writers into their token-pool cells.

    Program p handles writers p * BLOCK + arange(BLOCK), masked to < num_writers. Writer w
    takes the token at batch_index[w] of next_tokens and stores it at cell (rows[w], cols[w])
    of the token pool (rows[w] * row_stride + cols[w], in int64).
    """
    writers = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = writers < num_writers
    tokens = tl.load(next_tokens_ptr + tl.load(batch_index_ptr + writers, mask=inside), mask=inside)
    rows = tl.load(rows_ptr + writers, mask=inside).to(tl.int64)
    cells = rows * row_stride + tl.load(cols_ptr + writers, mask=inside)
    tl.store(token_pool_ptr + cells, tokens, mask=inside)


def write_next_tokens(batch: Batch, next_tokens: torch.Tensor, token_pool: torch.Tensor) -> None:
    """Store each sampled token at (table_idx, device_len) of the token pool: one launch.

    Only requests that can still decode write (a prompt chunk samples no token). Pack their
    batch index, table_idx and device_len into one int32 tensor with make_device_tensor and
    launch write_next_tokens_kernel on cdiv(writers, REQUESTS_PER_PROGRAM) programs.
    """
    writers = [i for i, req in enumerate(batch.reqs) if req.can_decode]
    if not writers:
        return
    per_writer = make_device_tensor(
        writers
        + [batch.reqs[i].table_idx for i in writers]
        + [batch.reqs[i].device_len for i in writers],
        torch.int32,
        token_pool.device,
    )
    batch_index, rows, cols = per_writer.view(3, len(writers))
    write_next_tokens_kernel[(triton.cdiv(len(writers), REQUESTS_PER_PROGRAM),)](
        next_tokens,
        batch_index,
        rows,
        cols,
        len(writers),
        token_pool,
        token_pool.stride(0),
        BLOCK=REQUESTS_PER_PROGRAM,
    )


PAGES_PER_BLOCK = 128  # pages of one request that one program gathers


@triton.jit
def gather_page_indices_kernel(
    rows_ptr,
    num_pages_ptr,
    kv_indptr_ptr,
    page_table_ptr,
    row_stride,
    page_size,
    kv_indices_ptr,
    BLOCK: tl.constexpr,
):
    """The pages of one block of one request, read from its page-table row.

    Program (req, block) of a [requests, blocks] grid handles pages block * BLOCK +
    arange(BLOCK) of request req, masked to < num_pages[req]. Page k is the slot of the
    request's token k * page_size (cell rows[req] * row_stride + k * page_size of the page
    table, in int64), divided by page_size; it goes to kv_indices[kv_indptr[req] + k].
    """
    req = tl.program_id(0)
    pages = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = pages < tl.load(num_pages_ptr + req)
    row = tl.load(rows_ptr + req).to(tl.int64) * row_stride
    slots = tl.load(page_table_ptr + row + pages.to(tl.int64) * page_size, mask=inside)
    tl.store(kv_indices_ptr + tl.load(kv_indptr_ptr + req) + pages, slots // page_size, mask=inside)


def gather_page_indices(
    page_table: torch.Tensor,
    rows: torch.Tensor,
    num_pages: torch.Tensor,
    kv_indptr: torch.Tensor,
    total_pages: int,
    page_size: int,
) -> torch.Tensor:
    """Chapter 17's gather of FlashInfer's page list, in one launch.

    Same arguments and result as chapter 17's `gather_page_indices`: the pages of every
    request, concatenated, int32, total_pages of them. Allocate the output and launch
    gather_page_indices_kernel on a grid (requests, cdiv(most, PAGES_PER_BLOCK)). The page
    counts are on the device, and reading their maximum would make the host wait: `most` is a
    bound the host knows, the smaller of total_pages and the pages a page-table row holds
    (cdiv(row length, page_size)). Blocks past a request's own pages store nothing.
    """
    kv_indices = torch.empty(total_pages, dtype=torch.int32, device=page_table.device)
    most_pages = min(total_pages, triton.cdiv(page_table.shape[1], page_size))
    grid = (len(rows), triton.cdiv(most_pages, PAGES_PER_BLOCK))
    gather_page_indices_kernel[grid](
        rows,
        num_pages,
        kv_indptr,
        page_table,
        page_table.stride(0),
        page_size,
        kv_indices,
        BLOCK=PAGES_PER_BLOCK,
    )
    return kv_indices


class KernelTableManager(TableManager):
    """Chapter 4's table manager, gathering a step's inputs and writing its sampled tokens
    back with one host-to-device copy and one kernel launch each."""

    def prepare_inputs(self, batch: Batch) -> None:
        prepare_inputs(batch, self.token_pool, self.page_table)

    def write_next_tokens(self, batch: Batch, next_tokens: torch.Tensor) -> None:
        write_next_tokens(batch, next_tokens, self.token_pool)
