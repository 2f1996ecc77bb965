"""Problem 173: a request's pages from its slot-per-token page-table row."""

from __future__ import annotations


def pages_of_row(row: list[int], seq_len: int, page_size: int) -> list[int]:
    """The pages holding tokens 0..seq_len-1; ValueError if the row is not page-aligned."""
    pages = [row[start] // page_size for start in range(0, seq_len, page_size)]
    for t in range(seq_len):
        if row[t] != pages[t // page_size] * page_size + t % page_size:
            raise ValueError(f"token {t} is in slot {row[t]}, outside its page's slots")
    return pages
