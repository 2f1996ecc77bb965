"""Tests of problem 82: Allocate the pages of a batch."""

import os
from pathlib import Path


import torch

from minisgl.core import Req, SamplingParams
from minisgl.kvcache import NaivePrefixCache
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.cache import CacheManager
from submission import allocate_paged

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

CPU = torch.device("cpu")


def manager(num_pages: int, page_size: int, rows: int = 4, cols: int = 64) -> CacheManager:
    table = torch.full((rows, cols), -1, dtype=torch.int32)
    return CacheManager(num_pages, page_size, table, NaivePrefixCache(CPU))


def ledger(row: int, cached_len: int, device_len: int) -> Req:
    return Req(
        torch.arange(device_len, dtype=torch.int32),
        table_idx=row,
        cached_len=cached_len,
        output_len=4,
        uid=row,
        sampling_params=SamplingParams(max_tokens=4),
    )


def own(cm: CacheManager, req: Req, pages: int) -> None:
    """Give `req` its first `pages` pages by hand, as an earlier forward would have."""
    taken = cm._allocate(pages)
    slots = (taken[:, None] + torch.arange(cm.page_size)).flatten()
    cm.page_table[req.table_idx, : len(slots)] = slots.to(torch.int32)


def check_new_pages(
    cm: CacheManager, req: Req, first: int, last: int, free_before: list[int], what: str
) -> list[int]:
    """Columns [first*page, last*page) hold whole free pages of slots; returns those pages."""
    p = cm.page_size
    row = cm.page_table[req.table_idx, first * p : last * p].tolist()
    pages = row[::p]
    for i, start in enumerate(pages):
        chunk = row[i * p : (i + 1) * p]
        assert chunk == list(range(start, start + p)), (
            f"{what}: columns {(first + i) * p}..{(first + i + 1) * p - 1} "
            "should hold the slots of "
            f"one page (s, s+1, ..., s+{p - 1}), got {chunk}"
        )
        assert start in free_before, (
            f"{what}: page starting at slot {start} was not on the free list {sorted(free_before)}"
        )
    return pages


def run(
    monkeypatch,
    patched: bool,
    *,
    cache_type: str,
    page_size: int,
    num_pages: int,
    max_extend_tokens: int,
):
    with monkeypatch.context() as m:
        if patched:
            m.setattr(CacheManager, "allocate_paged", allocate_paged)
        sched = Scheduler(
            SchedulerConfig(
                str(MODEL),
                device="cpu",
                show_progress=False,
                cache_type=cache_type,
                enable_overlap=False,
                page_size=page_size,
                num_pages=num_pages,
                max_running_req=3,
                max_extend_tokens=max_extend_tokens,
            )
        )
        system = [(7 * j) % 3000 + 5 for j in range(14)]
        trace = [(9, 5), (6, 4), (11, 6), (3, 3), (8, 5), (13, 2), (5, 4)]
        for i, (extra, max_tokens) in enumerate(trace):
            ids = (system if i % 2 == 0 else system[:6]) + [
                (31 * i + 13 * j) % 3000 + 5 for j in range(extra)
            ]
            sched.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        outputs = []
        while sched.has_work:
            assert len(outputs) < 300, "the scheduler never finished (a request is stuck)"
            outputs.append([(o.uid, o.token, o.finished) for o in sched.step()])
        sched.cache_manager.check_integrity()
    return outputs, sched.stats.steps, sched.stats.computed_prompt_tokens


def compare(monkeypatch, **config):
    expected = run(monkeypatch, False, **config)
    got = run(monkeypatch, True, **config)
    assert got[1] == expected[1], (
        f"{config}: batches (phase, requests, tokens) per step\n"
        f"expected {expected[1]}\ngot      {got[1]}"
    )
    assert got[0] == expected[0], (
        f"{config}: outputs (uid, token, finished) per step\n"
        f"expected {expected[0]}\ngot      {got[0]}"
    )
    assert got[2] == expected[2], (
        f"{config}: prompt tokens computed: expected {expected[2]}, got {got[2]}"
    )


# --- samples ---------------------------------------------------------------------------------


def test_example_a_forward_across_a_page_boundary():
    cm = manager(num_pages=8, page_size=4)
    req = ledger(row=1, cached_len=6, device_len=9)
    own(cm, req, 2)
    before_row = cm.page_table[1, :8].tolist()
    free_before = cm.free_slots.tolist()
    allocate_paged(cm, [req])
    assert cm.num_free_pages == len(free_before) - 1, (
        f"cached_len=6, device_len=9, page 4: expected exactly 1 new page, but the free list "
        f"went from {len(free_before)} to {cm.num_free_pages} pages"
    )
    check_new_pages(cm, req, 2, 3, free_before, "cached_len=6, device_len=9, page 4")
    assert cm.page_table[1, :8].tolist() == before_row, (
        f"columns 0..7 (owned pages) changed from {before_row} to {cm.page_table[1, :8].tolist()}"
    )


def test_example_the_real_scheduler_with_pages_of_4(monkeypatch):
    compare(monkeypatch, cache_type="naive", page_size=4, num_pages=40, max_extend_tokens=8192)


# --- hidden ----------------------------------------------------------------------------------


def test_a_prefill_takes_every_page_of_its_prompt():
    cm = manager(num_pages=8, page_size=4)
    req = ledger(row=0, cached_len=0, device_len=9)
    free_before = cm.free_slots.tolist()
    allocate_paged(cm, [req])
    assert cm.num_free_pages == 5, (
        f"9 tokens in pages of 4 need 3 pages; {8 - cm.num_free_pages} taken"
    )
    check_new_pages(cm, req, 0, 3, free_before, "cached_len=0, device_len=9, page 4")


def test_inside_an_owned_page_nothing_is_taken():
    cm = manager(num_pages=8, page_size=4)
    req = ledger(row=2, cached_len=5, device_len=7)
    own(cm, req, 2)
    row = cm.page_table[2].tolist()
    free = cm.num_free_pages
    allocate_paged(cm, [req])
    assert cm.num_free_pages == free, (
        f"cached_len=5, device_len=7 stays in page 1, which it "
        f"owns: {free - cm.num_free_pages} pages were taken"
    )
    assert cm.page_table[2].tolist() == row, "the page table changed although nothing was needed"


def test_requests_of_one_batch_get_disjoint_pages():
    cm = manager(num_pages=12, page_size=2)
    a, b, c = ledger(0, 0, 5), ledger(1, 3, 4), ledger(3, 4, 7)
    own(cm, b, 2)
    own(cm, c, 2)
    free_before = cm.free_slots.tolist()
    allocate_paged(cm, [a, b, c])
    pages = (
        check_new_pages(cm, a, 0, 3, free_before, "request a: [0, 5)")
        + check_new_pages(cm, b, 2, 2, free_before, "request b: [3, 4)")
        + check_new_pages(cm, c, 2, 4, free_before, "request c: [4, 7)")
    )
    assert len(set(pages)) == len(pages) == 5, f"new pages overlap or are missing: {pages}"
    assert cm.num_free_pages == len(free_before) - 5, (
        f"expected 5 pages taken, got {len(free_before) - cm.num_free_pages}"
    )
    assert not set(pages) & set(cm.free_slots.tolist()), "a page taken is still on the free list"


def test_page_size_1():
    cm = manager(num_pages=10, page_size=1)
    req = ledger(0, 3, 7)
    own(cm, req, 3)
    free_before = cm.free_slots.tolist()
    allocate_paged(cm, [req])
    check_new_pages(cm, req, 3, 7, free_before, "cached_len=3, device_len=7, page 1")
    assert cm.num_free_pages == 3, f"expected 4 slots taken of 7 free, {cm.num_free_pages} left"


def test_an_empty_batch_takes_nothing():
    cm = manager(num_pages=4, page_size=4)
    allocate_paged(cm, [])
    assert cm.num_free_pages == 4, "an empty batch took pages"


def test_chunks_that_end_inside_a_page_and_eviction_from_the_radix_cache(monkeypatch):
    compare(monkeypatch, cache_type="radix", page_size=4, num_pages=16, max_extend_tokens=7)


def test_radix_cache_with_pages_of_2(monkeypatch):
    compare(monkeypatch, cache_type="radix", page_size=2, num_pages=48, max_extend_tokens=8192)
