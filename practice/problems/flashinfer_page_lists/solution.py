"""Problem 171: a batch's pages as FlashInfer's kv_indptr, kv_indices and last_page_len."""

from __future__ import annotations


def csr_lists(
    pages: list[list[int]], seq_lens: list[int], page_size: int
) -> tuple[list[int], list[int], list[int]]:
    """(kv_indptr, kv_indices, last_page_len); ValueError if a request's pages do not fit."""
    kv_indptr, kv_indices, last_page_len = [0], [], []
    for owned, n in zip(pages, seq_lens):
        needed = -(-n // page_size)
        if len(owned) != needed:
            raise ValueError(f"{n} tokens need {needed} pages of {page_size}, not {len(owned)}")
        kv_indptr.append(kv_indptr[-1] + needed)
        kv_indices += owned
        last_page_len.append(n - (needed - 1) * page_size)
    return kv_indptr, kv_indices, last_page_len
