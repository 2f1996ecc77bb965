"""Tests of problem 94: Evict from the radix cache."""

import os
from pathlib import Path


import torch

from minisgl.core import SamplingParams
from minisgl.kvcache.radix_cache import RadixPrefixCache
from minisgl.scheduler import Scheduler, SchedulerConfig
from submission import evict

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

CPU = torch.device("cpu")


def t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def example_cache() -> RadixPrefixCache:
    """[1, 2] -> {[3, 4] (slots 2, 3), [5, 6] (slots 6, 7)}; [1, 2] in slots 0, 1."""
    cache = RadixPrefixCache(CPU, page_size=1)
    cache.insert_prefix(t([1, 2, 3, 4]), t([0, 1, 2, 3]))
    cache.insert_prefix(t([1, 2, 5, 6]), t([4, 5, 6, 7]))  # 4, 5 are duplicates (not cached)
    cache.match_prefix(t([1, 2, 5, 6]))  # [5, 6] is now more recent than [3, 4]
    return cache


def check_evict(cache: RadixPrefixCache, num_tokens: int, expected_slots: list[int], what: str):
    before = cache.size_info.evictable_size
    got = evict(cache, num_tokens)
    assert isinstance(got, torch.Tensor), f"evict must return a tensor, got {type(got).__name__}"
    assert sorted(got.tolist()) == sorted(expected_slots), (
        f"{what}: evict({num_tokens}) should free slots {sorted(expected_slots)}, "
        f"got {sorted(got.tolist())}"
    )
    after = cache.size_info.evictable_size
    assert after == before - len(expected_slots), (
        f"{what}: evictable size went from {before} to {after}, expected "
        f"{before - len(expected_slots)}"
    )
    cache.check_integrity()


def run(monkeypatch, patched: bool, num_pages: int, page_size: int):
    with monkeypatch.context() as m:
        if patched:
            m.setattr(RadixPrefixCache, "evict", evict)
        sched = Scheduler(
            SchedulerConfig(
                str(MODEL),
                device="cpu",
                show_progress=False,
                cache_type="radix",
                enable_overlap=False,
                page_size=page_size,
                num_pages=num_pages,
                max_running_req=3,
                max_extend_tokens=7,
            )
        )
        evictions = []
        original = sched.cache_manager.prefix_cache.evict

        def counting(num_tokens):
            evictions.append(num_tokens)
            return original(num_tokens)

        sched.cache_manager.prefix_cache.evict = counting
        system = [(7 * j) % 3000 + 5 for j in range(14)]
        trace = [(9, 5), (6, 4), (11, 6), (3, 3), (8, 5), (13, 2), (5, 4), (4, 3)]
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
    return outputs, sched.stats.steps, sched.stats.computed_prompt_tokens, evictions


def compare(monkeypatch, num_pages: int, page_size: int):
    expected = run(monkeypatch, False, num_pages, page_size)
    got = run(monkeypatch, True, num_pages, page_size)
    what = f"{num_pages} pages of {page_size}, radix cache"
    assert any(n > 0 for n in expected[3]), "the trace should evict (grader bug)"
    assert got[2] == expected[2], (
        f"{what}: prompt tokens computed: expected {expected[2]}, got "
        f"{got[2]} (the cache kept other prefixes than LRU would)"
    )
    assert got[1] == expected[1], (
        f"{what}: batches (phase, requests, tokens) per step\n"
        f"expected {expected[1]}\ngot      {got[1]}"
    )
    assert got[0] == expected[0], (
        f"{what}: outputs (uid, token, finished) per step\n"
        f"expected {expected[0]}\ngot      {got[0]}"
    )


# --- samples ---------------------------------------------------------------------------------


def test_example_the_least_recently_used_leaf_goes_first():
    check_evict(example_cache(), 2, [2, 3], "[1, 2] -> {[3, 4] old, [5, 6] recent}")


def test_example_the_real_scheduler_with_a_small_pool(monkeypatch):
    compare(monkeypatch, num_pages=16, page_size=4)


# --- hidden ----------------------------------------------------------------------------------


def test_nothing_to_evict():
    cache = example_cache()
    got = evict(cache, 0)
    assert len(got) == 0, f"evict(0) must free nothing, got {got.tolist()}"
    assert cache.size_info.evictable_size == 6, "evict(0) changed the evictable size"


def test_a_parent_becomes_a_candidate_when_its_children_are_gone():
    cache = example_cache()
    check_evict(cache, 4, [2, 3, 6, 7], "both leaves")
    check_evict(cache, 1, [0, 1], "then their parent [1, 2] (whole: 2 tokens)")
    assert not cache.root.children, "everything was evicted, but the root still has children"


def test_all_at_once():
    check_evict(example_cache(), 6, [0, 1, 2, 3, 6, 7], "every cached token")


def raises_runtime_error(cache: RadixPrefixCache, num_tokens: int, what: str) -> None:
    try:
        evict(cache, num_tokens)
    except NotImplementedError:
        raise
    except RuntimeError:
        return
    raise AssertionError(f"{what}: evict({num_tokens}) must raise RuntimeError")


def test_more_than_evictable_raises():
    raises_runtime_error(example_cache(), 7, "6 evictable tokens")


def test_locked_nodes_stay():
    cache = example_cache()
    handle = cache.match_prefix(t([1, 2, 3, 4])).handle  # now [3, 4] is the most recent
    cache.lock_handle(handle)  # [1, 2] and [3, 4] are protected
    assert cache.size_info.evictable_size == 2
    check_evict(cache, 2, [6, 7], "[1, 2, 3, 4] locked: only [5, 6] may go")
    raises_runtime_error(cache, 1, "nothing evictable")
    cache.lock_handle(handle, unlock=True)
    check_evict(cache, 4, [0, 1, 2, 3], "unlocked again")


def test_recency_follows_matches():
    cache = example_cache()
    cache.match_prefix(t([1, 2, 3, 4]))  # touches [1, 2] and [3, 4]
    check_evict(cache, 1, [6, 7], "[3, 4] was matched last: [5, 6] is older")


def test_pages_of_2():
    cache = RadixPrefixCache(CPU, page_size=2)
    cache.insert_prefix(t([1, 2, 3, 4, 5, 6]), t([10, 11, 12, 13, 14, 15]))
    cache.insert_prefix(t([1, 2, 7, 8]), t([20, 21, 22, 23]))
    cache.insert_prefix(t([9, 9]), t([30, 31]))
    cache.match_prefix(t([1, 2, 3, 4, 5, 6]))  # [1, 2] and [3, 4, 5, 6] touched
    check_evict(cache, 3, [22, 23, 30, 31], "the two oldest leaves [7, 8] and [9, 9]")


def test_a_pool_of_pages_of_1(monkeypatch):
    compare(monkeypatch, num_pages=60, page_size=1)
