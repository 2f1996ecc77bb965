"""Problem 24: the layout of a merged qkv projection."""

from __future__ import annotations


def qkv_output_sizes(num_heads: int, num_kv_heads: int, head_dim: int) -> list[int]:
    """[q_size, kv_size, kv_size] of the merged qkv projection."""
    raise NotImplementedError("rows of q, k and v")


def shard_rows(output_sizes: list[int], shard: int) -> tuple[int, int]:
    """Rows (start, stop) of shard `shard` in the merged matrix; ValueError if no such shard."""
    raise NotImplementedError("where does this shard start and stop?")
