"""Problem 161: share attention heads among tensor-parallel ranks."""

from __future__ import annotations


def partition_heads(num_heads: int, num_kv_heads: int, size: int) -> list[tuple[range, range]]:
    """(query heads, KV heads) of each rank, in rank order; ValueError if size > num_heads."""
    raise NotImplementedError("which heads does each rank compute?")
