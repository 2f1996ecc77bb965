from __future__ import annotations

from dataclasses import replace

from minisgl.core import Req
from minisgl.scheduler import Scheduler
from minisgl.scheduler.utils import PendingReq


def preempt(scheduler: Scheduler, req: Req) -> PendingReq:
    """Stop the running request `req`, free what it holds, and queue it again, first in line,
    to be recomputed from its prompt plus the tokens it has generated so far.

    Returns the PendingReq put at the head of the waiting queue."""
    scheduler.decode_manager.remove_req(req)  # it leaves the running set
    # Settle its pages as a finished request would: with a radix cache, the prompt and the
    # tokens generated so far stay cached (unlocked), the rest goes back to the free list.
    scheduler.cache_manager.cache_req(req, finished=True)
    scheduler.table_manager.free(req.table_idx)
    # Its new prompt: the old one plus every token it has sampled (input_ids on the CPU);
    # its budget: the tokens it has left, so it stops exactly where it would have.
    pending = PendingReq(
        req.uid,
        req.input_ids.clone(),
        replace(req.sampling_params, max_tokens=req.remain_len),
    )
    scheduler.prefill_manager.pending_list.insert(0, pending)
    return pending
