"""Problem 53: where each new token sits in the padded attention block."""

from __future__ import annotations

from itertools import accumulate


def padded_layout(extend_lens: list[int]) -> tuple[list[int], list[int], int]:
    """(query_slots, last_indices, max_extend) for a batch with these extend lengths."""
    if not extend_lens or min(extend_lens) < 1:
        raise ValueError(f"every request must compute at least one token: {extend_lens}")
    max_extend = max(extend_lens)
    query_slots = [b * max_extend + k for b, n in enumerate(extend_lens) for k in range(n)]
    last_indices = [end - 1 for end in accumulate(extend_lens)]
    return query_slots, last_indices, max_extend
