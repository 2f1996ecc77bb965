"""A tensor-parallel rank that fails on purpose, for the tests of the launcher's death policy
(test_tp_processes.py): rank 1 raises on its third scheduler step, mid-generation, and every
other rank runs as usual. Rank 1 then lingers before it exits, as a loaded machine may make
it do, so that rank 0, whose collective failed when rank 1 left the group, exits first: the
error must still name rank 1. Children import this module by name (the launcher hands them the
parent's sys.path), so both `LLM(tp_size=2)` and a server can be given its rank main.

    python -c "import faulty_rank; faulty_rank.serve()" --model DIR --tp 2   # a server
"""

from __future__ import annotations

import gc
import time
from typing import Any

from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import run_scheduler

FAULT = "rank 1 fails on purpose"
FAILING_STEP = 3  # after a prefill and a first decode step: the group is mid-generation
LINGER_S = 2.0  # how long rank 1 takes to exit after leaving the group


def run_scheduler_failing_on_rank_1(
    config: SchedulerConfig,
    inbox_address: str | None,
    outbox_address: str | None,
    init_method: str,
    rank: int = 0,
    world_size: int = 1,
    ready: Any = None,
) -> None:
    """`run_scheduler`, except that rank 1's step number FAILING_STEP raises RuntimeError."""
    if rank == 1:
        step = Scheduler.step
        steps_taken = 0

        def failing_step(self: Scheduler) -> Any:
            nonlocal steps_taken
            steps_taken += 1
            if steps_taken == FAILING_STEP:
                raise RuntimeError(FAULT)
            return step(self)

        Scheduler.step = failing_step  # type: ignore[method-assign]  # this process only
    try:
        run_scheduler(config, inbox_address, outbox_address, init_method, rank, world_size, ready)
    except RuntimeError as error:
        if rank == 1:
            # The traceback's frames hold the group: dropping them closes its connections.
            error.__traceback__ = None
            gc.collect()
            time.sleep(LINGER_S)
        raise


def serve() -> None:
    """`python -m minisgl`, with the failing rank as the scheduler processes' main."""
    import minisgl.server.launch
    from minisgl.server import launch_server, parse_args
    from minisgl.utils import exit_on_error

    minisgl.server.launch.run_scheduler = run_scheduler_failing_on_rank_1  # type: ignore[assignment]
    with exit_on_error():
        launch_server(parse_args())
