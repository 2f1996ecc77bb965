from __future__ import annotations

from minisgl.message import ExitMsg
from minisgl.scheduler.io import SchedulerIO, handle_msg
from minisgl.scheduler.scheduler import Scheduler


def serve(scheduler: Scheduler, io: SchedulerIO) -> None:
    """Take messages (block only when idle), step, send tokens; return on an ExitMsg."""
    while True:
        for msg in io.receive_msgs(block=not scheduler.has_work):
            if isinstance(msg, ExitMsg):
                return
            handle_msg(scheduler, io, msg)
        if scheduler.has_work:
            io.send_outputs(scheduler.step())
