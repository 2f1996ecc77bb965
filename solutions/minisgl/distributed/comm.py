"""The two collectives a tensor-parallel decoder needs.

They run on the ranks' tensor group: NCCL on CUDA (a group of its own, with a short timeout so
that a dead rank cannot hang the others), and the default gloo group on the CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

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
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=_tensor_group)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Every rank's `x` concatenated along `dim`, in rank order; `x` itself when alone.

    All ranks' pieces must have the same shape (pad an uneven split first).
    """
    size = get_tp_info().size
    if size == 1:
        return x
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(pieces, x, group=_tensor_group)
    return torch.cat(pieces, dim=dim)
