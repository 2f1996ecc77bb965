"""Problem 172: how many keys each query of a causal prefill batch attends to."""

from __future__ import annotations


def visible_keys(qo_indptr: list[int], kv_lens: list[int]) -> list[int]:
    """Keys seen by every query token, in batch order; ValueError if new tokens > keys."""
    raise NotImplementedError("line each request's queries up with the end of its keys")
