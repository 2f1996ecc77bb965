from __future__ import annotations

from minisgl.core import Req
from minisgl.scheduler.prefill import PrefillAdder
from minisgl.scheduler.utils import PendingReq


def try_add_one(self: PrefillAdder, pending_req: PendingReq) -> Req | None:
    """Admit `pending_req` (or its next chunk) into the batch, or return None if it must wait."""
    # reference body: scheduler/prefill.py:PrefillAdder.try_add_one
