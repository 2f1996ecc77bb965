"""KV storage (the pool) and KV sharing between requests (prefix caches)."""

from .base import (
    PREFIX_CACHES,
    BaseCacheHandle,
    BaseKVCachePool,
    BasePrefixCache,
    MatchResult,
    SizeInfo,
)
from .mha_pool import MHAKVCache
from .naive_cache import NaivePrefixCache
from .radix_cache import RadixPrefixCache
