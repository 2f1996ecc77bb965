from __future__ import annotations

from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler.utils import TokenOutput


def overlap_loop(self: Scheduler) -> list[TokenOutput]:
    """Launch batch N+1, then process batch N while the device computes N+1."""
    # reference body: scheduler/scheduler.py:Scheduler.overlap_loop
