from __future__ import annotations

import heapq

import torch

from minisgl.kvcache.radix_cache import RadixPrefixCache


def evict(self: RadixPrefixCache, num_tokens: int) -> torch.Tensor:
    """Drop at least `num_tokens` unlocked cached tokens, least recently used leaves first;
    return the KV slots they occupied."""
    # reference body: kvcache/radix_cache.py:RadixPrefixCache.evict
