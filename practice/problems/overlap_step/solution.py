from __future__ import annotations

from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler.utils import TokenOutput


def overlap_loop(self: Scheduler) -> list[TokenOutput]:
    """Launch batch N+1, then process batch N while the device computes N+1."""
    forward_input = self._schedule_next_batch()
    ongoing = (forward_input, self._forward(forward_input)) if forward_input else None
    outputs = self._process_last_data(self._last_data)
    self._last_data = ongoing
    self._free_pending_aborts()
    return outputs
