"""Problem 4: the grouped-query attention head mapping."""

from __future__ import annotations


def kv_head_for_query_heads(num_heads: int, num_kv_heads: int) -> list[int]:
    """Entry j: the KV head that query head j uses. ValueError if the heads do not group."""
    raise NotImplementedError("map each query head to its KV head")
