"""Problem 182: a decode batch's page lists and KV slots, padded to its graph's size."""

from __future__ import annotations


def pad_for_graph(
    kv_indptr: list[int],
    kv_indices: list[int],
    last_page_len: list[int],
    out_loc: list[int],
    graph_size: int,
    pad_page: int,
    page_size: int,
) -> tuple[list[int], list[int], list[int], list[int]]:
    """The four lists with graph_size - n padding rows, each on the spare page."""
    raise NotImplementedError("one page, one slot, one query per padding row")
