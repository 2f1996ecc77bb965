"""Joining the ranks of a tensor-parallel engine into a group.

The ranks are processes started by a `Launcher` (`minisgl/launcher.py`): the server's scheduler
processes, or ranks 1..N-1 of an offline `LLM`, whose own process is rank 0. A rank that dies
must not leave the others waiting forever: gloo reports a closed connection at once, NCCL
collectives time out after `COLLECTIVE_TIMEOUT`, and the launcher stops the other ranks and
reports the dead one (`ProcessDiedError`).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from minisgl.launcher import Launcher
from minisgl.models.layout import ModelLayout, use_layout
from minisgl.models.parallel import RankLayout
from minisgl.scheduler.io import join_ranks

from .comm import all_reduce, set_tensor_group
from .info import get_tp_info, set_tp_info

COLLECTIVE_TIMEOUT = timedelta(minutes=5)  # a first forward may wait out a kernel JIT
# torch's compute threads of this process before it joined a group on the CPU (None: it has
# not), given back when it leaves.
_threads_alone: int | None = None


def init_tp_group(
    rank: int,
    size: int,
    init_method: str,
    device: torch.device,
    peers: Launcher | None = None,
) -> None:
    """Join the `size` ranks' group as `rank`, and its tensor parallelism (rank 0 of an `LLM`,
    before it builds its engine; the other ranks' engines join through the engine extension).

    Rank 0 passes `peers`, the launcher of the other ranks, so that a rank dying before it
    joins raises its ProcessDiedError instead of leaving rank 0 waiting at the rendezvous.
    """
    join_ranks(rank, size, init_method, peers.check if peers is not None else None)
    join_tensor_parallel(device)


def join_tensor_parallel(device: torch.device) -> None:
    """Make this process, rank r of the n in its gloo group, tensor-parallel rank r of n.

    The default group is gloo: it carries the scheduler's messages, which are Python objects on
    the CPU. On CUDA the model's collectives get an NCCL group of their own, on GPU r. Models
    built from now on hold rank r's slice (`RankLayout`).
    """
    global _threads_alone
    rank, size = dist.get_rank(), dist.get_world_size()
    set_tp_info(rank, size)
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # The ranks share the machine's cores. More compute threads than cores slow every rank
        # down (OpenMP's threads spin while they wait for each other; TP=2 on two cores: 6.3 s
        # against 4.9 s for the same generate), so each rank takes its share.
        _threads_alone = torch.get_num_threads()
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        gpu = torch.device("cuda", rank)
        set_tensor_group(dist.new_group(backend="nccl", timeout=COLLECTIVE_TIMEOUT, device_id=gpu))
        all_reduce(torch.zeros(1, device=gpu))  # connect now, not inside a CUDA-graph capture
    use_layout(RankLayout(get_tp_info()))


def leave_tp_group() -> None:
    """Leave the group and become a lone rank again."""
    global _threads_alone
    if _threads_alone is not None:
        torch.set_num_threads(_threads_alone)
        _threads_alone = None
    set_tensor_group(None)
    set_tp_info(0, 1)
    use_layout(ModelLayout())
    if dist.is_initialized():
        dist.destroy_process_group()
