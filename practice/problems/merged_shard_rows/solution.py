"""Problem 24: the layout of a merged qkv projection."""

from __future__ import annotations


def qkv_output_sizes(num_heads: int, num_kv_heads: int, head_dim: int) -> list[int]:
    """[q_size, kv_size, kv_size] of the merged qkv projection."""
    kv_size = num_kv_heads * head_dim
    return [num_heads * head_dim, kv_size, kv_size]


def shard_rows(output_sizes: list[int], shard: int) -> tuple[int, int]:
    """Rows (start, stop) of shard `shard` in the merged matrix; ValueError if no such shard."""
    if not 0 <= shard < len(output_sizes):
        raise ValueError(f"shard {shard} does not exist: there are {len(output_sizes)} shards")
    start = sum(output_sizes[:shard])
    return start, start + output_sizes[shard]
