from __future__ import annotations

from minisgl.message import ExitMsg
from minisgl.scheduler.io import SchedulerIO, handle_msg
from minisgl.scheduler.scheduler import Scheduler


def serve(scheduler: Scheduler, io: SchedulerIO) -> None:
    """Take messages (block only when idle), step, send tokens; return on an ExitMsg."""
    # reference body: scheduler/io.py:serve
