"""Tests of problem 84: Admit a request (PrefillAdder.try_add_one)."""

import os
from pathlib import Path


import torch

from minisgl.core import Req, SamplingParams
from minisgl.kvcache import NaivePrefixCache
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.scheduler import Scheduler, SchedulerConfig, TableManager
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import PrefillAdder
from minisgl.scheduler.utils import PendingReq
from submission import try_add_one

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

CPU = torch.device("cpu")


def pending(uid: int, ids: list[int], max_tokens: int) -> PendingReq:
    return PendingReq(
        uid,
        torch.tensor(ids, dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )


def adder(
    num_pages: int,
    *,
    page_size: int = 1,
    rows: int = 4,
    budget: int = 1000,
    reserved: int = 0,
    radix: bool = False,
) -> PrefillAdder:
    table = torch.zeros(rows, 128, dtype=torch.int32)
    cache = RadixPrefixCache(CPU, page_size) if radix else NaivePrefixCache(CPU)
    return PrefillAdder(
        CacheManager(num_pages, page_size, table, cache),
        TableManager(rows, table),
        budget,
        reserved,
    )


def run_trace(monkeypatch, patched: bool, trace, *, waves=None, **config):
    """Run requests through a real Scheduler. `waves` splits the trace: each wave is added
    after the previous one finished. Returns (outputs, steps, computed, min free pages)."""
    with monkeypatch.context() as m:
        if patched:
            m.setattr(PrefillAdder, "try_add_one", try_add_one)
        sched = Scheduler(
            SchedulerConfig(
                str(MODEL), device="cpu", show_progress=False, enable_overlap=False, **config
            )
        )
        outputs, min_free = [], sched.cache_manager.num_free_pages
        for wave in waves or [len(trace)]:
            batch, trace = trace[:wave], trace[wave:]
            for ids, max_tokens in batch:
                sched.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            while sched.has_work:
                assert len(outputs) < 300, "the scheduler never finished (a request is stuck)"
                outputs.append([(o.uid, o.token, o.finished) for o in sched.step()])
                min_free = min(min_free, sched.cache_manager.num_free_pages)
        sched.cache_manager.check_integrity()
    return outputs, sched.stats.steps, sched.stats.computed_prompt_tokens, min_free


def compare(monkeypatch, what: str, trace, **kw):
    expected = run_trace(monkeypatch, False, trace, **kw)
    got = run_trace(monkeypatch, True, trace, **kw)
    assert got[1] == expected[1], (
        f"{what}: batches (phase, requests, tokens) per step\n"
        f"expected {expected[1]}\ngot      {got[1]}"
    )
    assert got[0] == expected[0], (
        f"{what}: outputs (uid, token, finished) per step\n"
        f"expected {expected[0]}\ngot      {got[0]}"
    )
    assert got[2] == expected[2], (
        f"{what}: prompt tokens computed: expected {expected[2]}, got {got[2]}"
    )
    return got


def ids(seed: int, n: int) -> list[int]:
    return [(37 * seed + 11 * j) % 4000 + 3 for j in range(n)]


POOL64 = [(ids(i, n), 8) for i, n in enumerate([6, 5, 7, 6, 5])]


# --- samples ---------------------------------------------------------------------------------


def test_example_a_request_that_fits_is_admitted():
    a = adder(num_pages=64)
    req = try_add_one(a, pending(0, ids(0, 6), 8))
    assert isinstance(req, Req), f"6 + 8 + 1 = 15 <= 64 slots: expected a Req, got {req!r}"
    assert a.reserved_size == 15, f"expected reserved_size 15, got {a.reserved_size}"
    assert a.table_manager.available_size == 3, "the admitted request must take a table row"


def test_example_the_64_token_pool(monkeypatch):
    outputs, steps, _, min_free = compare(
        monkeypatch,
        "64-token pool, five prompts",
        POOL64,
        cache_type="naive",
        page_size=1,
        num_pages=64,
        max_running_req=8,
    )
    assert steps[0][:2] == ("prefill", 4), f"the first four fit together: first step {steps[0]}"
    assert min_free > 0, f"free pages reached {min_free}"


# --- hidden ----------------------------------------------------------------------------------


def test_a_request_that_does_not_fit_waits_and_leaves_no_trace():
    a = adder(num_pages=64, reserved=50)
    got = try_add_one(a, pending(0, ids(0, 6), 8))
    assert got is None, f"50 reserved + 15 needed > 64: expected None, got {got!r}"
    assert a.reserved_size == 50, f"reserved_size changed to {a.reserved_size}"
    assert a.table_manager.available_size == 4, "a request that waits must not take a row"
    assert a.token_budget == 1000, f"a request that waits must not spend budget: {a.token_budget}"


def test_the_boundary_fits():
    a = adder(num_pages=64, reserved=49)
    assert try_add_one(a, pending(0, ids(0, 6), 8)) is not None, "49 + 15 == 64 must fit"


def test_no_budget_left():
    a = adder(num_pages=64, budget=0)
    got = try_add_one(a, pending(0, ids(0, 6), 8))
    assert got is None, f"token_budget 0: expected None, got {got!r}"
    assert a.table_manager.available_size == 4, "no budget: no row may be taken"


def test_no_free_row():
    a = adder(num_pages=64, rows=1)
    assert try_add_one(a, pending(0, ids(0, 3), 2)) is not None
    got = try_add_one(a, pending(1, ids(1, 3), 2))
    assert got is None, f"the only row is taken: expected None, got {got!r}"
    assert a.reserved_size == 6, f"reserved_size changed to {a.reserved_size}"


def test_the_page_of_slack_follows_the_page_size():
    a = adder(num_pages=2, page_size=16)  # 32 slots
    got = try_add_one(a, pending(0, ids(0, 10), 7))
    assert got is None, f"10 + 7 + 16 = 33 > 32: expected None, got {got!r}"
    assert try_add_one(a, pending(1, ids(1, 10), 6)) is not None, "10 + 6 + 16 = 32 must fit"


def cached_prefix(a: PrefillAdder, prefix: list[int]) -> torch.Tensor:
    """Put `prefix` into the radix cache, unlocked, as a finished request would."""
    slots = a.cache_manager._allocate(len(prefix))
    a.cache_manager.prefix_cache.insert_prefix(torch.tensor(prefix, dtype=torch.int32), slots)
    return slots


def test_a_cached_prefix_is_reused_locked_and_written_to_the_page_table():
    a = adder(num_pages=40, radix=True)
    prompt = ids(0, 12)
    slots = cached_prefix(a, prompt[:8])
    req = try_add_one(a, pending(0, prompt, 4))
    assert req is not None, "12 tokens, 8 cached: need 4 + 4 + 1 = 9 of 40: expected a Req"
    assert req.cached_len == 8, (
        f"8 prompt tokens are cached: expected cached_len 8, got {req.cached_len}"
    )
    assert a.reserved_size == 9, (
        f"need = 12 - 8 cached + 4 + 1 = 9: expected reserved 9, got {a.reserved_size}"
    )
    row = a.cache_manager.page_table[req.table_idx, :8].tolist()
    assert row == slots.tolist(), (
        f"the matched slots {slots.tolist()} must be copied into the "
        f"new row's first 8 columns; got {row}"
    )
    size = a.cache_manager.prefix_cache.size_info
    assert size.protected_size == 8, (
        f"the admitted request must hold a lock on its 8 cached "
        f"tokens: protected_size is {size.protected_size}"
    )


def test_a_cached_prefix_that_does_not_fit_is_unlocked_again():
    a = adder(num_pages=40, radix=True, reserved=30)
    prompt = ids(0, 12)
    cached_prefix(a, prompt[:8])
    got = try_add_one(a, pending(0, prompt, 4))
    # 32 free + 8 evictable = 40 available, but once locked the match is not evictable: 32
    assert got is None, f"30 reserved + 9 needed > 32 free: expected None, got {got!r}"
    size = a.cache_manager.prefix_cache.size_info
    assert size.protected_size == 0 and size.evictable_size == 8, (
        f"a request that waits must release its lock: protected {size.protected_size}, "
        f"evictable {size.evictable_size}"
    )


def test_lock_before_counting_the_room():
    a = adder(num_pages=12, radix=True)
    prompt = ids(0, 8)
    cached_prefix(a, prompt[:6])  # 6 cached (evictable), 6 free
    got = try_add_one(a, pending(0, prompt, 4))
    # need 8 - 6 + 4 + 1 = 7; available before locking 12, after locking 6
    assert got is None, (
        "the request's own 6 cached tokens cannot also be evicted to make room "
        f"for it: 7 needed > 6 free, expected None, got {got!r}"
    )


def test_shared_prefixes_with_a_radix_cache(monkeypatch):
    system = ids(99, 24)
    trace = [(system + ids(i, n), 4) for i, n in enumerate([5, 9, 3, 7])]
    _, _, computed, _ = compare(
        monkeypatch,
        "a shared 24-token system prompt",
        trace,
        waves=[1, 3],
        cache_type="radix",
        page_size=2,
        num_pages=200,
        max_running_req=8,
    )
    assert computed < sum(len(t[0]) for t in trace), "the radix cache saved nothing"


def test_eviction_chunks_and_admission_together(monkeypatch):
    system = [(7 * j) % 3000 + 5 for j in range(14)]
    trace = [
        (
            (system if i % 2 == 0 else system[:6])
            + [(31 * i + 13 * j) % 3000 + 5 for j in range(extra)],
            max_tokens,
        )
        for i, (extra, max_tokens) in enumerate(
            [(9, 5), (6, 4), (11, 6), (3, 3), (8, 5), (13, 2), (5, 4)]
        )
    ]
    compare(
        monkeypatch,
        "radix, page 4, 16 pages, chunks of 7",
        trace,
        cache_type="radix",
        page_size=4,
        num_pages=16,
        max_running_req=3,
        max_extend_tokens=7,
    )
