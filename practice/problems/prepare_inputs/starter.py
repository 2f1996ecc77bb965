"""Problem 41: TableManager.prepare_inputs: a batch's positions, input ids and KV slots."""

from __future__ import annotations

import torch

from minisgl.core import Batch
from minisgl.scheduler.table import TableManager


def prepare_inputs(table: TableManager, batch: Batch) -> None:
    """Fill batch.positions, input_ids and out_loc for the tokens [cached_len, device_len) of
    each request, in batch order. The slots are already in table.page_table."""
    raise NotImplementedError("gather positions, token ids and KV slots for each request")
