from __future__ import annotations

import heapq

import torch

from minisgl.kvcache.radix_cache import RadixPrefixCache


def evict(self: RadixPrefixCache, num_tokens: int) -> torch.Tensor:
    """Drop at least `num_tokens` unlocked cached tokens, least recently used leaves first;
    return the KV slots they occupied."""
    raise NotImplementedError("pop unlocked leaves by last_access until num_tokens are freed")
