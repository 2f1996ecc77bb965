"""Problem 12: trace a request's ledger through its forwards."""

from __future__ import annotations


def trace(prompt_len: int, max_tokens: int, cached_len: int = 0) -> list[tuple[int, int, int]]:
    """(cached_len, device_len, extend_len) before each forward of the request."""
    raise NotImplementedError("simulate the ledger forward by forward")
