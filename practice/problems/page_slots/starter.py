"""Problem 43: the KV-pool slot of each token of a request, from its pages."""

from __future__ import annotations


def token_slots(pages: list[int], page_size: int, num_tokens: int) -> list[int]:
    """Slot of each token 0..num_tokens-1; ValueError if the pages are too few."""
    raise NotImplementedError("page of the token, then offset within the page")
