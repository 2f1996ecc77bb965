"""The attention backend interface: how a batch's queries meet its requests' cached K/V."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from minisgl.core import Batch


@dataclass
class BaseAttnMetadata:
    """What a backend precomputes once per batch and reuses in every layer."""

    last_indices: torch.Tensor  # [batch size] index of each request's last token in the batch


class BaseAttnBackend(ABC):
    @abstractmethod
    def prepare_metadata(self, batch: Batch) -> None:
        """Compute batch.attn_metadata from the batch's ledgers and the page table."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: Batch
    ) -> torch.Tensor:
        """Store k, v at batch.out_loc, then attend.

        q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; returns like q.
        Each token attends to its own request's tokens at positions <= its own.
        """
