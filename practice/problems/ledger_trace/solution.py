"""Problem 12: trace a request's ledger through its forwards."""

from __future__ import annotations


def trace(prompt_len: int, max_tokens: int, cached_len: int = 0) -> list[tuple[int, int, int]]:
    """(cached_len, device_len, extend_len) before each forward of the request."""
    device_len, max_device_len = prompt_len, prompt_len + max_tokens
    if max_tokens < 1 or not 0 <= cached_len < device_len <= max_device_len:
        raise ValueError(
            f"invalid ledger: cached_len={cached_len}, prompt_len={prompt_len}, "
            f"max_tokens={max_tokens}"
        )
    rows = []
    while device_len < max_device_len:
        rows.append((cached_len, device_len, device_len - cached_len))
        cached_len, device_len = device_len, device_len + 1
    return rows
