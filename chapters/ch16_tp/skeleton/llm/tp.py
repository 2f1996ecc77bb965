"""Rank 0 of a tensor-parallel `LLM`: a Scheduler whose every step the other ranks mirror.

    with LLM("models/SmolLM2-135M-Instruct", tp_size=2) as llm: ...

The user's process is rank 0: it keeps the tokenizer and the Python API, and starts ranks
1..size-1 with a `Launcher`, as processes that run chapter 14's scheduler loop (`run_scheduler`,
with no sockets). If a rank dies, the launcher stops the others and the step that needed it
raises the launcher's `ProcessDiedError`.
Before each step, rank 0 broadcasts the requests added since the last one, exactly as the
server's rank 0 forwards what its socket received; then every rank runs the same step on its
shard of the model, and the all-reduces inside the forward keep them together.
"""

from __future__ import annotations

import atexit
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from minisgl.core import SamplingParams
from minisgl.distributed.group import init_tp_group, leave_tp_group
from minisgl.launcher import PEER_DEATH_GRACE_S, Launcher
from minisgl.message import ExitMsg, UserMsg
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.io import SchedulerIO, run_scheduler
from minisgl.scheduler.utils import TokenOutput
from minisgl.utils import PeerDiedError

T = TypeVar("T")


class TPScheduler(Scheduler):
    """The Scheduler of rank 0; `close()` stops the other ranks."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.ranks = Launcher(prefix="minisgl-tp-")
        init_method = f"file://{self.ranks.directory}/dist_init"
        size = config.tp_size
        for rank in range(1, size):
            self.ranks.start(
                f"scheduler rank {rank}", run_scheduler, config, None, None, init_method, rank, size
            )
        self.io: SchedulerIO | None = None
        self.outgoing: list[UserMsg] = []  # added since the last step, not yet broadcast
        atexit.register(self.close)  # an LLM never shut down still stops its ranks cleanly
        try:
            init_tp_group(0, size, init_method, config.resolved_device, peers=self.ranks)
            self.io = SchedulerIO(None, None, 0, dist.group.WORLD)
            super().__init__(config)
        except BaseException:
            self.close()
            raise

    def add_request(
        self,
        input_ids: list[int] | torch.Tensor,
        sampling_params: SamplingParams,
        uid: int | None = None,
    ) -> int:
        """Queue the request here, and for the other ranks at the next step."""
        uid = super().add_request(input_ids, sampling_params, uid)
        ids = torch.as_tensor(input_ids).flatten().tolist()
        self.outgoing.append(UserMsg(uid, ids, sampling_params))
        return uid

    def step(self) -> list[TokenOutput]:
        """Send the new requests to every rank, then run the step all of them run."""
        assert self.io is not None, "the group is closed"
        msgs, self.outgoing = self.outgoing, []
        self._collective(self.io.broadcast, msgs)
        return self._collective(super().step)

    def _collective(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args), which talks to the other ranks: if one of them died, say which."""
        try:
            return fn(*args)
        except PeerDiedError:
            self.io = None  # the group is broken: close() must not broadcast on it
            self.ranks.check(grace_s=PEER_DEATH_GRACE_S)
            raise

    def close(self) -> None:
        """Tell the other ranks to exit and leave the group with them; wait for them (killing
        stragglers). If a rank is already gone, stop the rest first, then leave."""
        atexit.unregister(self.close)
        self.ranks.begin_stop()  # the ranks' exits are expected from here on
        group_intact = self.io is not None
        if self.io is not None:
            try:
                self.io.broadcast([ExitMsg()])
            except PeerDiedError:  # a rank is already gone: stop() below kills the rest
                group_intact = False
            self.io = None
        if group_intact:
            if hasattr(self, "engine"):  # built: __init__ may have failed before
                # Before the group goes: CUDA graphs hold NCCL work captured on its
                # communicator, and destroying the group under live graphs hung on two H200s.
                self.engine.close()
            leave_tp_group()  # while the other ranks leave it too, as they exit
            self.ranks.stop()
        else:
            self.ranks.stop()
            leave_tp_group()
