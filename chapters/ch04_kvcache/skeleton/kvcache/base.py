"""Interfaces of the KV cache: the pool that stores K/V, and the prefix cache that shares it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import torch

from minisgl import features


class BaseKVCachePool(ABC):
    """Storage for the keys and values of every cached token, addressed by slot index."""

    @abstractmethod
    def k_cache(self, layer_id: int) -> torch.Tensor:
        """[num_slots, kv_heads, head_dim] keys of one layer."""

    @abstractmethod
    def v_cache(self, layer_id: int) -> torch.Tensor:
        """[num_slots, kv_heads, head_dim] values of one layer."""

    @abstractmethod
    def store_kv(
        self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor, layer_id: int
    ) -> None:
        """Write the new tokens' k, v ([tokens, kv_heads, head_dim]) into slots `out_loc`."""

    @property
    @abstractmethod
    def num_slots(self) -> int:
        """How many tokens the pool can hold."""


@dataclass(frozen=True)
class BaseCacheHandle:
    """A request's grip on a cached prefix: the first `cached_len` tokens are in the cache."""

    cached_len: int


@dataclass(frozen=True)
class MatchResult:
    """The longest cached prefix of a sequence: its handle and the KV slots of its tokens."""

    handle: BaseCacheHandle
    indices: torch.Tensor  # [handle.cached_len] KV-pool slots, in token order


@dataclass(frozen=True)
class SizeInfo:
    evictable_size: int  # cached tokens no running request holds: can be evicted
    protected_size: int  # cached tokens some running request holds (locked)

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size


class BasePrefixCache(ABC):
    """Remembers the KV slots of token sequences seen before, so new requests can reuse them."""

    @abstractmethod
    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """The longest prefix of `input_ids` that is cached."""

    @abstractmethod
    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        """Protect (or release) the prefix of `handle` from eviction while a request uses it."""

    @abstractmethod
    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> tuple[int, BaseCacheHandle]:
        """Cache `input_ids` whose K/V live in slots `indices`.

        Returns how many leading tokens were already cached (their slots in `indices` are
        duplicates the caller must free) and a handle on the whole inserted prefix.
        """

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Drop at least `num_tokens` unlocked tokens; return their freed slots."""

    @property
    @abstractmethod
    def size_info(self) -> SizeInfo: ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise if the cache's internal bookkeeping is inconsistent."""


# cache_type -> how to build that prefix cache (device, page_size): the rows of
# features.PREFIX_CACHES, so the scheduler names none of them.
PREFIX_CACHES: Mapping[str, Callable[[torch.device, int], BasePrefixCache]] = features.Registry(
    features.PREFIX_CACHES
)
