"""Paged attention in plain PyTorch: runs on any device, and is the reference for the others.

Each request's keys live scattered over the KV pool; its page-table row lists their slots in
order. We gather them into a padded [batch, max_len] block, then call scaled_dot_product_attention
with a mask that hides padding and (for prefill) future tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from minisgl.attention.base import (
    BackendEntry,
    BaseAttnBackend,
    BaseAttnMetadata,
)
from minisgl.kvcache.base import BaseKVCachePool
from minisgl.utils import make_device_tensor

if TYPE_CHECKING:
    from minisgl.core import Batch


# cuDNN's attention builds a plan for every new shape, and building one waits for the device:
# with the keys one longer at every decode step, every step would stall the CPU and undo the
# overlap of chapter 11. These kernels never wait (on a CPU, flash or math runs as before).
NON_BLOCKING_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, enable_gqa: bool = False
) -> torch.Tensor:
    """scaled_dot_product_attention with a boolean mask, by a kernel that never waits."""
    with sdpa_kernel(NON_BLOCKING_SDPA):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)


@dataclass
class TorchAttnMetadata(BaseAttnMetadata):
    kv_indices: torch.Tensor  # [batch, max_seq_len] KV-pool slots, padded with slot 0
    mask: torch.Tensor  # [batch, 1, max_extend_len, max_seq_len] True where attention is allowed
    query_slots: (
        torch.Tensor
    )  # [tokens] where each token sits in the padded [batch * max_extend_len]
    max_extend_len: int


class TorchAttnBackend(BaseAttnBackend):
    def __init__(self, kv_cache: BaseKVCachePool, page_table: torch.Tensor) -> None:
        self.kv_cache = kv_cache
        self.page_table = page_table

    def prepare_metadata(self, batch: Batch) -> None:
        """Build each request's padded slot list, the causal mask and the query layout.

        The per-request numbers are built on the host and copied once; everything else is
        computed on the device from them, so nothing here waits for the device.
        """
        raise NotImplementedError("ch05: Build each request's padded slot list, the causal mask and the query layout.")

    @staticmethod
    def _gather(cache: torch.Tensor, kv_indices: torch.Tensor) -> torch.Tensor:
        """[slots, kv_heads, head_dim] -> [batch, kv_heads, max_seq, head_dim] of each row's slots.

        index_select on the flattened indices is several times faster on the CPU than
        indexing with the 2-D tensor, which goes through the general advanced-indexing path.
        """
        batch, max_seq = kv_indices.shape
        rows = cache.index_select(0, kv_indices.flatten())
        return rows.view(batch, max_seq, *cache.shape[1:]).transpose(1, 2)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """Store k, v at out_loc, gather each request's keys and values, attend."""
        raise NotImplementedError("ch05: Store k, v at out_loc, gather each request's keys and values, attend.")


TORCH_BACKEND = BackendEntry(
    create=lambda setup: TorchAttnBackend(setup.kv_cache, setup.page_table),
    usable=lambda setup: True,  # any device, any dtype
    priority=0,
)
