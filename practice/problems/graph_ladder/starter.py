"""Problem 181: the batch sizes to capture graphs for, and the graph a batch replays."""

from __future__ import annotations


def ladder(max_batch_size: int) -> list[int]:
    """1, 2, 4, every multiple of 8 below max_batch_size, and max_batch_size; sorted."""
    raise NotImplementedError("the small powers of two, the multiples of 8, the maximum")


def graph_for(sizes: list[int], batch_size: int) -> int:
    """The smallest size in `sizes` >= batch_size; ValueError if there is none."""
    raise NotImplementedError("the first captured size that holds the batch")
