"""The CacheManager: the one owner of KV pages.

A page is `page_size` consecutive KV slots; the free list stores each free page by its first
slot. Pages move between three places: the free list, requests (through their page-table
rows), and the prefix cache. Every page is in exactly one of them, which `check_integrity`
verifies whenever the scheduler has nothing running.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from minisgl.core import Req
from minisgl.kvcache import BaseCacheHandle, BasePrefixCache, MatchResult, NaivePrefixCache
from minisgl.utils import div_ceil


def create_prefix_cache(cache_type: str, device: torch.device, page_size: int) -> BasePrefixCache:
    if cache_type == "radix":
        from minisgl.kvcache.radix_cache import RadixPrefixCache  # written in chapter 9

        return RadixPrefixCache(device, page_size)
    return NaivePrefixCache(device)


class CacheManager:
    def __init__(self, num_pages: int, page_size: int, page_table: torch.Tensor,
                 prefix_cache: BasePrefixCache) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.device = page_table.device
        self.prefix_cache = prefix_cache
        self.free_pages = torch.arange(num_pages, dtype=torch.int32, device=self.device) * page_size
        self._lazy_freed: list[torch.Tensor] | None = None

    # ----- what is available --------------------------------------------------------------

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def available_size(self) -> int:
        """Tokens that could be allocated now: free pages plus evictable cached tokens."""
        return self.num_free_pages * self.page_size + self.prefix_cache.size_info.evictable_size

    # ----- the prefix cache ---------------------------------------------------------------

    def match_req(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest cached prefix of a prompt, never the whole prompt: the last token must be
        computed, since its forward is what produces the first output token."""
        assert len(input_ids) > 0, "empty prompts are rejected before they get here"
        return self.prefix_cache.match_prefix(input_ids[: len(input_ids) - 1])

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    # ----- allocation ---------------------------------------------------------------------

    def allocate_paged(self, reqs: list[Req]) -> None:
        """Give every request the pages its next forward writes into.

        A request owns pages [0, ceil(cached_len / page)) already; positions up to device_len
        need pages up to ceil(device_len / page). All new slots go into the page table in one
        indexed write.
        """
        rows, cols, spans = [], [], []
        for req in reqs:
            first_page = div_ceil(req.cached_len, self.page_size)
            last_page = div_ceil(req.device_len, self.page_size)
            if last_page > first_page:
                start, end = first_page * self.page_size, last_page * self.page_size
                rows.append(torch.full((end - start,), req.table_idx, dtype=torch.int64))
                cols.append(torch.arange(start, end, dtype=torch.int64))
                spans.append(last_page - first_page)
        if not spans:
            return
        pages = self._take_pages(sum(spans))
        slots = (pages[:, None] + torch.arange(self.page_size, device=self.device)).flatten()
        row_index = torch.cat(rows).to(self.device, non_blocking=True)
        col_index = torch.cat(cols).to(self.device, non_blocking=True)
        self.page_table[row_index, col_index] = slots.to(self.page_table.dtype)

    def _take_pages(self, num_pages: int) -> torch.Tensor:
        """Pop pages off the free list, evicting from the prefix cache when it is short."""
        if num_pages > self.num_free_pages:
            needed_tokens = (num_pages - self.num_free_pages) * self.page_size
            evicted = self.prefix_cache.evict(needed_tokens)
            self.free_pages = torch.cat([self.free_pages, evicted[:: self.page_size]])
        if num_pages > self.num_free_pages:  # admission control makes this unreachable
            raise RuntimeError(f"out of KV pages: need {num_pages}, have {self.num_free_pages}")
        taken, self.free_pages = self.free_pages[:num_pages], self.free_pages[num_pages:]
        return taken

    def _free_slots(self, slots: torch.Tensor) -> None:
        """Return the pages starting at these page-aligned slots (one entry per token)."""
        if len(slots) == 0:
            return
        pages = slots[:: self.page_size]
        if self._lazy_freed is not None:
            self._lazy_freed.append(pages)
        else:
            self.free_pages = torch.cat([self.free_pages, pages])

    @contextmanager
    def lazy_free_region(self) -> Iterator[None]:
        """Batch every free inside the block into one concatenation at its end."""
        self._lazy_freed = []
        try:
            yield
        finally:
            freed, self._lazy_freed = self._lazy_freed, None
            if freed:
                self.free_pages = torch.cat([self.free_pages, *freed])

    # ----- handing a request's KV to the prefix cache -------------------------------------

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Insert the request's computed prefix into the prefix cache and settle its pages.

        The slots [0, req.cached_len) of the request's row fall into four regions:

        - [0, old)       matched from the cache at admission (locked by this request);
        - [old, shared)  computed here, but meanwhile cached by another request: duplicates,
                         freed (and, if the request goes on, its row is pointed at the cache's);
        - [shared, new)  newly inserted into the cache: the cache owns them now;
        - [new, cached)  the sub-page tail, too short to cache: freed if the request finished,
                         else kept by the request.

        where old = the handle's cached_len at admission, shared = how much of the insert was
        already cached, and new = the inserted length (cached_len rounded down to a page).
        """
        # A copy: the row may be rewritten below while freed slices of it wait in a lazy free.
        row_slots = self.page_table[req.table_idx, : req.cached_len].clone()
        old_handle = req.cache_handle
        assert old_handle is not None, "a running request always holds a cache handle"
        ids = req.input_ids[: req.cached_len]
        shared, new_handle = self.prefix_cache.insert_prefix(ids, row_slots)
        self._free_slots(row_slots[old_handle.cached_len : shared])
        if finished:
            self._free_slots(row_slots[new_handle.cached_len :])
            self.unlock(old_handle)
            return
        if shared > old_handle.cached_len:
            # Our duplicates are freed: read those tokens' K/V from the cache's slots instead.
            cached_slots = self.prefix_cache.match_prefix(ids[:shared]).indices
            self.page_table[req.table_idx, old_handle.cached_len : shared] = \
                cached_slots[old_handle.cached_len : shared].to(self.page_table.dtype)
        self.lock(new_handle)  # lock the new path before unlocking the old: nothing evicted
        self.unlock(old_handle)
        req.cache_handle = new_handle

    # ----- checks -------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """With no request running, every page is either free or in the prefix cache."""
        self.prefix_cache.check_integrity()
        size = self.prefix_cache.size_info
        if size.protected_size:
            raise RuntimeError(f"{size.protected_size} cached tokens are still locked "
                               "with no request running")
        cached_pages = size.total_size // self.page_size
        if self.num_free_pages + cached_pages != self.num_pages:
            raise RuntimeError(f"page leak: {self.num_free_pages} free + {cached_pages} cached "
                               f"!= {self.num_pages} pages")
        if len(torch.unique(self.free_pages)) != self.num_free_pages:
            raise RuntimeError("a page is on the free list twice (double free)")
        if bool((self.free_pages % self.page_size != 0).any()):
            raise RuntimeError("a free-list entry is not the first slot of a page")
