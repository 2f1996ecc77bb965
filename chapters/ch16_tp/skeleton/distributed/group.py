"""Joining the ranks of a tensor-parallel engine into a group.

The ranks are processes started by a `Launcher` (`minisgl/launcher.py`): the server's scheduler
processes, or ranks 1..N-1 of an offline `LLM`, whose own process is rank 0. A rank that dies
must not leave the others waiting forever: gloo reports a closed connection at once, NCCL
collectives time out after `COLLECTIVE_TIMEOUT`, and the launcher stops the other ranks and
reports the dead one (`ProcessDiedError`).
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.launcher import Launcher

from .comm import all_reduce, set_tensor_group
from .info import get_tp_info, set_tp_info

# Ranks wait for rank 0 in a broadcast while the engine is idle, for as long as it is idle.
IDLE_TIMEOUT = timedelta(days=365)
COLLECTIVE_TIMEOUT = timedelta(minutes=5)  # a first forward may wait out a kernel JIT
POLL_S = 0.1


def init_tp_group(
    rank: int,
    size: int,
    init_method: str,
    device: torch.device,
    peers: Launcher | None = None,
) -> None:
    """Join the `size` ranks' group (rendezvous in the file of `init_method`, "file://PATH").

    The default group is gloo: it carries the scheduler's messages, which are Python objects on
    the CPU. On CUDA the model's collectives get an NCCL group of their own, on GPU `rank`.
    Rank 0 passes `peers`, the launcher of the other ranks, so that a rank dying before it
    joins raises its ProcessDiedError instead of leaving rank 0 waiting at the rendezvous.
    """
    store = dist.FileStore(init_method.removeprefix("file://"), size)
    store.set(f"joining/{rank}", "")
    if peers is not None:
        while not store.check([f"joining/{r}" for r in range(size)]):
            peers.check()
            time.sleep(POLL_S)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=IDLE_TIMEOUT)
    set_tp_info(rank, size)
    # Imported here: the models' layers import this package.
    from minisgl.models.layout import use_layout
    from minisgl.models.parallel import RankLayout

    use_layout(RankLayout(get_tp_info()))  # models built from now on hold this rank's slice
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        gpu = torch.device("cuda", rank)
        set_tensor_group(dist.new_group(backend="nccl", timeout=COLLECTIVE_TIMEOUT, device_id=gpu))
        all_reduce(torch.zeros(1, device=gpu))  # connect now, not inside a CUDA-graph capture


def leave_tp_group() -> None:
    """Leave the group and become a lone rank again."""
    from minisgl.models.layout import ModelLayout, use_layout

    set_tensor_group(None)
    set_tp_info(0, 1)
    use_layout(ModelLayout())
    if dist.is_initialized():
        dist.destroy_process_group()
