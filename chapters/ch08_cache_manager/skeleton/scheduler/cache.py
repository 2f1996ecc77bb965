"""The CacheManager: the one owner of KV pages, and the one writer of the page table.

A page is `page_size` consecutive KV slots; the free list `free_slots` stores each free page
by its first slot. Pages move between three places: the free list, requests (through their
page-table rows), and the prefix cache. Every page is in exactly one of them, which
`check_integrity` verifies whenever the scheduler has nothing running. Since a page-table
entry names a page, every write of an entry happens here: `map_prefix` (a new request's
cached prefix), `allocate_paged` (new pages) and `cache_req` (duplicates swapped for the
cache's copy).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from minisgl.core import Req
from minisgl.kvcache import PREFIX_CACHES, BaseCacheHandle, BasePrefixCache, MatchResult
from minisgl.utils import div_ceil, make_device_tensor


def create_prefix_cache(cache_type: str, device: torch.device, page_size: int) -> BasePrefixCache:
    """The prefix cache features.PREFIX_CACHES names `cache_type` (SchedulerConfig refused
    any other name)."""
    return PREFIX_CACHES[cache_type](device, page_size)


class CacheManager:
    def __init__(
        self,
        num_pages: int,
        page_size: int,
        page_table: torch.Tensor,
        prefix_cache: BasePrefixCache,
    ) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self.page_table = page_table
        self.device = page_table.device
        self.prefix_cache = prefix_cache
        # The free pages, each by its first slot: with page_size 2, [0, 2, 4, ...].
        self.free_slots = torch.arange(num_pages, dtype=torch.int32, device=self.device) * page_size
        self._lazy_freed: list[torch.Tensor] | None = None  # pages freed inside lazy_free_region

    # ----- what is available --------------------------------------------------------------

    @property
    def num_free_pages(self) -> int:
        return len(self.free_slots)

    @property
    def available_size(self) -> int:
        """Tokens that could be allocated now: free pages plus evictable cached tokens."""
        raise NotImplementedError("ch08: Tokens that could be allocated now: free pages plus evictable cached tokens.")

    # ----- the prefix cache ---------------------------------------------------------------

    def match_req(self, input_ids: torch.Tensor) -> MatchResult:
        """Longest cached prefix of a prompt, never the whole prompt.

        The last token must be computed, since its forward is what produces the first output
        token: match only `input_ids[:-1]`."""
        raise NotImplementedError("ch08: Longest cached prefix of a prompt, never the whole prompt.")

    def lock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle)

    def unlock(self, handle: BaseCacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    def map_prefix(self, table_idx: int, match: MatchResult) -> None:
        """Point the first entries of a newly admitted request's row at its matched prefix."""
        raise NotImplementedError("ch08: Point the first entries of a newly admitted request's row at its matched prefix.")

    # ----- allocation ---------------------------------------------------------------------

    def allocate_paged(self, reqs: list[Req]) -> None:
        """Give every request the pages its next forward writes into.

        A request owns pages [0, ceil(cached_len / page)) already; positions up to device_len
        need pages up to ceil(device_len / page). Take all missing pages with one `_allocate`,
        expand them with `_page_to_token`, and put the slots into the page table in one
        indexed write, whose row and column indices are built on the host and copied once
        (`make_device_tensor`). Afterwards every position < device_len of each row names a
        slot, and each page-aligned run of page_size positions lies in one page.
        """
        raise NotImplementedError("ch08: Give every request the pages its next forward writes into.")

    def _allocate(self, needed_pages: int) -> torch.Tensor:
        """Pop `needed_pages` pages off the free list (each page by its first slot).

        When the free list is short, first evict the missing pages' tokens from the prefix cache
        and put the first slot of each evicted page on the free list. Still short afterwards is
        a bug of admission control: raise RuntimeError."""
        raise NotImplementedError("ch08: Pop `needed_pages` pages off the free list (each page by its first slot).")

    def _page_to_token(self, pages: torch.Tensor) -> torch.Tensor:
        """Pages (by first slot) -> every slot of them: [p, p+1, ..., p+page_size-1, ...]."""
        raise NotImplementedError("ch08: Pages (by first slot) -> every slot of them: [p, p+1, ..., p+page_size-1, ...].")

    def free(self, indices: torch.Tensor) -> None:
        """Return the pages of these page-aligned slots (one entry per token) to the free list.

        The free list holds the first slot of each page. While a lazy_free_region is open, the
        pages go onto the lazy list `self._lazy_freed` instead."""
        raise NotImplementedError("ch08: Return the pages of these page-aligned slots (one entry per token) to the free list.")

    @contextmanager
    def lazy_free_region(self) -> Iterator[None]:
        """Batch every free inside the block into one concatenation at its end.

        While the block runs, `free` appends freed pages to the lazy list `self._lazy_freed`
        (None outside a region) instead of growing `free_slots`. At the end, even if the
        block raised, the list is reset to None and its pages join `free_slots` in one
        torch.cat, so no freed page is lost or counted twice.
        """
        raise NotImplementedError("ch08: Batch every free inside the block into one concatenation at its end.")

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
        Insert with `prefix_cache.insert_prefix`, free with `free` (each region starts on a
        page boundary). Afterwards: a finished request holds nothing (its old handle is
        unlocked); a running one holds the new handle, locked before the old one is unlocked so
        that nothing it reads can be evicted in between, and its row names only slots it owns
        or the cache's.
        """
        raise NotImplementedError("ch08: Insert the request's computed prefix into the prefix cache and settle its pages.")

    # ----- checks -------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """With no request running, every page is either free or in the prefix cache."""
        raise NotImplementedError("ch08: With no request running, every page is either free or in the prefix cache.")
