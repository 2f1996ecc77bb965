"""Problem 4: the grouped-query attention head mapping."""

from __future__ import annotations


def kv_head_for_query_heads(num_heads: int, num_kv_heads: int) -> list[int]:
    """Entry j: the KV head that query head j uses. ValueError if the heads do not group."""
    if num_kv_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
    group = num_heads // num_kv_heads
    return [j // group for j in range(num_heads)]
