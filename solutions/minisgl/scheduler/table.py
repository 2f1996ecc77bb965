"""Rows of the page table and the token pool: one row per running request.

The page table (owned by the engine, read by attention) maps (row, position) -> KV-pool slot.
The token pool maps (row, position) -> token id, so a step's input ids can be gathered on the
device without copying each request's tokens from the CPU again.
"""

from __future__ import annotations

import torch

from minisgl.core import Batch, Req


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
        ids = req.input_ids[: req.device_len].to(self.device, non_blocking=True)
        self.token_pool[req.table_idx, : req.device_len] = ids

    def prepare_inputs(self, batch: Batch) -> None:
        """Fill batch.positions, input_ids and out_loc for the tokens [cached_len, device_len).

        The KV-pool slots of those positions must already be in the page table.
        """
        rows = [torch.full((req.extend_len,), req.table_idx, dtype=torch.int64)
                for req in batch.reqs]
        positions = [torch.arange(req.cached_len, req.device_len, dtype=torch.int64)
                     for req in batch.reqs]
        row_index = torch.cat(rows).to(self.device, non_blocking=True)
        batch.positions = torch.cat(positions).to(self.device, non_blocking=True)
        batch.input_ids = self.token_pool[row_index, batch.positions]
        batch.out_loc = self.page_table[row_index, batch.positions]

    def write_next_tokens(self, batch: Batch, next_tokens: torch.Tensor) -> None:
        """Store each sampled token at position device_len, where the next step reads it.

        A request that samples no token this step (a prompt chunk, chapter 10) is skipped:
        position device_len of its row holds a prompt token that must stay.
        """
        writers = [i for i, req in enumerate(batch.reqs) if req.can_decode]
        if not writers:
            return
        rows = torch.tensor([batch.reqs[i].table_idx for i in writers], device=self.device)
        cols = torch.tensor([batch.reqs[i].device_len for i in writers], device=self.device)
        index = torch.tensor(writers, device=self.device)
        self.token_pool[rows, cols] = next_tokens[index].to(self.token_pool.dtype)
