"""Problem 43: the KV-pool slot of each token of a request, from its pages."""

from __future__ import annotations


def token_slots(pages: list[int], page_size: int, num_tokens: int) -> list[int]:
    """Slot of each token 0..num_tokens-1; ValueError if the pages are too few."""
    if num_tokens > len(pages) * page_size:
        raise ValueError(f"{len(pages)} pages of {page_size} cannot hold {num_tokens} tokens")
    return [pages[t // page_size] * page_size + t % page_size for t in range(num_tokens)]
