"""Problem 181: the batch sizes to capture graphs for, and the graph a batch replays."""

from __future__ import annotations


def ladder(max_batch_size: int) -> list[int]:
    """1, 2, 4, every multiple of 8 below max_batch_size, and max_batch_size; sorted."""
    sizes = {n for n in (1, 2, 4) if n < max_batch_size}
    sizes |= set(range(8, max_batch_size, 8)) | {max_batch_size}
    return sorted(sizes)


def graph_for(sizes: list[int], batch_size: int) -> int:
    """The smallest size in `sizes` >= batch_size; ValueError if there is none."""
    fitting = [n for n in sizes if n >= batch_size]
    if not fitting:
        raise ValueError(f"no graph holds {batch_size} rows (largest: {max(sizes)})")
    return min(fitting)
