"""Problem 41: TableManager.prepare_inputs: a batch's positions, input ids and KV slots."""

from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.scheduler.table import TableManager


def prepare_inputs(table: TableManager, batch: Batch) -> None:
    """Fill batch.positions, input_ids and out_loc for the tokens [cached_len, device_len) of
    each request, in batch order. The slots are already in table.page_table."""
    rows = [torch.full((req.extend_len,), req.table_idx, dtype=torch.int64) for req in batch.reqs]
    positions = [
        torch.arange(req.cached_len, req.device_len, dtype=torch.int64) for req in batch.reqs
    ]
    row_index = torch.cat(rows).to(table.device)
    batch.positions = torch.cat(positions).to(table.device)
    batch.input_ids = table.token_pool[row_index, batch.positions]
    batch.out_loc = table.page_table[row_index, batch.positions]
