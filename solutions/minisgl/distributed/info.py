"""Which tensor-parallel rank this process is: set once per process, read by every layer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DistributedInfo:
    """This process's place among the tensor-parallel ranks (rank 0 .. size - 1)."""

    rank: int
    size: int

    def is_primary(self) -> bool:
        """Rank 0, the one that owns the tokenizer side and prints."""
        return self.rank == 0


_tp_info = DistributedInfo(rank=0, size=1)


def get_tp_info() -> DistributedInfo:
    """This process's rank and the number of ranks; DistributedInfo(0, 1) until `set_tp_info`."""
    return _tp_info


def set_tp_info(rank: int, size: int) -> None:
    """Record this process's rank (done once, before the model is built)."""
    global _tp_info
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in 0..{size - 1}")
    _tp_info = DistributedInfo(rank=rank, size=size)
