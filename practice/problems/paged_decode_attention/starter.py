"""Problem 52: decode attention, reading each request's keys through the page table."""

from __future__ import annotations

import math

import torch


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    rows: list[int],
    seq_lens: list[int],
) -> torch.Tensor:
    """q [batch, heads, d]; k/v_cache [slots, kv_heads, d]; request b's keys are at slots
    page_table[rows[b], :seq_lens[b]]. Returns [batch, heads, d]."""
    raise NotImplementedError("gather each request's K/V through its page-table row, attend")
