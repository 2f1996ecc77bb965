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
        raise NotImplementedError("ch04: Take a free row for a new request (RuntimeError if every row is in use).")

    def free(self, table_idx: int) -> None:
        """Give a finished request's row back."""
        raise NotImplementedError("ch04: Give a finished request's row back.")

    def write_prompt(self, req: Req) -> None:
        """Put the request's known tokens into its token-pool row."""
        raise NotImplementedError("ch04: Put the request's known tokens into its token-pool row.")

    def prepare_inputs(self, batch: Batch) -> None:
        """Fill batch.positions, input_ids and out_loc for the tokens [cached_len, device_len).

        The KV-pool slots of those positions must already be in the page table.
        """
        raise NotImplementedError("ch04: Fill batch.positions, input_ids and out_loc for the tokens [cached_len, device_len).")

    def write_next_tokens(self, batch: Batch, next_tokens: torch.Tensor) -> None:
        """Store each sampled token at position device_len, where the next step reads it.

        Call it before the ledgers advance. A request that samples no token this step (a
        prompt chunk, chapter 10) is skipped: position device_len of its row holds a prompt
        token that must stay.
        """
        raise NotImplementedError("ch04: Store each sampled token at position device_len, where the next step reads it.")
