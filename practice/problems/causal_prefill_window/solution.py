"""Problem 172: how many keys each query of a causal prefill batch attends to."""

from __future__ import annotations


def visible_keys(qo_indptr: list[int], kv_lens: list[int]) -> list[int]:
    """Keys seen by every query token, in batch order; ValueError if new tokens > keys."""
    seen = []
    for r, kv_len in enumerate(kv_lens):
        new = qo_indptr[r + 1] - qo_indptr[r]
        if new > kv_len:
            raise ValueError(f"request {r} has {new} new tokens but only {kv_len} keys")
        cached = kv_len - new
        seen += [cached + i + 1 for i in range(new)]
    return seen
