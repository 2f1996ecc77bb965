"""Problem 173: a request's pages from its slot-per-token page-table row."""

from __future__ import annotations


def pages_of_row(row: list[int], seq_len: int, page_size: int) -> list[int]:
    """The pages holding tokens 0..seq_len-1; ValueError if the row is not page-aligned."""
    raise NotImplementedError("the slot of each page's first token, divided by page_size")
