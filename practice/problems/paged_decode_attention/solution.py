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
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[1]
    out = torch.empty_like(q)
    for b, (row, n) in enumerate(zip(rows, seq_lens)):
        slots = page_table[row, :n].long()
        keys = k_cache[slots].repeat_interleave(group, dim=1)  # [n, heads, d]
        values = v_cache[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b], keys) / math.sqrt(head_dim)
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), values)
    return out
