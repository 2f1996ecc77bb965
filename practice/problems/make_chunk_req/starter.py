from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.utils import PendingReq


def make_req(self: PrefillAdder, pending: PendingReq) -> Req:
    """Spend this batch's token budget on `pending`: the rest of its prompt if it fits,
    else a ChunkedReq for as much as the budget allows."""
    raise NotImplementedError("extend = min(uncomputed prompt, budget); Req or ChunkedReq")
