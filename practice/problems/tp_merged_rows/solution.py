"""Problem 162: a rank's rows of a merged QKV matrix."""

from __future__ import annotations


def rank_rows(
    num_heads: int, num_kv_heads: int, head_dim: int, q_heads: range, kv_heads: range
) -> list[int]:
    """Rows of the full merged [q; k; v] matrix this rank keeps, in its local order."""
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    rows: list[int] = []
    for offset, heads in [(0, q_heads), (q_size, kv_heads), (q_size + kv_size, kv_heads)]:
        rows += range(offset + heads.start * head_dim, offset + heads.stop * head_dim)
    return rows
