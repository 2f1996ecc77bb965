"""The attention backend interface: how a batch's queries meet its requests' cached K/V."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable

import torch

from minisgl import features
from minisgl.utils import ConfigError

if TYPE_CHECKING:
    from minisgl.core import Batch
    from minisgl.kvcache.base import BaseKVCachePool


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


@dataclass(frozen=True)
class AttnSetup:
    """What the engine knows when it builds a backend: the pool, the table and the shapes."""

    kv_cache: BaseKVCachePool
    page_table: torch.Tensor
    page_size: int
    num_heads: int  # query heads this process computes
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device


@dataclass(frozen=True)
class BackendEntry:
    """A backend's row (features.ATTENTION_BACKENDS names it): how to build it, when "auto" may
    pick it, and how much it wants to."""

    create: Callable[[AttnSetup], BaseAttnBackend]
    usable: Callable[[AttnSetup], bool]  # may "auto" choose it for this setup?
    priority: int  # "auto" takes the usable backend of highest priority


def backend_part(name: str) -> features.Part:
    """The row of features.ATTENTION_BACKENDS known as `name` (or by an alias); ConfigError,
    listing the names there are, if none is."""
    part = features.find(features.ATTENTION_BACKENDS, name)
    if part is None:
        names = [n for part in features.ATTENTION_BACKENDS for n in (part.name, *part.aliases)]
        raise ConfigError(
            f"attention backend {name!r} is not available (choose from: auto, {', '.join(names)})"
        )
    return part


# Backend name (or alias) -> its BackendEntry: the rows of features.ATTENTION_BACKENDS.
ATTENTION_BACKENDS: Mapping[str, BackendEntry] = features.Registry(features.ATTENTION_BACKENDS)


def resolve_backend(name: str, setup: AttnSetup) -> str:
    """The backend that `name` means: itself (or the backend it is an alias of), or for "auto"
    the usable backend of highest priority; ConfigError for a name no row has."""
    if name != "auto":
        return backend_part(name).name
    usable = [(e.priority, n) for n, e in ATTENTION_BACKENDS.items() if e.usable(setup)]
    if not usable:
        raise ConfigError("no attention backend is usable on this device")
    return max(usable)[1]
