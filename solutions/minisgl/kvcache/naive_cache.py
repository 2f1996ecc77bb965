"""A prefix cache that caches nothing: every request computes its whole prompt."""

from __future__ import annotations

import torch

from minisgl.kvcache.base import (
    BaseCacheHandle,
    BasePrefixCache,
    MatchResult,
    SizeInfo,
)


class NaivePrefixCache(BasePrefixCache):
    """The baseline the radix cache (chapter 9) is measured against.

    It never matches and never keeps anything, so a finished request's pages all go back to
    the free list and nothing is ever evictable.
    """

    def __init__(self, device: torch.device) -> None:
        self._empty = torch.empty(0, dtype=torch.int32, device=device)

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        """Never a match: an empty handle and no slots."""
        return MatchResult(BaseCacheHandle(0), self._empty)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        pass  # nothing is cached, so nothing needs protecting

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> tuple[int, BaseCacheHandle]:
        """Keep nothing: 0 tokens were already cached, and the handle holds none."""
        return 0, BaseCacheHandle(0)

    def evict(self, num_tokens: int) -> torch.Tensor:
        """Nothing to evict: asking for any tokens is a bug in the caller (RuntimeError)."""
        if num_tokens > 0:
            raise RuntimeError(f"cannot evict {num_tokens} tokens: the naive cache holds none")
        return self._empty

    @property
    def size_info(self) -> SizeInfo:
        return SizeInfo(evictable_size=0, protected_size=0)

    def check_integrity(self) -> None:
        pass


def naive_prefix_cache(device: torch.device, page_size: int) -> NaivePrefixCache:
    """The naive cache for a pool of any page size (it holds no pages to split)."""
    return NaivePrefixCache(device)
