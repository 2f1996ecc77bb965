"""Problem 171: a batch's pages as FlashInfer's kv_indptr, kv_indices and last_page_len."""

from __future__ import annotations


def csr_lists(
    pages: list[list[int]], seq_lens: list[int], page_size: int
) -> tuple[list[int], list[int], list[int]]:
    """(kv_indptr, kv_indices, last_page_len); ValueError if a request's pages do not fit."""
    raise NotImplementedError("count each request's pages, then concatenate them")
