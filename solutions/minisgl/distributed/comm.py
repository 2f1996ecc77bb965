"""The two collectives a tensor-parallel decoder needs, and one the ranks agree with.

They run on the ranks' tensor group: NCCL on CUDA (a group of its own, with a short timeout so
that a dead rank cannot hang the others), and the default gloo group on the CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minisgl.utils import needs_peers

from .info import get_tp_info

_tensor_group: dist.ProcessGroup | None = None  # None: the default group


def set_tensor_group(group: dist.ProcessGroup | None) -> None:
    """Run the collectives on `group` (None: torch.distributed's default group)."""
    global _tensor_group
    _tensor_group = group


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of `x` over all ranks (in place); `x` itself when alone."""
    if get_tp_info().size == 1:
        return x
    with needs_peers():
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=_tensor_group)
    return x


def all_gather(x: torch.Tensor) -> torch.Tensor:
    """Every rank's `x` concatenated along the first dimension, in rank order; `x` itself when
    alone (upstream's signature: move the dimension to gather to the front first).

    All ranks' pieces must have the same shape (pad an uneven split first).
    """
    size = get_tp_info().size
    if size == 1:
        return x
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(size)]
    with needs_peers():
        dist.all_gather(pieces, x, group=_tensor_group)
    return torch.cat(pieces)


def min_over_ranks(value: int) -> int:
    """The smallest `value` of all ranks (on the default gloo group, from the CPU).

    What a rank sizes from its own free memory (the KV pool) must be the same on every rank:
    each rank runs its own scheduler, and pools of different sizes would admit different
    batches, after which the ranks' collectives no longer pair up and the group hangs.
    """
    if get_tp_info().size == 1:
        return value
    box = torch.tensor([value], dtype=torch.int64)
    with needs_peers():
        dist.all_reduce(box, op=dist.ReduceOp.MIN)
    return int(box.item())
