"""Problem 162: a rank's rows of a merged QKV matrix."""

from __future__ import annotations


def rank_rows(
    num_heads: int, num_kv_heads: int, head_dim: int, q_heads: range, kv_heads: range
) -> list[int]:
    """Rows of the full merged [q; k; v] matrix this rank keeps, in its local order."""
    raise NotImplementedError("which rows of q, k and v does the rank keep?")
