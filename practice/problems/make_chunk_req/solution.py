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
    extend = min(pending_req.input_len - cached_len, self.token_budget)
    self.token_budget -= extend
    end = cached_len + extend
    req_class = ChunkedReq if end < pending_req.input_len else Req
    return req_class(
        input_ids=pending_req.input_ids[:end],
        table_idx=table_idx,
        cached_len=cached_len,
        output_len=pending_req.output_len,
        uid=pending_req.uid,
        sampling_params=pending_req.sampling_params,
        cache_handle=cache_handle,
    )
