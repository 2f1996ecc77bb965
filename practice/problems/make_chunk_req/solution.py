from __future__ import annotations

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.utils import PendingReq


def add_one_req(
    self: PrefillAdder,
    pending_req: PendingReq,
    cache_handle: BaseCacheHandle | None,
    table_idx: int,
    cached_len: int,
) -> Req:
    """Spend this batch's token budget on `pending_req` from `cached_len`: the rest of its
    prompt if it fits, else a ChunkedReq for as much as the budget allows."""
    # reference body: scheduler/prefill.py:PrefillAdder._add_one_req
