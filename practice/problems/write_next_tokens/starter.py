"""Problem 44: TableManager.write_next_tokens: sampled tokens into the token pool."""

from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.scheduler.table import TableManager


def write_next_tokens(table: TableManager, batch: Batch, next_tokens: torch.Tensor) -> None:
    """Store next_tokens[i] at [reqs[i].table_idx, reqs[i].device_len], for the requests that
    can decode; a prompt chunk (can_decode False) is skipped."""
    raise NotImplementedError("write each sampled token where the next step reads it")
