"""Rows of the page table and the token pool: one row per running request.

The page table (allocated by the engine, read by attention) maps (row, position) -> KV-pool
slot. Only the CacheManager writes its entries, since it owns the pages they name; the
TableManager hands out rows and reads the table. The token pool, which it owns, maps
(row, position) -> token id, so a step's input ids are gathered on the device without copying
each request's tokens from the CPU again.
"""

from __future__ import annotations

import torch

from minisgl.core import Batch, Req
from minisgl.utils import make_device_tensor


class TableManager:
    """Hands out table rows and turns a batch of ledgers into the tensors a forward reads."""

    def __init__(self, max_running_req: int, page_table: torch.Tensor) -> None:
        self.page_table = page_table
        self.device = page_table.device
        self.token_pool = torch.zeros_like(page_table)  # [rows, max_seq_len] token ids
        self._free_rows = list(range(max_running_req))

    @property
    def available_size(self) -> int:
        return len(self._free_rows)

    def allocate(self) -> int:
        """Take a free row for a new request (RuntimeError if every row is in use)."""
        if not self._free_rows:
            raise RuntimeError("no free table row: admit fewer requests (max_running_req)")
        return self._free_rows.pop()

    def free(self, table_idx: int) -> None:
        """Give a finished request's row back."""
        self._free_rows.append(table_idx)

    def write_prompt(self, req: Req) -> None:
        """Put the request's known tokens into its token-pool row."""
        ids = make_device_tensor(
            req.input_ids[: req.device_len], self.token_pool.dtype, self.device
        )
        self.token_pool[req.table_idx, : req.device_len] = ids

    def prepare_inputs(self, batch: Batch) -> None:
        """Fill batch.positions, input_ids and out_loc for the tokens [cached_len, device_len).

        The KV-pool slots of those positions must already be in the page table.
        """
        rows = torch.cat(
            [torch.full((req.extend_len,), req.table_idx, dtype=torch.int64) for req in batch.reqs]
        )
        positions = torch.cat(
            [torch.arange(req.cached_len, req.device_len, dtype=torch.int64) for req in batch.reqs]
        )
        row_index = make_device_tensor(rows, torch.int64, self.device)
        batch.positions = make_device_tensor(positions, torch.int64, self.device)
        batch.input_ids = self.token_pool[row_index, batch.positions]
        batch.out_loc = self.page_table[row_index, batch.positions]

    def write_next_tokens(self, batch: Batch, next_tokens: torch.Tensor) -> None:
        """Store each sampled token at position device_len, where the next step reads it.

        Call it before the ledgers advance. A request that samples no token this step (a
        prompt chunk, chapter 10) is skipped: position device_len of its row holds a prompt
        token that must stay.
        """
        writers = [i for i, req in enumerate(batch.reqs) if req.can_decode]
        if not writers:
            return
        rows = make_device_tensor(
            [batch.reqs[i].table_idx for i in writers], torch.int64, self.device
        )
        cols = make_device_tensor(
            [batch.reqs[i].device_len for i in writers], torch.int64, self.device
        )
        index = make_device_tensor(writers, torch.int64, self.device)
        self.token_pool[rows, cols] = next_tokens[index].to(self.token_pool.dtype)
