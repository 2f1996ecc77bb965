"""Problem 183: the memory of a pool of captured decode graphs."""

from __future__ import annotations


def graph_pool_bytes(
    sizes: list[int], vocab: int, logit_bytes: int, scratch_bytes_per_row: int
) -> int:
    """Every graph's logits, plus the largest graph's scratch."""
    logits = sum(sizes) * vocab * logit_bytes
    return logits + max(sizes) * scratch_bytes_per_row
