"""The scheduler process's I/O: messages in from the tokenizer worker, tokens out to it.

The loop never sleeps while there is work: it takes whatever messages are already queued and
steps. When idle it blocks on the socket, so an idle server burns no CPU. Rank 0 alone owns
the sockets; it broadcasts what it received to the other ranks (a gloo process group, on the
CPU) so that every rank of a tensor-parallel engine schedules the very same batches. Until
chapter 16 there is one rank, and the broadcast is the identity, but the path is the same.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from minisgl.message import (
    AbortBackendMsg,
    BatchMsg,
    DetokenizeMsg,
    ExitMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    StatusMsg,
    StatusRequestMsg,
    UserMsg,
)
from minisgl.scheduler.config import SchedulerConfig
from minisgl.scheduler.scheduler import Scheduler
from minisgl.scheduler.utils import TokenOutput
from minisgl.utils import MinisglError, needs_peers


class SchedulerIO:
    """Receive, broadcast and send for one rank of the scheduler."""

    def __init__(
        self,
        inbox_address: str | None,
        outbox_address: str | None,
        rank: int = 0,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        """Rank 0 opens the sockets at the given addresses (None: no socket, as for the
        offline `LLM`'s rank 0, which broadcasts its own messages)."""
        self.rank = rank
        self.group = group  # None: no process group, this rank is alone
        self.inbox = ZmqPullQueue(inbox_address) if rank == 0 and inbox_address else None
        self.outbox = ZmqPushQueue(outbox_address) if rank == 0 and outbox_address else None

    def receive_msgs(self, block: bool) -> list[object]:
        """This iteration's messages, the same on every rank.

        Rank 0 waits for a first message only when `block` (the scheduler is idle), then takes
        every message already queued without waiting; the other ranks get them by broadcast.
        """
        raise NotImplementedError("ch14: This iteration's messages, the same on every rank.")

    def broadcast(self, msgs: list[object]) -> list[object]:
        """Rank 0's messages, on every rank of the group."""
        if self.group is None:
            return msgs
        box = [msgs]
        with needs_peers():
            dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def send_outputs(self, outputs: list[TokenOutput]) -> None:
        """One step's tokens to the tokenizer worker, in one message (rank 0 only)."""
        raise NotImplementedError("ch14: One step's tokens to the tokenizer worker, in one message (rank 0 only).")

    def send(self, msg: object) -> None:
        """Any other message to the tokenizer worker (rank 0 only)."""
        if self.outbox is not None:
            self.outbox.put(msg)

    def close(self) -> None:
        for queue in (self.inbox, self.outbox):
            if queue is not None:
                queue.close()


def handle_msg(scheduler: Scheduler, io: SchedulerIO, msg: object) -> None:
    """Act on one message: queue a request (or refuse it), abort one, or report status."""
    raise NotImplementedError("ch14: Act on one message: queue a request (or refuse it), abort one, or report status.")


def serve(scheduler: Scheduler, io: SchedulerIO) -> None:
    """The scheduler process's loop: take messages (block only when idle), step, send tokens.

    Returns on an ExitMsg.
    """
    raise NotImplementedError("ch14: The scheduler process's loop: take messages (block only when idle), step, send tokens.")


# Ranks wait for rank 0 in a broadcast while the engine is idle, for as long as it is idle.
IDLE_TIMEOUT = timedelta(days=365)
POLL_S = 0.1


def join_ranks(
    rank: int,
    world_size: int,
    init_method: str,
    while_waiting: Callable[[], None] | None = None,
) -> None:
    """Join the ranks' gloo group, which carries the scheduler's messages.

    The ranks meet in the file of `init_method` ("file://PATH"); each first writes that it is
    joining. Rank 0 may pass `while_waiting`, called until every rank has written: it can raise
    when a rank died before it joined, instead of leaving rank 0 waiting at the rendezvous.
    """
    store = dist.FileStore(init_method.removeprefix("file://"), world_size)
    store.set(f"joining/{rank}", "")
    if while_waiting is not None:
        while not store.check([f"joining/{r}" for r in range(world_size)]):
            while_waiting()
            time.sleep(POLL_S)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=IDLE_TIMEOUT
    )


def run_scheduler(
    config: SchedulerConfig,
    inbox_address: str,
    outbox_address: str,
    init_method: str,
    rank: int = 0,
    world_size: int = 1,
    ready: Any = None,
) -> None:
    """A scheduler process's main: join the ranks' group, build the engine, serve.

    The engine joins whatever else its ranks share (the model's collectives, when the model is
    split over them). `ready` (the launcher's `ReadySignal`, or None) is sent the rank once the
    model is loaded.
    """
    join_ranks(rank, world_size, init_method)
    io = SchedulerIO(inbox_address, outbox_address, rank, dist.group.WORLD)
    scheduler: Scheduler | None = None
    try:
        scheduler = Scheduler(config)
        if ready is not None:
            ready.send(rank)
        serve(scheduler, io)
    finally:
        io.close()
        if scheduler is not None:
            scheduler.engine.close()  # before the group goes (TPScheduler.close says why)
        dist.destroy_process_group()
