"""Chapter 8 tests: the CacheManager (pages in, pages out, cache_req, the integrity check) and
admission control (PrefillAdder.try_add_one, worst_case_tokens, DecodeManager.inflight_tokens).

The radix cache is written in chapter 9, so the prefix-cache side of cache_req, eviction and
matching is exercised with `PagePrefixCache` below: a deliberately small prefix cache that keeps
whole pages in a dict, keyed by every token up to the page's end, with a lock count per page.
The engine runs with cache_type="naive" and enable_overlap=False (overlap is chapter 11).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import (
    TINY_MODELS,
    assert_same_trace,
    hf_greedy_cached,
    load_tokenizer,
    scheduler_trace,
    shared_prefix_prompts,
)
from course.differential import assert_same_call
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle, BasePrefixCache, MatchResult, NaivePrefixCache
from minisgl.kvcache.base import SizeInfo
from minisgl.scheduler import Scheduler, SchedulerConfig, TableManager
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.decode import DecodeManager
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.utils import PendingReq

CPU = torch.device("cpu")
QWEN3 = TINY_MODELS["qwen3"]
ROWS, ROW_LEN = 8, 256  # page table of the unit tests
MAX_STEPS = 500  # a scheduler that has not finished by then is stuck


# --- a small prefix cache for this chapter ---------------------------------------------------


@dataclass(frozen=True)
class PageHandle(BaseCacheHandle):
    keys: tuple[tuple[int, ...], ...] = ()  # the cached pages of the prefix, in order


class PagePrefixCache(BasePrefixCache):
    """Whole pages keyed by all tokens up to their end: a page can only be cached if the
    pages before it are, so matching walks pages in order. Only unlocked pages that no other
    cached page extends are evicted (oldest first), so cached pages always form prefixes."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.pages: dict[tuple[int, ...], list] = {}  # key -> [slots, lock count]
        self.evicted_tokens = 0

    def _keys(self, ids: torch.Tensor) -> list[tuple[int, ...]]:
        ids = ids.tolist()
        return [tuple(ids[:end]) for end in range(self.page_size, len(ids) + 1, self.page_size)]

    def match_prefix(self, input_ids: torch.Tensor) -> MatchResult:
        keys = []
        for key in self._keys(input_ids):
            if key not in self.pages:
                break
            keys.append(key)
        slots = [self.pages[key][0] for key in keys]
        indices = torch.cat(slots) if slots else torch.empty(0, dtype=torch.int32)
        return MatchResult(PageHandle(len(keys) * self.page_size, tuple(keys)), indices)

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        assert isinstance(handle, PageHandle) or handle.cached_len == 0, handle
        for key in getattr(handle, "keys", ()):
            self.pages[key][1] += -1 if unlock else 1
            assert self.pages[key][1] >= 0, "unlocked more often than locked"

    def insert_prefix(
        self, input_ids: torch.Tensor, indices: torch.Tensor
    ) -> tuple[int, BaseCacheHandle]:
        keys, shared = self._keys(input_ids), 0
        for i, key in enumerate(keys):
            if key in self.pages:
                shared = (i + 1) * self.page_size
            else:
                span = slice(i * self.page_size, (i + 1) * self.page_size)
                self.pages[key] = [indices[span].clone(), 0]
        return shared, PageHandle(len(keys) * self.page_size, tuple(keys))

    def _is_leaf(self, key: tuple[int, ...]) -> bool:
        n = len(key) + self.page_size
        return not any(len(other) == n and other[: len(key)] == key for other in self.pages)

    def evict(self, num_tokens: int) -> torch.Tensor:
        freed = []
        while num_tokens > 0:
            leaf = next(
                (
                    key
                    for key, (_, locks) in self.pages.items()
                    if locks == 0 and self._is_leaf(key)
                ),
                None,
            )
            if leaf is None:
                raise RuntimeError(f"cannot evict {num_tokens} more tokens")
            freed.append(self.pages.pop(leaf)[0])
            num_tokens -= self.page_size
            self.evicted_tokens += self.page_size
        return torch.cat(freed) if freed else torch.empty(0, dtype=torch.int32)

    @property
    def size_info(self) -> SizeInfo:
        locked = sum(1 for _, locks in self.pages.values() if locks)
        return SizeInfo(
            evictable_size=(len(self.pages) - locked) * self.page_size,
            protected_size=locked * self.page_size,
        )

    def check_integrity(self) -> None:
        for key in self.pages:
            assert len(key) == self.page_size or key[: -self.page_size] in self.pages


# --- helpers ---------------------------------------------------------------------------------


def cache_manager(
    page_size: int, num_pages: int, prefix_cache: BasePrefixCache | None = None
) -> CacheManager:
    page_table = torch.full((ROWS, ROW_LEN), -1, dtype=torch.int32)
    return CacheManager(num_pages, page_size, page_table, prefix_cache or NaivePrefixCache(CPU))


def make_req(
    ids: list[int],
    row: int,
    cached_len: int = 0,
    output_len: int = 16,
    handle: BaseCacheHandle | None = None,
) -> Req:
    return Req(
        torch.tensor(ids, dtype=torch.int32),
        table_idx=row,
        cached_len=cached_len,
        output_len=output_len,
        uid=row,
        sampling_params=SamplingParams(),
        cache_handle=handle if handle is not None else BaseCacheHandle(0),
    )


def prefill(cm: CacheManager, req: Req) -> None:
    """What the scheduler does for a prefill: allocate, then (after the forward) advance."""
    cm.allocate_paged([req])
    req.complete_one()


def row_pages(cm: CacheManager, req: Req, length: int) -> list[int]:
    """First slot of each page the request's row maps for positions [0, length)."""
    return cm.page_table[req.table_idx, : length : cm.page_size].tolist()


def assert_integrity_fails(cm: CacheManager) -> None:
    with pytest.raises(Exception) as error:
        cm.check_integrity()
    assert not isinstance(error.value, NotImplementedError), "check_integrity is not written"


# --- allocation ------------------------------------------------------------------------------


def test_a_forward_gets_exactly_the_new_pages_its_positions_need():
    """page_size 4, cached_len 6, device_len 9: positions 6..8 are computed; 6 and 7 are in
    the request's second page already, 8 starts a new one: exactly one page is taken."""
    cm = cache_manager(page_size=4, num_pages=8)
    req = make_req(list(range(100, 106)), row=3)  # a 6-token prompt: pages for positions 0..7
    cm.allocate_paged([req])
    owned = cm.page_table[3, :8].clone()
    assert cm.num_free_pages == 6
    req = make_req(list(range(100, 109)), row=3, cached_len=6)
    assert (req.cached_len, req.device_len) == (6, 9)
    cm.allocate_paged([req])
    assert cm.num_free_pages == 5, "cached_len=6, device_len=9 needs exactly one new page"
    assert torch.equal(cm.page_table[3, :8], owned), "pages the request owns are not rewritten"
    new = cm.page_table[3, 8:12]
    assert int(new[0]) % 4 == 0 and new.tolist() == list(range(int(new[0]), int(new[0]) + 4))
    assert int(new[0]) not in owned.tolist(), "a page already owned was handed out again"
    assert (cm.page_table[3, 12:] == -1).all(), "nothing beyond the page is written"
    assert (cm.page_table[torch.arange(ROWS) != 3] == -1).all(), "other rows are untouched"


def test_decode_allocates_a_new_page_once_every_page_size_steps():
    page_size = 4
    cm = cache_manager(page_size, num_pages=16)
    req = make_req(list(range(100, 105)), row=0, output_len=32)  # 5 prompt tokens
    prefill(cm, req)
    assert cm.num_free_pages == 14
    taken = []
    for _ in range(12):
        free_before = cm.num_free_pages
        cm.allocate_paged([req])
        taken.append(free_before - cm.num_free_pages)
        req.complete_one()
    # decode steps 1..12 compute positions 5..16: positions 8, 12 and 16 start a page
    assert [step for step, n in enumerate(taken, 1) if n] == [4, 8, 12]
    assert set(taken) == {0, 1}
    slots = cm.page_table[0, : req.cached_len]
    pages = slots[::page_size]
    assert len(set(pages.tolist())) == len(pages), "a page handed out twice"
    expected = (pages[:, None] + torch.arange(page_size)).flatten()[: req.cached_len]
    assert torch.equal(slots, expected.to(slots.dtype)), "each page holds page_size positions"


def test_requests_of_one_batch_get_disjoint_pages():
    cm = cache_manager(page_size=2, num_pages=32)
    reqs = [make_req(list(range(10, 10 + n)), row=i) for i, n in enumerate([3, 8, 1, 5])]
    cm.allocate_paged(reqs)
    assert cm.num_free_pages == 32 - (2 + 4 + 1 + 3)
    slots = torch.cat([cm.page_table[r.table_idx, : r.device_len] for r in reqs])
    assert len(torch.unique(slots)) == len(slots)


# --- freeing ---------------------------------------------------------------------------------


def test_freeing_returns_whole_pages_and_a_lazy_region_frees_at_its_end():
    cm = cache_manager(page_size=4, num_pages=8)
    a, b = make_req(list(range(9)), row=0), make_req(list(range(5)), row=1)
    cm.allocate_paged([a, b])
    assert cm.num_free_pages == 3
    cm.free(cm.page_table[0, :9])  # one entry per token: 3 pages
    assert cm.num_free_pages == 6
    with cm.lazy_free_region():
        cm.free(cm.page_table[1, :5])
        cm.free(cm.page_table[1, :0])  # nothing
        assert cm.num_free_pages == 6, "inside a lazy region frees wait for its end"
    assert cm.num_free_pages == 8
    cm.check_integrity()

    cm.allocate_paged([make_req(list(range(7)), row=2)])
    with pytest.raises(KeyError):  # the region's frees are not lost when its body fails
        with cm.lazy_free_region():
            cm.free(cm.page_table[2, :7])
            raise KeyError("boom")
    assert cm.num_free_pages == 8
    cm.check_integrity()


def test_cache_req_gives_back_every_page_of_a_finished_request():
    cm = cache_manager(page_size=4, num_pages=8)
    req = make_req(list(range(100, 109)), row=5)
    prefill(cm, req)
    for token in (7, 8, 9, 10):  # four decode steps: the last computes position 12, a new page
        req.append_host(token)
        prefill(cm, req)
    assert cm.num_free_pages == 4
    with cm.lazy_free_region():
        cm.cache_req(req, finished=True)
    assert cm.num_free_pages == 8
    cm.check_integrity()


def test_cache_req_keeps_whole_pages_in_the_prefix_cache_and_frees_the_tail():
    cache = PagePrefixCache(page_size=4)
    cm = cache_manager(page_size=4, num_pages=8, prefix_cache=cache)
    req = make_req(list(range(100, 110)), row=0)  # 10 tokens: 2 whole pages and a tail
    prefill(cm, req)
    cm.cache_req(req, finished=True)
    assert cache.size_info == SizeInfo(evictable_size=8, protected_size=0)
    assert cm.num_free_pages == 8 - 2
    assert cache.match_prefix(req.input_ids).indices.tolist() == cm.page_table[0, :8].tolist(), (
        "the cache holds the request's own slots"
    )
    cm.check_integrity()


def test_cache_req_of_a_running_request_frees_its_duplicates_and_reads_the_cached_copy():
    """Two requests with the same prompt are prefilled in one batch, so neither found the
    other's pages in the cache: the second one's copies of the shared pages are duplicates."""
    cache = PagePrefixCache(page_size=2)
    cm = cache_manager(page_size=2, num_pages=16, prefix_cache=cache)
    prompt = list(range(200, 207))  # 7 tokens: 3 whole pages, the 4th partly used
    a, b = make_req(prompt, row=0), make_req(prompt, row=1)
    cm.allocate_paged([a, b])
    a.complete_one()
    b.complete_one()
    assert cm.num_free_pages == 16 - 8
    a_slots = cm.page_table[0, :7].clone()
    b_tail = cm.page_table[1, 6].item()

    cm.cache_req(a, finished=False)
    assert cache.size_info == SizeInfo(evictable_size=0, protected_size=6), (
        "a running request's cached prefix is locked"
    )
    assert a.cache_handle.cached_len == 6
    cm.cache_req(b, finished=False)
    assert cm.num_free_pages == 16 - 8 + 3, "b's three duplicate pages are freed"
    assert torch.equal(cm.page_table[1, :6], a_slots[:6]), "b reads the shared K/V from a's slots"
    assert cm.page_table[1, 6].item() == b_tail, "b keeps its own partly used page"
    assert b.cache_handle.cached_len == 6
    assert cache.size_info.protected_size == 6

    with cm.lazy_free_region():
        cm.cache_req(a, finished=True)
        cm.cache_req(b, finished=True)
    assert cache.size_info == SizeInfo(evictable_size=6, protected_size=0)
    assert cm.num_free_pages == 16 - 3
    cm.check_integrity()


# --- the integrity check ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "corruption", ["leaked page", "double free", "locked with nothing running"]
)
def test_check_integrity_catches_a_corrupted_page_ledger(corruption):
    cache = PagePrefixCache(page_size=4)
    cm = cache_manager(page_size=4, num_pages=8, prefix_cache=cache)
    req = make_req(list(range(100, 108)), row=0)
    prefill(cm, req)
    cm.cache_req(req, finished=True)  # two pages cached, six free
    cm.check_integrity()  # a consistent ledger passes
    if corruption == "leaked page":
        cm.free_slots = cm.free_slots[1:]
    elif corruption == "double free":  # as many entries as free pages, but one of them twice
        cm.free_slots[0] = cm.free_slots[1]
    else:
        cm.lock(cm.prefix_cache.match_prefix(req.input_ids).handle)
    assert_integrity_fails(cm)


def test_check_integrity_catches_a_request_that_was_never_freed():
    cm = cache_manager(page_size=1, num_pages=16)
    cm.check_integrity()
    prefill(cm, make_req(list(range(5)), row=0))  # ... and the request is forgotten
    assert_integrity_fails(cm)


# --- the prefix cache: matching, available room, eviction ------------------------------------


def test_match_stops_before_the_last_prompt_token():
    cache = PagePrefixCache(page_size=1)
    cm = cache_manager(page_size=1, num_pages=32, prefix_cache=cache)
    prompt = list(range(300, 306))
    req = make_req(prompt, row=0)
    prefill(cm, req)
    cm.cache_req(req, finished=True)  # the whole prompt is cached
    slots = cache.match_prefix(torch.tensor(prompt)).indices
    assert len(slots) == len(prompt)

    match = cm.match_req(torch.tensor(prompt, dtype=torch.int32))
    assert match.handle.cached_len == len(prompt) - 1, "the last token must still be computed"
    assert match.indices.tolist() == slots[:-1].tolist()
    longer = cm.match_req(torch.tensor(prompt + [7, 8], dtype=torch.int32))
    assert longer.handle.cached_len == len(prompt)
    assert cm.match_req(torch.tensor(prompt[:1], dtype=torch.int32)).handle.cached_len == 0


def test_available_room_counts_free_pages_and_evictable_cached_tokens():
    cache = PagePrefixCache(page_size=2)
    cm = cache_manager(page_size=2, num_pages=10, prefix_cache=cache)
    assert cm.available_size == 20
    a, b = make_req(list(range(100, 106)), row=0), make_req(list(range(200, 204)), row=1)
    cm.allocate_paged([a, b])
    assert cm.available_size == 20 - 10
    a.complete_one()
    b.complete_one()
    cm.cache_req(a, finished=True)  # 3 pages cached, evictable
    assert cm.available_size == 20 - 4, "a finished request's cached pages can be reclaimed"
    cm.lock(cache.match_prefix(a.input_ids).handle)
    assert cm.available_size == 20 - 4 - 6, "locked cached tokens are not available"
    cm.unlock(cache.match_prefix(a.input_ids).handle)
    cm.cache_req(b, finished=True)
    assert cm.available_size == 20
    cm.check_integrity()


def test_allocation_evicts_unlocked_cached_pages_when_free_pages_run_short():
    cache = PagePrefixCache(page_size=2)
    cm = cache_manager(page_size=2, num_pages=6, prefix_cache=cache)
    kept, dropped = make_req([1, 2, 3, 4], row=0), make_req([5, 6, 7, 8], row=1)
    cm.allocate_paged([kept, dropped])
    kept.complete_one()
    dropped.complete_one()
    cm.cache_req(kept, finished=True)
    cm.cache_req(dropped, finished=True)
    assert cm.num_free_pages == 2 and cache.size_info.evictable_size == 8
    kept_slots = set(cm.page_table[0, :4].tolist())
    handle = cache.match_prefix(kept.input_ids).handle
    cm.lock(handle)  # a running request uses this prefix: it must survive

    new = make_req(list(range(50, 58)), row=2)  # 8 tokens: 4 pages, only 2 free
    cm.allocate_paged([new])
    assert cache.evicted_tokens == 4, "evict exactly the pages that are missing"
    assert cm.num_free_pages == 0
    new_slots = cm.page_table[2, :8].tolist()
    assert len(set(new_slots)) == 8 and not kept_slots & set(new_slots), (
        "a locked cached page was handed out"
    )
    assert cache.match_prefix(torch.tensor([1, 2, 3, 4])).handle.cached_len == 4
    assert cache.match_prefix(torch.tensor([5, 6, 7, 8])).handle.cached_len == 0
    cm.unlock(handle)
    new.complete_one()
    cm.cache_req(new, finished=True)
    cm.check_integrity()


# --- admission control -----------------------------------------------------------------------


def pending(uid: int, prompt_len: int, max_tokens: int, first_token: int = 1000) -> PendingReq:
    ids = torch.arange(first_token, first_token + prompt_len, dtype=torch.int32)
    return PendingReq(uid, ids, SamplingParams(max_tokens=max_tokens))


def adder_for(
    cm: CacheManager, table: TableManager, reserved: int = 0, budget: int = 10_000
) -> PrefillAdder:
    return PrefillAdder(cm, table, token_budget=budget, reserved_size=reserved)


def test_admission_reserves_prompt_max_tokens_and_a_page_per_request():
    cm = cache_manager(page_size=4, num_pages=16)  # 64 slots
    table = TableManager(ROWS, cm.page_table)
    adder = adder_for(cm, table)
    first, second, third = pending(0, 20, 10), pending(1, 20, 6), pending(2, 1, 1)
    assert adder.worst_case_tokens(first, 0) == 20 + 10 + 4
    assert adder.worst_case_tokens(first, 8) == 12 + 10 + 4, "cached tokens need no room"
    # 6 tokens computed (a chunk, chapter 10) means two whole pages held: 8 slots need no room
    assert adder.worst_case_tokens(first, 6) == 20 + 10 + 4 - 8

    req = adder.try_add_one(first)
    assert req is not None
    assert (req.cached_len, req.device_len, req.max_device_len) == (0, 20, 30)
    assert req.table_idx not in table._free_rows, "an admitted request holds a table row"
    assert adder.reserved_size == 34
    assert adder.try_add_one(second) is not None
    assert adder.reserved_size == 64, "34 + 30 tokens: the pool is fully promised"
    rows_left = table.available_size
    assert adder.try_add_one(third) is None, "1 + 1 + 4 more tokens do not fit: it must wait"
    assert table.available_size == rows_left, "a request that waits takes no table row"


def test_admission_waits_when_worst_case_does_not_fit_beside_running_requests():
    cm = cache_manager(page_size=1, num_pages=40)
    table = TableManager(ROWS, cm.page_table)
    decode = DecodeManager(page_size=1)
    running = [make_req(list(range(5)), row=table.allocate(), output_len=9) for _ in range(2)]
    for req in running:
        prefill(cm, req)
    decode.filter_reqs(running)
    # each may still generate 9 - 1 tokens, plus one page of slack
    assert decode.inflight_tokens == 2 * (8 + 1)
    assert cm.available_size == 40 - 10
    waiting = pending(7, 3, 10)  # needs 3 + 10 + 1 = 14 tokens; 30 - 18 = 12 are left
    assert adder_for(cm, table, reserved=decode.inflight_tokens).try_add_one(waiting) is None
    for req in running:  # one decode step each: 28 - 16 = 12 tokens left, still too few
        req.append_host(0)
        cm.allocate_paged([req])
        req.complete_one()
    assert decode.inflight_tokens == 2 * (7 + 1)
    assert adder_for(cm, table, reserved=decode.inflight_tokens).try_add_one(waiting) is None
    decode.remove_req(running[0])  # one running request finishes and frees its pages
    table.free(running[0].table_idx)
    cm.cache_req(running[0], finished=True)
    assert adder_for(cm, table, reserved=decode.inflight_tokens).try_add_one(waiting) is not None


def test_admission_uses_the_cached_prefix_and_locks_it_only_if_admitted():
    cache = PagePrefixCache(page_size=2)
    cm = cache_manager(page_size=2, num_pages=12, prefix_cache=cache)  # 24 slots
    table = TableManager(ROWS, cm.page_table)
    donor = make_req(list(range(1000, 1010)), row=table.allocate())
    prefill(cm, donor)
    table.free(donor.table_idx)
    cm.cache_req(donor, finished=True)  # 10 tokens cached, evictable
    assert cm.available_size == 24

    # Locking the match takes its 10 tokens out of the evictable room: 14 free slots are left.
    big = pending(0, 12, 10)  # shares 10 tokens: needs 2 + 10 + 2 = 14
    req = adder_for(cm, table).try_add_one(big)
    assert req is not None and req.cached_len == 10 and req.extend_len == 2
    assert (
        cm.page_table[req.table_idx, :10].tolist()
        == cache.match_prefix(donor.input_ids).indices.tolist()
    ), "the row reads the cached K/V"
    assert cache.size_info.protected_size == 10, "an admitted request locks its prefix"
    cm.unlock(req.cache_handle)
    table.free(req.table_idx)

    too_big = pending(1, 12, 11)  # needs 15: it would have to evict its own prefix
    assert adder_for(cm, table).try_add_one(too_big) is None
    assert cache.size_info.protected_size == 0, "a request that waits holds no lock"
    cm.check_integrity()


# --- through the scheduler -------------------------------------------------------------------


def scheduler_for(model_dir: Path, **overrides) -> Scheduler:
    config = (
        dict(cache_type="naive", enable_overlap=False, device="cpu", show_progress=False)
        | overrides
    )
    return Scheduler(SchedulerConfig(str(model_dir), **config))


def run(scheduler: Scheduler, max_steps: int = MAX_STEPS) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    steps = 0
    while scheduler.has_work:
        assert steps < max_steps, "the scheduler never finished (a request is stuck)"
        for out in scheduler.step():
            tokens.setdefault(out.uid, []).append(out.token)
        steps += 1
    scheduler.cache_manager.check_integrity()
    return tokens


ADMISSION_PROMPTS = [
    "The capital of France is",
    "def add(a, b):",
    "The sun is a big",
    "Water boils at 100",
    "My favourite book is the",
]


@pytest.mark.slow  # 16 steps of SmolLM2 (30 layers): ~2 s, 25 s on a busy machine
def test_admission_with_a_64_token_pool_runs_four_short_prompts_and_queues_the_fifth(smollm2_dir):
    num_pages, max_tokens = 64, 8
    scheduler = scheduler_for(smollm2_dir, num_pages=num_pages, page_size=1, max_running_req=8)
    tokenizer = load_tokenizer(smollm2_dir)
    prompts = [tokenizer.encode(p) for p in ADMISSION_PROMPTS]
    assert all(5 <= len(ids) <= 7 for ids in prompts)
    worst = [len(ids) + max_tokens + 1 for ids in prompts]  # prompt + max_tokens + a page
    assert sum(worst[:4]) <= num_pages < sum(worst), "four fit, the fifth does not"

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    uids = [scheduler.add_request(ids, params) for ids in prompts]
    first_four, fifth = set(uids[:4]), uids[4]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    trace = []  # (running, pending) after each step
    while scheduler.has_work:
        assert len(trace) < MAX_STEPS
        for out in scheduler.step():
            tokens[out.uid].append(out.token)
        running = set(scheduler.decode_manager.running_reqs)
        waiting = [p.uid for p in scheduler.prefill_manager.pending_list]
        trace.append((running, waiting))
        assert scheduler.cache_manager.num_free_pages > 0, f"pool exhausted at step {len(trace)}"
        if fifth in running:
            assert not running & first_four, "the fifth ran beside the first four"
    steps = scheduler.stats.steps
    assert steps[0] == ("prefill", 4, sum(len(ids) for ids in prompts[:4])), (
        "the first four are admitted together in the first prefill"
    )
    assert trace[0] == (first_four, [fifth])
    fifth_prefill = next(i for i, (phase, _, _) in enumerate(steps) if i and phase == "prefill")
    assert steps[fifth_prefill] == ("prefill", 1, len(prompts[4]))
    assert all(len(tokens[uid]) == max_tokens for uid in uids[:4])
    # 1 prefill + 7 decode steps give the first four their 8 tokens; the fifth waits till then
    assert fifth_prefill == max_tokens, "the fifth is admitted right after the others finish"
    assert all(waiting == [fifth] for _, waiting in trace[:fifth_prefill])
    assert all(len(t) == max_tokens for t in tokens.values())
    assert scheduler.cache_manager.num_free_pages == num_pages
    scheduler.cache_manager.check_integrity()


def test_a_request_whose_worst_case_fills_the_whole_pool_slack_page_included_runs():
    """prompt + max_tokens + one page of slack == every slot of the pool: the request fits
    (the check is <=, not <), so it is admitted and runs to the end; with a strict check it
    would wait forever for room that can never appear."""
    page_size, num_pages = 4, 8  # 32 slots
    scheduler = scheduler_for(QWEN3, page_size=page_size, num_pages=num_pages, max_running_req=2)
    ids = load_tokenizer(QWEN3).encode(ADMISSION_PROMPTS[0])
    max_tokens = page_size * num_pages - page_size - len(ids)
    uid = scheduler.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    tokens = []
    while scheduler.has_work:
        assert len(tokens) < MAX_STEPS, "the scheduler never finished"
        tokens += [out.token for out in scheduler.step() if out.uid == uid]
        assert scheduler.stats.prefill_steps == 1, (
            "a request whose worst case fills the pool exactly must be admitted at once"
        )
    assert tokens == hf_greedy_cached(QWEN3, ids, max_tokens)
    scheduler.cache_manager.check_integrity()


def test_scheduler_shares_and_evicts_prefixes_through_any_prefix_cache():
    """The scheduler with PagePrefixCache plugged in: prompts sharing a prefix reuse its K/V,
    two of them prefilled at once free their duplicates, a small pool forces evictions, and
    every output still equals transformers'."""
    page_size, num_pages = 2, 30
    scheduler = scheduler_for(QWEN3, page_size=page_size, num_pages=num_pages, max_running_req=4)
    cache = PagePrefixCache(page_size)
    scheduler.cache_manager.prefix_cache = cache
    tokenizer = load_tokenizer(QWEN3)
    base = tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    rounds = [
        [base + tokenizer.encode(" a fisherman"), base + tokenizer.encode(" two cats")],
        [base + tokenizer.encode(" a fisherman who"), base],
        [tokenizer.encode(f"Completely different prompt number {i} about") for i in range(3)],
    ]
    computed_before = 0
    for prompts in rounds:
        uids = [
            scheduler.add_request(ids, SamplingParams(max_tokens=6, ignore_eos=True))
            for ids in prompts
        ]
        tokens = run(scheduler)
        for uid, ids in zip(uids, prompts):
            assert tokens[uid] == hf_greedy_cached(QWEN3, ids, 6)
        assert (
            scheduler.cache_manager.num_free_pages * page_size + cache.size_info.total_size
            == num_pages * page_size
        )
        if prompts is rounds[1]:  # both start with `base`, whose whole pages are cached
            computed = scheduler.stats.computed_prompt_tokens - computed_before
            reused = (len(base) - 1) // page_size * page_size
            assert computed <= sum(len(ids) - reused for ids in prompts), (
                "the second round must reuse the cached prefix"
            )
        computed_before = scheduler.stats.computed_prompt_tokens
    assert cache.evicted_tokens > 0, "the third round does not fit without eviction"


def test_a_request_may_grow_to_max_seq_len_when_the_page_size_does_not_divide_it():
    max_seq_len, page_size = 100, 16
    scheduler = scheduler_for(QWEN3, page_size=page_size, num_pages=16, max_seq_len=max_seq_len)
    ids = load_tokenizer(QWEN3).encode(" ".join(["bread"] * 120))[:90]
    uid = scheduler.add_request(ids, SamplingParams(max_tokens=10, ignore_eos=True))  # 100
    tokens = run(scheduler)
    assert tokens[uid] == hf_greedy_cached(QWEN3, ids, 10)


def test_check_integrity_catches_a_free_list_entry_that_is_not_a_page_start():
    cm = cache_manager(page_size=4, num_pages=8)
    cm.check_integrity()
    cm.free_slots[0] += 1  # as many distinct entries as free pages, but one inside a page
    assert_integrity_fails(cm)


def test_check_integrity_also_checks_the_prefix_cache():
    """The page counts still add up, but the prefix cache's own structure is broken: a
    cached page whose preceding page is not cached."""
    cache = PagePrefixCache(page_size=4)
    cm = cache_manager(page_size=4, num_pages=8, prefix_cache=cache)
    req = make_req(list(range(100, 108)), row=0)
    prefill(cm, req)
    cm.cache_req(req, finished=True)  # pages [100..103] and [100..107] are cached
    cm.check_integrity()
    cache.pages[(1, 2, 3, 4)] = cache.pages.pop(tuple(range(100, 104)))
    assert_integrity_fails(cm)


def test_admission_waits_for_a_free_table_row():
    cm = cache_manager(page_size=1, num_pages=64)
    table = TableManager(1, cm.page_table)
    adder = adder_for(cm, table)
    assert adder.try_add_one(pending(0, 4, 4)) is not None
    reserved = adder.reserved_size
    assert adder.try_add_one(pending(1, 4, 4)) is None, "no table row is free: it must wait"
    assert adder.reserved_size == reserved, "a request that waits reserves nothing"


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated states go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): a pool of pages on a churned free list (its order
# matters: pages are taken off its head, and freed ones join its end), a prefix cache holding
# evictable and locked prefixes, requests at and around page boundaries. Results, the page
# table, the free list, the prefix cache (its pages, lock counts, evictions, and the order of
# its lock calls) and the adder's budgets must match; cache_req may free its regions in any
# order, so its free list is compared as a set. The scheduler runs a workload as a whole too.

PAGE_SIZES = st.sampled_from([1, 2, 4])
CACHED_PREFIXES = st.lists(  # (family, pages, locked): families share their first tokens
    st.tuples(st.integers(0, 2), st.integers(1, 3), st.booleans()), max_size=4
)


class RecordingPageCache(PagePrefixCache):
    """PagePrefixCache that also lists its lock and unlock calls, in order (a public field,
    so the comparison sees it)."""

    def __init__(self, page_size: int) -> None:
        super().__init__(page_size)
        self.lock_calls: list[str] = []

    def lock_handle(self, handle: BaseCacheHandle, unlock: bool = False) -> None:
        self.lock_calls.append(f"{'unlock' if unlock else 'lock'} {handle.cached_len} tokens")
        super().lock_handle(handle, unlock)


def family_ids(family: int, length: int) -> torch.Tensor:
    """The first `length` tokens of a family: prompts of one family share their prefixes."""
    return torch.arange(1000 * (family + 1), 1000 * (family + 1) + length, dtype=torch.int32)


def slots_of(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """Pages (by first slot) -> their slots, written here so no stub builds the inputs."""
    return (pages[:, None] + torch.arange(page_size, dtype=pages.dtype)).flatten()


class Pool:
    """A cache manager in a generated state, and the pages not yet placed anywhere (taken
    from a shuffled list, so the free list ends up in churned order)."""

    def __init__(self, page_size: int, num_pages: int, seed: int) -> None:
        self.page_size = page_size
        self.cache = RecordingPageCache(page_size)
        page_table = torch.full((ROWS, ROW_LEN), -1, dtype=torch.int32)
        self.cm = CacheManager(num_pages, page_size, page_table, self.cache)
        order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.unplaced = (order * page_size).to(torch.int32)

    def take(self, pages: int) -> torch.Tensor:
        """Slots of `pages` pages not placed yet (fewer if the pool has fewer)."""
        taken, self.unplaced = self.unplaced[:pages], self.unplaced[pages:]
        return slots_of(taken, self.page_size)

    def cache_prefix(self, ids: torch.Tensor, locked: bool = False) -> None:
        """Put the whole pages of `ids` into the prefix cache (what is cached already stays)."""
        whole = len(ids) // self.page_size * self.page_size
        matched = self.cache.match_prefix(ids[:whole]).indices
        new = self.take((whole - len(matched)) // self.page_size)
        whole = len(matched) + len(new)
        self.cache.insert_prefix(ids[:whole], torch.cat([matched, new]))
        if locked:
            self.cache.lock_handle(self.cache.match_prefix(ids[:whole]).handle)

    def finish(self, free_pages: int | None = None) -> CacheManager:
        """Put the unplaced pages (or the first `free_pages` of them) on the free list; the
        rest are lost to this state, as pages held by requests that are not in it."""
        pages = self.unplaced if free_pages is None else self.unplaced[:free_pages]
        self.cm.free_slots = pages.clone()
        self.cache.lock_calls.clear()
        return self.cm


def pool_with_cached(page_size: int, num_pages: int, cached: list, seed: int) -> Pool:
    """A pool whose prefix cache holds `cached` (see CACHED_PREFIXES); nothing is free yet."""
    pool = Pool(page_size, num_pages, seed)
    for family, pages, locked in cached:
        pool.cache_prefix(family_ids(family, pages * page_size), locked)
    return pool


@given(
    page_size=PAGE_SIZES, cached=CACHED_PREFIXES, free=st.integers(0, 12), seed=st.integers(0, 99)
)
@settings(max_examples=30)
def test_available_size_matches_the_reference(page_size, cached, free, seed):
    """Free pages, evictable and locked cached prefixes, in any mix; the naive cache too."""
    assert_same_call(
        CacheManager.available_size.fget,
        build=lambda: (pool_with_cached(page_size, 24, cached, seed).finish(free),),
    )
    naive = lambda: (cache_manager(page_size, num_pages=free + 1),)  # noqa: E731
    assert_same_call(CacheManager.available_size.fget, build=naive)


@given(
    page_size=PAGE_SIZES,
    cached=CACHED_PREFIXES,
    family=st.integers(0, 3),
    length=st.integers(1, 14),
    seed=st.integers(0, 99),
)
@settings(max_examples=30)
def test_match_req_matches_the_reference(page_size, cached, family, length, seed):
    """Prompts of one token to several pages, all cached but the last token, partly cached,
    or not at all (family 3 is never cached)."""
    assert_same_call(
        CacheManager.match_req,
        build=lambda: (
            pool_with_cached(page_size, 24, cached, seed).finish(),
            family_ids(family, length),
        ),
    )


@given(
    page_size=PAGE_SIZES,
    cached=CACHED_PREFIXES,
    family=st.integers(0, 3),
    length=st.integers(1, 14),
    row=st.integers(0, ROWS - 1),
    as_int64=st.booleans(),
    seed=st.integers(0, 99),
)
@settings(max_examples=30)
def test_map_prefix_matches_the_reference(page_size, cached, family, length, row, as_int64, seed):
    """Matches of no token to several pages, their slots int32 or int64, into any row."""

    def build() -> tuple:
        pool = pool_with_cached(page_size, 24, cached, seed)
        cm = pool.finish()
        match = pool.cache.match_prefix(family_ids(family, length))
        if as_int64:
            match = MatchResult(match.handle, match.indices.long())
        return cm, row, match

    assert_same_call(CacheManager.map_prefix, build=build)


LEDGERS = st.lists(  # (cached_len, new tokens): on, before and after boundaries of any page
    st.tuples(st.integers(0, 12), st.integers(1, 9)), min_size=1, max_size=4
)


def requests_holding_pages(pool: Pool, ledgers: list[tuple[int, int]]) -> list[Req]:
    """Requests on rows 0, 1, ...: each owns the pages of its cached positions already, and its
    row is -1 from there (no slot)."""
    reqs = []
    for row, (cached, new) in enumerate(ledgers):
        owned = pool.take(-(-cached // pool.page_size))
        pool.cm.page_table[row, : len(owned)] = owned
        ids = torch.arange(100 * row, 100 * row + cached + new, dtype=torch.int32)
        reqs.append(make_req(ids.tolist(), row, cached_len=cached, output_len=4))
    return reqs


@given(
    page_size=PAGE_SIZES,
    ledgers=LEDGERS,
    cached=CACHED_PREFIXES,
    spare=st.integers(-3, 3),
    seed=st.integers(0, 99),
)
@settings(max_examples=40)
def test_allocate_paged_matches_the_reference(page_size, ledgers, cached, spare, seed):
    """Prefills and decodes whose cached_len and device_len fall on, just before and just
    after page boundaries; a free list with pages to spare, exactly enough, or short (then
    evictable cached pages are evicted, and past them it raises)."""
    num_pages = 40

    def build() -> tuple:
        pool = Pool(page_size, num_pages, seed)
        reqs = requests_holding_pages(pool, ledgers)
        for family, pages, locked in cached:
            pool.cache_prefix(family_ids(family, pages * page_size), locked)
        needed = sum(
            -(-(c + n) // page_size) - -(-c // page_size) for c, n in ledgers
        )  # the pages this batch takes
        return pool.finish(max(0, needed + spare)), reqs

    assert_same_call(CacheManager.allocate_paged, build=build)


@given(
    page_size=PAGE_SIZES,
    cached=CACHED_PREFIXES,
    free=st.integers(0, 8),
    needed=st.integers(0, 12),
    seed=st.integers(0, 99),
)
@settings(max_examples=40)
def test_allocate_and_page_to_token_match_the_reference(page_size, cached, free, needed, seed):
    """_allocate of no page to more than there are, from a free list of any length, evicting
    what is missing; _page_to_token of pages int32 or int64, none to many (slots compared by
    value: their dtype is yours to choose)."""

    def build() -> tuple:
        return pool_with_cached(page_size, 40, cached, seed).finish(free), needed

    assert_same_call(CacheManager._allocate, build=build)
    for dtype in (torch.int32, torch.int64):

        def pages() -> tuple:
            cm = build()[0]
            return cm, cm.free_slots[: min(needed, free)].to(dtype)

        assert_same_call(
            CacheManager._page_to_token,
            build=pages,
            observe=lambda slots, cm, _: {
                "slots (as int64)": slots.long(),
                "an integer tensor": not slots.is_floating_point(),
                "free_slots": cm.free_slots,
            },
        )


def freed_pages(result, cm: CacheManager, *_) -> dict:  # noqa: ANN001, ANN002
    """The free list, and the pages waiting on the lazy list (None outside a region)."""
    lazy = cm._lazy_freed
    return {
        "returned": result,
        "free_slots": cm.free_slots,
        "lazy list": None if lazy is None else [pages.long() for pages in lazy],
    }


@given(
    page_size=PAGE_SIZES,
    spans=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 9)), max_size=4),
    lazy=st.booleans(),
    seed=st.integers(0, 99),
)
@settings(max_examples=40)
def test_free_matches_the_reference(page_size, spans, lazy, seed):
    """Slices of a row that start on a page boundary and end on one, inside a page, or at once
    (nothing), outside and inside a lazy region (whose list may already hold pages)."""
    for i, (first_page, length) in enumerate(spans):

        def build() -> tuple:
            pool = Pool(page_size, 40, seed)
            row = pool.take(16)  # a request's row of 16 pages
            cm = pool.finish()
            if lazy:
                cm._lazy_freed = [row[: page_size * 2 : page_size]] if i % 2 else []
            start = first_page * page_size
            return cm, row[start : start + length]

        assert_same_call(CacheManager.free, build=build, observe=freed_pages)


def lazy_region_events(page_size: int, spans: list[tuple[int, int]], fail: bool) -> list[str]:
    """Frees of disjoint row slices (after a gap of some pages, this many slots) inside a lazy
    region whose body raises if `fail`, in words: the free list inside the region and after
    it, and what came out of it. The first page of the row is freed after the region."""
    pool = Pool(page_size, 40, seed=len(spans))
    row = pool.take(16)
    cm = pool.finish(5)
    events, next_page = [], 1
    try:
        with cm.lazy_free_region():
            for gap, length in spans:
                start = (next_page + gap) * page_size
                next_page += gap + -(-length // page_size)
                cm.free(row[start : start + length])
                events.append(f"inside: free list {cm.free_slots.tolist()}")
            if fail:
                raise KeyError("the region's body failed")
    except KeyError as error:
        events.append(f"the region raised {error}")
    except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
        events.append(f"the region raised {type(error).__name__}: {error}")
    events.append(f"after: free list {cm.free_slots.tolist()}, lazy list {cm._lazy_freed}")
    cm.free(row[:page_size])
    events.append(f"a free after the region: free list {cm.free_slots.tolist()}")
    return events


@given(
    page_size=PAGE_SIZES,
    spans=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), max_size=4),
    fail=st.booleans(),
)
@settings(max_examples=30)
def test_lazy_free_region_behaves_as_the_reference(page_size, spans, fail):
    """CacheManager.lazy_free_region (with free): no free shows inside the region, all of them
    join the free list at its end in one piece, in order, also when its body raises, and a
    free after the region goes straight to the free list again."""
    assert_same_trace(
        8, lambda: lazy_region_events(page_size, spans, fail), "free in a lazy region"
    )


def settled_pages(result, cm: CacheManager, req: Req, finished: bool) -> dict:  # noqa: ANN001
    """What cache_req settles, with the free list as a set (the regions may be freed in any
    order): the row, the prefix cache (its pages, locks and lock calls), the request."""
    return {
        "returned": result,
        "free pages (in any order)": sorted(cm.free_slots.tolist()),
        "page_table": cm.page_table,
        "prefix cache": cm.prefix_cache,
        "request": req,
    }


@given(
    page_size=PAGE_SIZES,
    old_pages=st.integers(0, 2),
    computed=st.integers(1, 10),
    others=st.integers(0, 3),
    other_locked=st.booleans(),
    cached=CACHED_PREFIXES,
    finished=st.booleans(),
    seed=st.integers(0, 99),
)
@settings(max_examples=50)
def test_cache_req_matches_the_reference(
    page_size, old_pages, computed, others, other_locked, cached, finished, seed
):
    """A request that matched `old_pages` cached pages at admission (its handle locked, its
    row pointing at them) and computed `computed` more tokens into its own pages, while another
    request of the same prompt cached `others` pages past the match meanwhile (duplicates of
    its own), finished or going on; other prefixes cached around it, locked or not."""

    def build() -> tuple:
        pool = Pool(page_size, 60, seed)
        for family, pages, locked in cached:
            pool.cache_prefix(family_ids(family + 1, pages * page_size), locked)
        old = old_pages * page_size
        cached_len = old + computed
        ids = family_ids(0, cached_len + 1)
        pool.cache_prefix(ids[:old])
        match = pool.cache.match_prefix(ids[:old])
        pool.cache.lock_handle(match.handle)
        row = 3
        pool.cm.page_table[row, :old] = match.indices
        own = pool.take(-(-cached_len // page_size) - old_pages)
        pool.cm.page_table[row, old : old + len(own)] = own
        shared = min(old_pages + others, cached_len // page_size) * page_size
        pool.cache_prefix(ids[:shared], locked=other_locked)  # the other request's copy
        req = make_req(ids.tolist(), row, cached_len=cached_len, handle=match.handle)
        return pool.finish(), req

    assert_same_call(CacheManager.cache_req, build=build, observe=settled_pages, finished=finished)


def broken_pool(page_size: int, cached: list, breakage: str, seed: int) -> CacheManager:
    """A pool with no request running, every page free or cached, then broken one way."""
    pool = pool_with_cached(page_size, 12, [(f, n, False) for f, n, _ in cached], seed)
    cm = pool.finish()
    free = cm.free_slots
    if breakage == "a locked cached prefix" and pool.cache.pages:
        pool.cache.lock_handle(pool.cache.match_prefix(family_ids(cached[0][0], page_size)).handle)
    elif breakage == "a page lost" and len(free):
        cm.free_slots = free[1:]
    elif breakage == "a page freed twice" and len(free):
        cm.free_slots = torch.cat([free, free[:1]])
    elif breakage == "a double free hiding a lost page" and len(free) > 1:
        cm.free_slots = torch.cat([free[:-1], free[:1]])
    elif breakage == "an entry inside a page" and len(free) and page_size > 1:
        cm.free_slots = free.clone()
        cm.free_slots[-1] += 1
    elif breakage == "a broken prefix cache" and pool.cache.pages:
        longest = max(pool.cache.pages, key=len)
        if len(longest) > page_size:
            pool.cache.pages[(0,) + longest[1:]] = pool.cache.pages.pop(longest)
    pool.cache.lock_calls.clear()
    return cm


BREAKAGES = [
    "nothing",
    "a locked cached prefix",
    "a page lost",
    "a page freed twice",
    "a double free hiding a lost page",
    "an entry inside a page",
    "a broken prefix cache",
]


@given(page_size=PAGE_SIZES, cached=CACHED_PREFIXES, seed=st.integers(0, 99))
@settings(max_examples=20)
def test_check_integrity_matches_the_reference(page_size, cached, seed):
    """A consistent pool, and the same pool broken each way in turn: the reference's error
    type (its own RuntimeError, or the prefix cache's), or no error."""
    for breakage in BREAKAGES:
        assert_same_call(
            CacheManager.check_integrity,
            build=lambda: (broken_pool(page_size, cached, breakage, seed),),
        )


@given(
    page_size=PAGE_SIZES,
    prompt_len=st.integers(1, 20),
    max_tokens=st.integers(1, 9),
    cached_len=st.integers(0, 20),
)
@settings(max_examples=30)
def test_worst_case_tokens_matches_the_reference(page_size, prompt_len, max_tokens, cached_len):
    """Nothing held, a cached prefix or computed chunks ending on, before and after a page
    boundary, up to the whole prompt."""
    cm = cache_manager(page_size, num_pages=8)
    adder = adder_for(cm, TableManager(ROWS, cm.page_table))
    assert_same_call(
        PrefillAdder.worst_case_tokens,
        adder,
        pending(0, prompt_len, max_tokens),
        min(cached_len, prompt_len),
    )


def uncovered_room(pool: Pool, ids: torch.Tensor, prompt_len: int, max_tokens: int) -> int:
    """available_size once the request's match is locked, less its worst case: the largest
    reserved_size at which it still fits (computed here from the test's own cache)."""
    match = pool.cache.match_prefix(ids[: len(ids) - 1])
    newly_locked = sum(pool.page_size for key in match.handle.keys if pool.cache.pages[key][1] == 0)
    page = pool.page_size
    room = len(pool.cm.free_slots) * page + pool.cache.size_info.evictable_size - newly_locked
    held = -(-match.handle.cached_len // page) * page
    return room - (prompt_len + max_tokens + page - held)


@given(
    page_size=PAGE_SIZES,
    cached=CACHED_PREFIXES,
    family=st.integers(0, 3),
    prompt_len=st.integers(1, 14),
    max_tokens=st.integers(1, 8),
    chunk=st.one_of(st.none(), st.integers(1, 13)),
    slack=st.integers(-2, 2),
    budget=st.sampled_from([0, 1, 3, 8, 100]),
    free_rows=st.integers(0, 2),
    seed=st.integers(0, 99),
)
@settings(max_examples=60)
def test_try_add_one_matches_the_reference(
    page_size, cached, family, prompt_len, max_tokens, chunk, slack, budget, free_rows, seed
):
    """A first admission (a prompt with a cached prefix, or none) or a later chunk, with its
    worst case fitting with room to spare, exactly, or one token short; a token budget spent,
    short of the prompt or ample; no free table row, or some."""

    def build() -> tuple:
        pool = pool_with_cached(page_size, 30, cached, seed)
        ids = family_ids(family, prompt_len)
        table = TableManager(ROWS, pool.cm.page_table)
        for _ in range(ROWS - free_rows):
            table.allocate()
        pending_req = PendingReq(7, ids, SamplingParams(max_tokens=max_tokens))
        cm = pool.finish()
        if chunk is not None and chunk < prompt_len:  # a request whose first chunks ran
            pending_req.chunked_req = ChunkedReq(
                ids[:chunk],
                0,
                chunk - 1,
                max_tokens,
                7,
                pending_req.sampling_params,
                cache_handle=BaseCacheHandle(0),
            )
            # where ChunkedReq.complete_one (chapter 10, still a stub here) leaves a chunk
            pending_req.chunked_req.cached_len = chunk
            held = -(-chunk // page_size) * page_size
            room = cm.available_size - (prompt_len + max_tokens + page_size - held)
        else:
            room = uncovered_room(pool, ids, prompt_len, max_tokens)
        adder = PrefillAdder(cm, table, token_budget=budget, reserved_size=max(0, room + slack))
        return adder, pending_req

    assert_same_call(PrefillAdder.try_add_one, build=build)


@given(
    page_size=PAGE_SIZES,
    running=st.lists(
        st.tuples(st.integers(1, 12), st.integers(0, 8), st.integers(1, 8)), max_size=5
    ),
)
@settings(max_examples=30)
def test_inflight_tokens_matches_the_reference(page_size, running):
    """No request running, and requests with tokens left to generate, or none."""

    def build() -> tuple:
        decode = DecodeManager(page_size)
        for uid, (prompt_len, generated, max_tokens) in enumerate(running):
            req = make_req(list(range(prompt_len)), uid, output_len=max_tokens)
            for _ in range(min(generated, max_tokens)):
                req.complete_one()
            decode.running_reqs[uid] = req
        return (decode,)

    assert_same_call(DecodeManager.inflight_tokens.fget, build=build)


def test_the_scheduler_runs_a_workload_as_the_reference_does():
    """Every chapter 8 stub through the scheduler, with a prefix cache that shares and evicts
    (PagePrefixCache) in a pool that fits one request at a time: prompts sharing a prefix or
    repeated, their pages allocated, cached, shared, freed and evicted; the same batches, KV
    slots, tokens and free pages step by step as with the reference's code."""
    p0, p1, p2, p3 = shared_prefix_prompts(0)[:4]  # p0 and p3 share their first 20 tokens
    prompts = [p0[:24], p1[:12], p3[:24], p0[:24], p2[:10]]
    params = SamplingParams(max_tokens=3, ignore_eos=True)

    def run() -> list[str]:
        scheduler = scheduler_for(QWEN3, page_size=2, num_pages=20, max_running_req=2)
        scheduler.cache_manager.prefix_cache = PagePrefixCache(page_size=2)
        return scheduler_trace(scheduler, [(ids, params) for ids in prompts])

    assert_same_trace(8, run, "a workload with a prefix cache")
