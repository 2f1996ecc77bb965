"""Problem 44: TableManager.write_next_tokens: sampled tokens into the token pool."""

from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.scheduler.table import TableManager


def write_next_tokens(table: TableManager, batch: Batch, next_tokens: torch.Tensor) -> None:
    """Store next_tokens[i] at [reqs[i].table_idx, reqs[i].device_len], for the requests that
    can decode; a prompt chunk (can_decode False) is skipped."""
    writers = [i for i, req in enumerate(batch.reqs) if req.can_decode]
    if not writers:
        return
    rows = torch.tensor([batch.reqs[i].table_idx for i in writers], device=table.device)
    cols = torch.tensor([batch.reqs[i].device_len for i in writers], device=table.device)
    index = torch.tensor(writers, device=table.device)
    table.token_pool[rows, cols] = next_tokens[index].to(table.token_pool.dtype)
