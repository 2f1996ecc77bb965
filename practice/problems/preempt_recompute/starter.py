from __future__ import annotations

from dataclasses import replace

from minisgl.core import Req
from minisgl.scheduler import Scheduler
from minisgl.scheduler.utils import PendingReq


def preempt(scheduler: Scheduler, req: Req) -> PendingReq:
    """Stop the running request `req`, free what it holds, and queue it again, first in line,
    to be recomputed from its prompt plus the tokens it has generated so far.

    Returns the PendingReq put at the head of the waiting queue."""
    raise NotImplementedError("leave the running set, free row and pages, queue it again first")
