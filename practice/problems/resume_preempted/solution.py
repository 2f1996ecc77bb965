from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.preempt import ResumedReq


def resume(req: Req) -> ResumedReq:
    """The queue entry that recomputes a preempted request from its host-side tokens: the same
    uid and sampling parameters, the host's tokens as its prompt, and the same end."""
    # reference body: scheduler/preempt.py:resume
