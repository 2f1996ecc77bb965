"""The KV pool for multi-head (and grouped-query) attention: one big tensor, sliced per layer."""

from __future__ import annotations

import torch

from minisgl.kvcache.base import BaseKVCachePool


class MHAKVCache(BaseKVCachePool):
    """K and V of `num_slots` tokens for every layer, allocated once up front.

    Layout [2, layers, slots, kv_heads, head_dim]: one slot index addresses a token's K and V
    in every layer, so the page table needs one entry per token, not one per layer.
    """

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self._buffer = torch.zeros(
            2, num_layers, num_slots, num_kv_heads, head_dim, dtype=dtype, device=device
        )

    def k_cache(self, layer_id: int) -> torch.Tensor:
        """The keys of one layer: a view [num_slots, kv_heads, head_dim] of the buffer."""
        return self._buffer[0, layer_id]

    def v_cache(self, layer_id: int) -> torch.Tensor:
        """The values of one layer: a view [num_slots, kv_heads, head_dim] of the buffer."""
        return self._buffer[1, layer_id]

    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write k and v of the new tokens into slots out_loc of one layer."""
        self._buffer[0, layer_id].index_copy_(0, out_loc.long(), k)
        self._buffer[1, layer_id].index_copy_(0, out_loc.long(), v)

    @property
    def num_slots(self) -> int:
        return self._buffer.shape[2]
