"""Starting the ranks of a tensor-parallel engine, joining them into a group, and watching them.

An offline `LLM`'s process is rank 0: it starts the other ranks as fresh Python processes
(`python -m minisgl.distributed.worker`), so that nothing of its own state (threads, CUDA) is
inherited. (The server's launcher forks one scheduler process per rank instead, chapter 15.) A
rank that dies must not leave the others waiting forever: gloo reports a closed connection at
once, NCCL collectives time out after `COLLECTIVE_TIMEOUT`, and rank 0 turns either into a
`RankDiedError` naming the dead rank.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

import minisgl
from minisgl.utils import MinisglError

from .comm import all_reduce, set_tensor_group
from .info import set_tp_info

# Ranks wait for rank 0 in a broadcast while the engine is idle, for as long as it is idle.
IDLE_TIMEOUT = timedelta(days=365)
COLLECTIVE_TIMEOUT = timedelta(minutes=5)  # a first forward may wait out a kernel JIT
POLL_S = 0.1
EXIT_TIMEOUT_S = 10.0


class RankDiedError(MinisglError):
    """A rank of the tensor-parallel group died; the group cannot go on without it."""


def describe_exit(returncode: int) -> str:
    """'killed by SIGKILL' or 'exited with status 1'."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with status {returncode}"


def first_death(exit_codes: dict[str, int]) -> str | None:
    """'rank 1 killed by SIGKILL': the exited process to blame, or None if none exited.

    One killed by a signal comes first: the others most likely failed because it was gone.
    """
    if not exit_codes:
        return None
    name = min(exit_codes, key=lambda n: exit_codes[n] >= 0)
    return f"{name} {describe_exit(exit_codes[name])}"


class RankProcesses:
    """Ranks 1..size-1, each a `python -m minisgl.distributed.worker` running `target(*args)`."""

    def __init__(self, target: Callable[..., None], args_of_rank: dict[int, tuple]) -> None:
        # The workers import the same minisgl as this process, wherever it comes from.
        package_root = str(Path(minisgl.__file__).resolve().parent.parent)
        path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        env = dict(os.environ, PYTHONPATH=path)
        self.processes: dict[int, subprocess.Popen] = {}
        for rank, args in args_of_rank.items():
            process = subprocess.Popen(
                [sys.executable, "-m", "minisgl.distributed.worker"], stdin=subprocess.PIPE, env=env
            )
            assert process.stdin is not None
            process.stdin.write(pickle.dumps((target, args)))
            process.stdin.close()
            self.processes[rank] = process

    def dead(self) -> str | None:
        """'rank 1 killed by SIGKILL' if a rank has exited (see `first_death`), else None."""
        exits = {f"rank {r}": p.poll() for r, p in self.processes.items()}
        return first_death({name: code for name, code in exits.items() if code is not None})

    def raise_if_dead(self, grace_s: float = 0.0) -> None:
        """Raise RankDiedError if a rank has exited (waiting up to `grace_s` for one to)."""
        deadline = time.monotonic() + grace_s
        while (dead := self.dead()) is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if dead is not None:
            self.stop(0)
            raise RankDiedError(f"tensor-parallel {dead}; the other ranks were stopped")

    def stop(self, timeout_s: float = EXIT_TIMEOUT_S) -> None:
        """Wait for every rank to exit, killing those still running after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def init_tp_group(
    rank: int,
    size: int,
    init_method: str,
    device: torch.device,
    peers: RankProcesses | None = None,
) -> None:
    """Join the `size` ranks' group (rendezvous in the file of `init_method`, "file://PATH").

    The default group is gloo: it carries the scheduler's messages, which are Python objects on
    the CPU. On CUDA the model's collectives get an NCCL group of their own, on GPU `rank`.
    Rank 0 passes `peers`, the processes it started, so that a rank dying before it joins
    raises RankDiedError instead of leaving rank 0 waiting at the rendezvous.
    """
    store = dist.FileStore(init_method.removeprefix("file://"), size)
    store.set(f"joining/{rank}", "")
    if peers is not None:
        while not store.check([f"joining/{r}" for r in range(size)]):
            peers.raise_if_dead()
            time.sleep(POLL_S)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=IDLE_TIMEOUT)
    set_tp_info(rank, size)
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        gpu = torch.device("cuda", rank)
        set_tensor_group(dist.new_group(backend="nccl", timeout=COLLECTIVE_TIMEOUT, device_id=gpu))
        all_reduce(torch.zeros(1, device=gpu))  # connect now, not inside a CUDA-graph capture


def leave_tp_group() -> None:
    """Leave the group and become a lone rank again."""
    set_tensor_group(None)
    set_tp_info(0, 1)
    if dist.is_initialized():
        dist.destroy_process_group()
