"""Problem 53: where each new token sits in the padded attention block."""

from __future__ import annotations

from itertools import accumulate


def padded_layout(extend_lens: list[int]) -> tuple[list[int], list[int], int]:
    """(query_slots, last_indices, max_extend) for a batch with these extend lengths."""
    raise NotImplementedError("padded row of each flat token, and each request's last token")
