"""Problem 42: the size of a token's K/V, and how many tokens a budget holds."""

from __future__ import annotations


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V that one token takes, over all layers."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def tokens_that_fit(budget_bytes: int, bytes_per_token: int, page_size: int) -> int:
    """Tokens a pool of whole pages holds within budget_bytes."""
    pages = budget_bytes // (bytes_per_token * page_size)
    return pages * page_size
