from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.utils import PendingReq


def make_req(self: PrefillAdder, pending: PendingReq) -> Req:
    """Spend this batch's token budget on `pending`: the rest of its prompt if it fits,
    else a ChunkedReq for as much as the budget allows."""
    extend = min(pending.input_len - pending.cached_len, self.token_budget)
    self.token_budget -= extend
    end = pending.cached_len + extend
    req_class = ChunkedReq if end < pending.input_len else Req
    return req_class(input_ids=pending.input_ids[:end], table_idx=pending.table_idx,
                     cached_len=pending.cached_len, output_len=pending.output_len,
                     uid=pending.uid, sampling_params=pending.sampling_params,
                     cache_handle=pending.cache_handle)
