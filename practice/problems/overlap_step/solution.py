from __future__ import annotations

from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler.utils import TokenOutput


def overlap_step(self: Scheduler) -> list[TokenOutput]:
    """Launch batch N+1, then process batch N while the device computes N+1."""
    batch = self._schedule_next_batch()
    ongoing = self._forward(batch) if batch is not None else None
    outputs = self._process_results(self._last_data)
    self._last_data = ongoing
    return outputs
