"""Chapter 9 tests: the radix prefix cache, on its own and inside the engine.

The unit tests drive RadixPrefixCache directly with made-up token ids and slots: matching
splits an edge where a prompt diverges, insert reports how much was cached already, locks move
tokens between "evictable" and "protected", eviction takes least recently used unlocked leaves,
and with page_size > 1 everything happens in whole pages. The engine tests check what the cache
is for: prompts that share a prefix compute only what is new, nothing leaks, and the output
still equals transformers' greedy `generate`. Overlap scheduling is chapter 11: it stays off.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from conftest import (
    TINY_MODELS,
    assert_same_trace,
    engine_config,
    generate as generate_idle,
    greedy,
    guarded_llm,
    hf_greedy_cached,
    llm_fixture,
    load_tokenizer,
    scheduler_trace,
    shared_prefix_prompts,
)
from hypothesis import example, given, settings, strategies as st

from course.differential import (
    assert_same_call,
    call_differences,
    describe,
    reference_function,
    use_reference_stubs,
)
from minisgl.core import SamplingParams
from minisgl.kvcache import BaseCacheHandle, MatchResult
from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixPrefixCache, RadixTreeNode
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler, SchedulerConfig

CPU = torch.device("cpu")
QWEN3 = TINY_MODELS["qwen3"]


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.int32)


def slots(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int32)


def sizes(cache: RadixPrefixCache) -> tuple[int, int]:
    info = cache.size_info
    return info.evictable_size, info.protected_size


# --- matching and inserting ------------------------------------------------------------------


def test_match_on_an_empty_cache_finds_nothing():
    cache = RadixPrefixCache(CPU)
    match = cache.match_prefix(ids(1, 2, 3))
    assert match.handle.cached_len == 0 and len(match.indices) == 0
    assert sizes(cache) == (0, 0)


def test_match_splits_the_edge_where_a_prompt_diverges():
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(10, 4))
    match = cache.match_prefix(ids(1, 2, 9))
    assert match.handle.cached_len == 2
    assert match.indices.tolist() == [10, 11]
    # the edge [1, 2, 3, 4] is now [1, 2] -> [3, 4]
    (upper,) = cache.root.children.values()
    assert upper.key.tolist() == [1, 2] and upper.value.tolist() == [10, 11]
    (lower,) = upper.children.values()
    assert lower.key.tolist() == [3, 4] and lower.value.tolist() == [12, 13]
    assert lower.parent is upper and upper.parent is cache.root
    assert match.handle.node is upper
    full = cache.match_prefix(ids(1, 2, 3, 4, 5))
    assert full.handle.cached_len == 4 and full.indices.tolist() == [10, 11, 12, 13]
    assert sizes(cache) == (4, 0), "splitting an edge neither adds nor drops tokens"
    cache.check_integrity()


def test_insert_returns_how_much_was_already_cached():
    cache = RadixPrefixCache(CPU)
    shared, handle = cache.insert_prefix(ids(1, 2, 3), slots(10, 3))
    assert (shared, handle.cached_len) == (0, 3)
    shared, handle = cache.insert_prefix(ids(1, 2, 3, 4, 5), slots(20, 5))
    assert (shared, handle.cached_len) == (3, 5), "[1, 2, 3] was there; slots 20..22 are copies"
    shared, handle = cache.insert_prefix(ids(1, 2, 7), slots(30, 3))
    assert (shared, handle.cached_len) == (2, 3)
    shared, _ = cache.insert_prefix(ids(1, 2, 3, 4, 5), slots(40, 5))
    assert shared == 5
    # the first copy of each token is the one kept
    assert cache.match_prefix(ids(1, 2, 3, 4, 5)).indices.tolist() == [10, 11, 12, 23, 24]
    assert cache.match_prefix(ids(1, 2, 7)).indices.tolist() == [10, 11, 32]
    assert sizes(cache) == (6, 0)
    cache.check_integrity()


def test_a_locked_handle_still_covers_its_whole_prefix_after_a_split():
    cache = RadixPrefixCache(CPU)
    _, handle = cache.insert_prefix(ids(5, 6, 7, 8), slots(0, 4))
    cache.lock_handle(handle)
    cache.insert_prefix(ids(5, 6, 9), slots(4, 3))  # splits [5, 6, 7, 8] under the lock
    assert sizes(cache) == (1, 4), "both halves of the split edge stay locked"
    cache.check_integrity()
    match = cache.match_prefix(ids(5, 6, 7, 8))
    assert match.handle.cached_len == handle.cached_len == 4
    cache.lock_handle(handle, unlock=True)  # the old handle unlocks all four tokens
    assert sizes(cache) == (5, 0)
    cache.check_integrity()


# --- locking ---------------------------------------------------------------------------------


def test_lock_protects_a_path_and_unlock_makes_it_evictable_again():
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(10, 4))
    cache.insert_prefix(ids(1, 2, 5), slots(20, 3))  # [1, 2] -> [3, 4] and [5]
    assert sizes(cache) == (5, 0)
    long = cache.match_prefix(ids(1, 2, 3, 4)).handle
    short = cache.match_prefix(ids(1, 2, 5)).handle
    cache.lock_handle(long)
    assert sizes(cache) == (1, 4), "the locked path [1, 2, 3, 4] is protected, [5] is not"
    cache.lock_handle(short)
    assert sizes(cache) == (0, 5)
    cache.lock_handle(long, unlock=True)
    assert sizes(cache) == (2, 3), "[1, 2] stays protected while `short` holds it"
    cache.check_integrity()
    cache.lock_handle(short, unlock=True)
    assert sizes(cache) == (5, 0)
    cache.check_integrity()


def test_locking_the_same_prefix_twice_needs_two_unlocks():
    cache = RadixPrefixCache(CPU)
    _, handle = cache.insert_prefix(ids(1, 2, 3), slots(0, 3))
    cache.lock_handle(handle)
    cache.lock_handle(handle)
    cache.lock_handle(handle, unlock=True)
    assert sizes(cache) == (0, 3)
    cache.lock_handle(handle, unlock=True)
    assert sizes(cache) == (3, 0)
    cache.check_integrity()


# --- eviction --------------------------------------------------------------------------------


def test_eviction_takes_the_least_recently_used_unlocked_leaf_first():
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 1), slots(10, 2))
    cache.insert_prefix(ids(2, 2), slots(20, 2))
    cache.insert_prefix(ids(3, 3), slots(30, 2))
    cache.match_prefix(ids(1, 1))  # [1, 1] is now the most recently used
    assert sorted(cache.evict(2).tolist()) == [20, 21]
    assert cache.match_prefix(ids(2, 2)).handle.cached_len == 0
    assert sorted(cache.evict(1).tolist()) == [30, 31], "whole leaves are evicted"
    assert sizes(cache) == (2, 0)
    assert cache.match_prefix(ids(1, 1)).handle.cached_len == 2
    cache.check_integrity()


def test_locked_nodes_are_never_evicted():
    cache = RadixPrefixCache(CPU)
    _, locked = cache.insert_prefix(ids(1, 2, 3), slots(10, 3))
    cache.insert_prefix(ids(4, 5), slots(20, 2))
    cache.match_prefix(ids(4, 5))  # the unlocked one is the most recently used: still first
    cache.lock_handle(locked)
    assert sorted(cache.evict(2).tolist()) == [20, 21]
    assert sizes(cache) == (0, 3)
    with pytest.raises(Exception) as error:  # nothing evictable is left
        cache.evict(1)
    assert not isinstance(error.value, NotImplementedError)
    assert cache.match_prefix(ids(1, 2, 3)).indices.tolist() == [10, 11, 12]
    cache.lock_handle(locked, unlock=True)
    cache.check_integrity()


def test_evicting_a_leaf_can_make_its_parent_an_evictable_leaf():
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(10, 4))
    cache.insert_prefix(ids(1, 2, 5, 6), slots(20, 4))  # [1, 2] -> [3, 4] and [5, 6]
    assert sizes(cache) == (6, 0)
    freed = cache.evict(6)
    assert sorted(freed.tolist()) == [10, 11, 12, 13, 22, 23], "both leaves, then their parent"
    assert sizes(cache) == (0, 0)
    assert not cache.root.children
    cache.check_integrity()


def test_eviction_keeps_the_parent_of_a_locked_leaf():
    cache = RadixPrefixCache(CPU)
    cache.insert_prefix(ids(1, 2, 3, 4), slots(10, 4))
    _, locked = cache.insert_prefix(ids(1, 2, 5, 6), slots(20, 4))
    cache.lock_handle(locked)
    assert sizes(cache) == (2, 4)
    assert sorted(cache.evict(2).tolist()) == [12, 13]
    assert sizes(cache) == (0, 4)
    assert cache.match_prefix(ids(1, 2, 5, 6)).indices.tolist() == [10, 11, 22, 23]
    cache.lock_handle(locked, unlock=True)
    cache.check_integrity()


# --- pages -----------------------------------------------------------------------------------


def test_with_page_size_4_only_whole_pages_are_cached_and_matched():
    cache = RadixPrefixCache(CPU, page_size=4)
    tokens = ids(*range(100, 110))  # 10 tokens: two whole pages and a tail of 2
    shared, handle = cache.insert_prefix(tokens, slots(40, 10))
    assert (shared, handle.cached_len) == (0, 8), "a 10-token insert caches 8"
    assert sizes(cache) == (8, 0)
    assert cache.match_prefix(tokens).handle.cached_len == 8
    assert cache.match_prefix(tokens[:7]).handle.cached_len == 4, "matches round down to pages"
    diverging = tokens.clone()
    diverging[6] = 1  # differs inside the second page
    match = cache.match_prefix(diverging)
    assert match.handle.cached_len == 4 and match.indices.tolist() == [40, 41, 42, 43]
    shared, handle = cache.insert_prefix(diverging, slots(60, 10))
    assert (shared, handle.cached_len) == (4, 8)
    for node in cache._nodes():
        assert len(node.key) % 4 == 0 and len(node.value) == len(node.key), (
            "every node holds whole pages"
        )
    assert sizes(cache) == (12, 0)
    freed = cache.evict(4)
    assert len(freed) == 4 and int(freed[0]) % 4 == 0, "a page is evicted whole"
    cache.check_integrity()


# --- in the engine ---------------------------------------------------------------------------


config = engine_config(cache_type="radix")


def generate(llm: LLM, prompts: list[list[int]], params) -> list[dict]:
    """LLM.generate, after which nothing may run or leak (conftest.generate), and no prefix
    stays locked."""
    outputs = generate_idle(llm, prompts, params)
    scheduler = llm.scheduler
    cached = scheduler.cache_manager.prefix_cache.size_info
    assert cached.protected_size == 0, "a finished request still locks its prefix"
    assert (
        scheduler.cache_manager.num_free_pages * scheduler.config.page_size + cached.total_size
        == scheduler.cache_manager.num_pages * scheduler.config.page_size
    )
    return outputs


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


SYSTEM_PROMPT = (
    "You are the helpful assistant of a small bakery in the old town. You answer questions "
    "about opening hours, bread, cakes, pastries and prices politely and briefly, you suggest "
    "something from the menu when a customer is unsure, and you never invent products that are "
    "not on the menu. "
)
QUESTIONS = [
    "Question: When do you open?",
    "Question: Do you sell rye bread?",
    "Question: How much is a croissant?",
    "Question: Can I order a birthday cake?",
]


@pytest.mark.slow  # SmolLM2 (30 layers; transformers' tokens committed): ~3 s on 2 cores
def test_a_shared_system_prompt_is_computed_once(smollm2_dir):
    tokenizer = load_tokenizer(smollm2_dir)
    prompts = [tokenizer.encode(SYSTEM_PROMPT + q) for q in QUESTIONS]
    system_len = len(tokenizer.encode(SYSTEM_PROMPT))
    assert system_len >= 50, "a long shared prefix"
    max_tokens = 3
    with guarded_llm(smollm2_dir, **config(max_running_req=4)) as llm:
        stats = llm.scheduler.stats
        generate(llm, prompts[:1], greedy(max_tokens))
        assert stats.computed_prompt_tokens == stats.prompt_tokens == len(prompts[0]), (
            "the first request finds nothing cached"
        )
        first_seq = prompts[0]  # its prompt (and output) are in the cache now
        total_before, computed_before = stats.prompt_tokens, stats.computed_prompt_tokens
        outputs = generate(llm, prompts[1:], greedy(max_tokens))
        total = stats.prompt_tokens - total_before
        computed = stats.computed_prompt_tokens - computed_before
    expected = sum(len(p) - common_prefix(p, first_seq) for p in prompts[1:])
    assert computed == expected, (
        f"prefill computed {computed} of {total} prompt tokens; only the {expected} tokens "
        f"after the shared system prompt are new"
    )
    assert computed < total - 2 * system_len
    for p, out in zip(prompts[1:], outputs):
        assert out["token_ids"] == hf_greedy_cached(smollm2_dir, p, max_tokens)


llms = llm_fixture(config)


@pytest.mark.parametrize("page_size", [1, 4])
def test_two_requests_with_the_same_prefix_prefilled_together_leak_nothing(page_size):
    """Neither finds the other in the cache at admission, so both compute the shared prefix;
    when the second is cached, its copy of the prefix must be freed, not leaked."""
    tokenizer = load_tokenizer(QWEN3)
    prefix = tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    prompts = [
        prefix + tokenizer.encode(" an old fisherman"),
        prefix + tokenizer.encode(" a cat"),
        prefix + tokenizer.encode(" a cat"),
    ]  # the last two are the same prompt
    llm = guarded_llm(QWEN3, **config(page_size))
    outputs = generate(llm, prompts, [greedy(4), greedy(7), greedy(2)])
    steps = llm.scheduler.stats.steps
    assert steps[0] == ("prefill", 3, sum(len(p) for p in prompts)), "prefilled at once"
    for p, out in zip(prompts, outputs):
        assert out["token_ids"] == hf_greedy_cached(QWEN3, p, len(out["token_ids"]))
    cached = llm.scheduler.cache_manager.prefix_cache.size_info.total_size
    assert cached < sum(len(p) for p in prompts[:2]), "the shared prefix is cached once"
    # the cache serves the prefix to a later request
    again = generate(llm, [prefix + tokenizer.encode(" a dog")], greedy(3))
    assert again[0]["token_ids"] == hf_greedy_cached(QWEN3, again[0]["prompt_token_ids"], 3)
    reused = llm.scheduler.stats.prompt_tokens - llm.scheduler.stats.computed_prompt_tokens
    assert reused >= (len(prefix) - 1) // page_size * page_size


MIXED = [
    "The capital of France is",
    "The capital of France is Paris, and the capital of Italy is",
    "def fibonacci(n):",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_matches_transformers_with_the_radix_cache(tiny_model_dir, page_size, llms):
    """Three rounds over one engine: cold prompts; prompts extending earlier ones (and one
    repeated exactly, fully cached); then an earlier prompt followed by its own output."""
    llm = llms(tiny_model_dir, page_size=page_size)
    tokenizer = load_tokenizer(tiny_model_dir)
    stats = llm.scheduler.stats
    first = [tokenizer.encode(p) for p in MIXED[0::2]]
    second = [tokenizer.encode(p) for p in MIXED[1::2]] + [first[2]]
    outs = generate(llm, first, [greedy(n) for n in (5, 9, 3)])
    computed_before = stats.computed_prompt_tokens
    outs += generate(llm, second, [greedy(n) for n in (6, 4, 8)])
    if page_size == 1:
        assert stats.computed_prompt_tokens - computed_before < sum(map(len, second)) // 2
    third = [first[0] + outs[0]["token_ids"]]  # the prompt and its output are cached
    outs += generate(llm, third, [greedy(5)])
    for prompt, out in zip(first + second + third, outs):
        assert out["token_ids"] == hf_greedy_cached(tiny_model_dir, prompt, len(out["token_ids"]))


def test_a_full_pool_evicts_old_prefixes_and_outputs_stay_right():
    page_size, num_pages = 4, 20  # 80 slots: a few requests' worth
    llm = guarded_llm(QWEN3, **config(page_size, num_pages=num_pages, max_running_req=4))
    cache = llm.scheduler.cache_manager.prefix_cache
    evicted: list[int] = []
    evict = cache.evict
    cache.evict = lambda num_tokens: evicted.append(num_tokens) or evict(num_tokens)
    tokenizer = load_tokenizer(QWEN3)
    for i in range(4):
        prompts = [
            tokenizer.encode(f"Story {i}: once upon a time there was a {animal} who")
            for animal in ("fox", "bear")
        ]
        outputs = generate(llm, prompts, greedy(8))
        for p, out in zip(prompts, outputs):
            assert out["token_ids"] == hf_greedy_cached(QWEN3, p, 8)
    assert sum(evicted) > 0, "old prefixes must be evicted to make room"
    assert cache.size_info.total_size <= num_pages * page_size


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code). A cache state comes from a random program of
# inserts, matches, locks, unlocks and evictions run by the reference, on prompts cut from
# three documents that share beginnings (so prompts extend, share and diverge inside edges),
# with page sizes 1, 2 and 4. After the call, the whole tree is compared: every edge's tokens
# and slots, ref counts, child keys, parent links, the sizes (size_info), and the LRU order.
# The LRU order is compared as an order, not as clock values, and only between nodes that can
# compete for eviction: that is all the contract fixes.

TOKENS = st.lists(st.integers(1, 3), max_size=14)
DOCUMENTS = [
    [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2],
    [1, 2, 3, 3, 2, 1, 1, 2, 3, 3, 2, 1, 1, 2],
    [2, 2, 1, 1, 3, 3, 2, 2, 1, 1, 3, 3, 2, 2],
]
PROMPTS = st.builds(  # the start of a document (all of it, some of it, none), then a few ids
    lambda document, cut, tail: DOCUMENTS[document][: 14 - cut] + tail,
    st.integers(0, 2),
    st.integers(0, 14),
    st.lists(st.integers(1, 3), max_size=3),
)
PAGE_SIZES = st.sampled_from([1, 2, 4])
PROGRAMS = st.lists(  # requests as the engine sees them, one after the other
    st.tuples(
        st.sampled_from(["comes and goes", "runs", "is admitted"]),
        PROMPTS,
        st.integers(0, 3),  # for how many later requests it stays (locked)
        st.integers(0, 6),  # 4 to 6: 1 to 3 tokens are evicted after it (for a newcomer)
    ),
    min_size=2,
    max_size=8,
)


@dataclass
class CacheState:
    """A cache built by the reference, and the handles running requests hold (locked)."""

    cache: RadixPrefixCache
    locked: list[RadixCacheHandle]
    next_slot: int  # the first slot no insert used yet (page-aligned)


def build_state(page_size: int, program: list[tuple[str, list[int], int, int]]) -> CacheState:
    """Run `program` on a fresh cache with the reference's stubs. A request that "runs" is
    matched and locked, then its prompt is inserted and its lock moves to the new handle (as
    CacheManager.cache_req does); one that "is admitted" only holds its match; one that "comes
    and goes" leaves its prompt in the cache, unlocked. Each stays for a few later requests."""
    cache = RadixPrefixCache(CPU, page_size)
    state = CacheState(cache, [], 0)
    running: list[tuple[int, RadixCacheHandle]] = []  # (when it finishes, its handle)
    with use_reference_stubs(9):
        for step, (kind, tokens, stays, evict) in enumerate(program):
            if kind == "comes and goes":
                cache.insert_prefix(ids(*tokens), fresh_slots(state, len(tokens)))
            else:
                handle = cache.match_prefix(ids(*tokens)).handle
                cache.lock_handle(handle)
                if kind == "runs":
                    slots = fresh_slots(state, len(tokens))
                    _, inserted = cache.insert_prefix(ids(*tokens), slots)
                    cache.lock_handle(inserted)
                    cache.lock_handle(handle, unlock=True)
                    handle = inserted
                running.append((step + 1 + stays, handle))
            for finished in [r for r in running if r[0] == step]:
                running.remove(finished)
                cache.lock_handle(finished[1], unlock=True)
            cache.evict(min(max(evict - 3, 0), cache.size_info.evictable_size))
    state.locked = [handle for _, handle in running]
    return state


def fresh_slots(state: CacheState, n: int) -> torch.Tensor:
    """n slots no earlier insert used, starting on a page boundary."""
    page = state.cache.page_size
    start = state.next_slot
    state.next_slot += -(-n // page) * page
    return slots(start, n)


class Hidden:
    """Carries the cache to the call without the framework comparing it field by field (its
    LRU clock values may differ and still be right); `observed` compares its `tree_view`."""

    def __init__(self, cache: RadixPrefixCache) -> None:
        self._cache = cache


def path_of(node: RadixTreeNode) -> list[list[int]]:
    """A node named by the keys of the edges from the root down to it."""
    path = []
    while node.parent is not None:
        path.append(node.key.tolist())
        node = node.parent
    return path[::-1]


def tree_view(cache: RadixPrefixCache) -> dict[str, Any]:
    """Everything the contract fixes about a cache: each edge's tokens and slots (tensors, so
    dtypes count), ref counts, the key it is filed under, its parent link, its place in the
    LRU order, and the sizes. The LRU order is compared where eviction can see it: between
    nodes of which neither is an ancestor of the other (only such nodes are ever leaves
    together), each node listing those of them that were used before it."""
    ancestors: dict[int, set[int]] = {}  # id(node) -> ids of its ancestors below the root
    nodes, stack = [], [(child, set()) for child in cache.root.children.values()]
    while stack:
        node, above = stack.pop()
        nodes.append(node)
        ancestors[id(node)] = above
        stack.extend((child, above | {id(node)}) for child in node.children.values())

    def used_before(node: RadixTreeNode) -> list[list[list[int]]]:
        return sorted(
            path_of(other)
            for other in nodes
            if other is not node
            and id(other) not in ancestors[id(node)]
            and id(node) not in ancestors[id(other)]
            and other.last_access < node.last_access
        )

    def view(node: RadixTreeNode, parent: RadixTreeNode | None) -> dict[str, Any]:
        return {
            "key": node.key,
            "value": node.value,
            "ref_count": node.ref_count,
            "used after": None if node is cache.root else used_before(node),
            "parent link right": node.parent is parent,
            "children": [(key, view(child, node)) for key, child in sorted(node.children.items())],
        }

    info = cache.size_info
    return {
        "tree": view(cache.root, None),
        "evictable_size": info.evictable_size,
        "protected_size": info.protected_size,
    }


def result_view(value: Any) -> Any:
    """A stub's return value with nodes named by their path (handles and matches by parts)."""
    if isinstance(value, RadixTreeNode):
        return {"node at": path_of(value)}
    if isinstance(value, MatchResult):
        return {"handle": result_view(value.handle), "indices": value.indices}
    if isinstance(value, BaseCacheHandle):
        node = getattr(value, "node", None)
        return {
            "type": type(value).__name__,
            "cached_len": value.cached_len,
            "node": result_view(node) if node is not None else None,
        }
    if isinstance(value, tuple):
        return tuple(result_view(v) for v in value)
    return value


def observed(function: Callable[..., Any], sort_result: bool) -> Callable[..., Any]:
    """`function` called on the hidden cache; returns what it returned and the cache after."""

    def call(hidden: Hidden, *args: Any) -> dict[str, Any]:
        result = function(hidden._cache, *args)
        if sort_result:  # evict: which slots are freed counts, not their order
            result = result.sort().values if isinstance(result, torch.Tensor) else result
        return {"returned": result_view(result), "cache after": tree_view(hidden._cache)}

    return call


def assert_same_cache_call(
    name: str, state: CacheState, *args: Any, sort_result: bool = False
) -> None:
    """RadixPrefixCache.<name>(cache, *args), yours against the reference's body, on equal deep
    copies of the state (a node or handle among `args` is copied with the tree it is in)."""
    yours = observed(getattr(RadixPrefixCache, name), sort_result)
    reference = observed(reference_function(RadixPrefixCache, name), sort_result)
    found = call_differences(yours, Hidden(state.cache), *args, reference=reference)
    if found:
        raise AssertionError(
            f"RadixPrefixCache.{name} (minisgl/kvcache/radix_cache.py) differs from the "
            "reference on these inputs:\n  "
            + "\n  ".join(found)
            + f"\ncache (page_size {state.cache.page_size}): {tree_view(state.cache)}"
            + f"\narguments: {', '.join(describe(result_view(a)) for a in args)}"
        )


@given(key=TOKENS | PROMPTS, tokens=PROMPTS | TOKENS, page_size=PAGE_SIZES)
@example(key=[1, 2, 3, 1, 2], tokens=[1, 2, 3, 1, 3], page_size=2)  # 4 in common: 2 pages
@example(key=[1, 2, 3], tokens=[1, 2, 3], page_size=2)  # all 3 in common: 1 page
@settings(max_examples=30)
def test_match_len_matches_the_reference(key, tokens, page_size):
    """Empty, equal, diverging at every place, one a prefix of the other, across pages."""
    assert_same_call(
        RadixPrefixCache._match_len, RadixPrefixCache(CPU, page_size), ids(*key), ids(*tokens)
    )


@given(page_size=PAGE_SIZES, program=PROGRAMS, tokens=PROMPTS)
@settings(max_examples=50)
def test_walk_matches_the_reference(page_size, program, tokens):
    assert_same_cache_call("_walk", build_state(page_size, program), ids(*tokens))


@given(
    page_size=PAGE_SIZES,
    first=PROMPTS.filter(lambda tokens: len(tokens) >= 8),
    program=PROGRAMS,
    which=st.integers(0, 40),
    where=st.integers(0, 40),
)
@settings(max_examples=30)
def test_split_matches_the_reference(page_size, first, program, which, where):
    """Any edge of two pages or more (locked or not, leaf or inner), cut at any inner page
    boundary."""
    state = build_state(page_size, [("comes and goes", first, 0, 0), *program])
    edges = [n for n in all_nodes(state.cache) if len(n.key) >= 2 * page_size]
    if not edges:  # the program evicted them all: a new branch (token 4 is nowhere else)
        state = build_state(page_size, [*program, ("comes and goes", [4, *first], 0, 0)])
        edges = [n for n in all_nodes(state.cache) if len(n.key) >= 2 * page_size]
    node = edges[which % len(edges)]
    pages = len(node.key) // page_size
    at = (1 + where % (pages - 1)) * page_size
    assert_same_cache_call("_split", state, node, at)


def all_nodes(cache: RadixPrefixCache) -> list[RadixTreeNode]:
    nodes, stack = [], [*cache.root.children.values()]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


@given(page_size=PAGE_SIZES, program=PROGRAMS, tokens=PROMPTS)
@settings(max_examples=40)
def test_match_prefix_matches_the_reference(page_size, program, tokens):
    assert_same_cache_call("match_prefix", build_state(page_size, program), ids(*tokens))


@given(page_size=PAGE_SIZES, program=PROGRAMS, tokens=PROMPTS, which=st.integers(0, 40))
@settings(max_examples=40)
def test_lock_handle_matches_the_reference(page_size, program, tokens, which):
    """Lock a fresh match (the root's handle when nothing matches), lock a locked path again,
    or unlock a locked handle: its count may drop to 0 or stay up (shared prefixes)."""
    state = build_state(page_size, program)
    choice = which % 3
    if choice == 0 or not state.locked:
        with use_reference_stubs(9):
            handle = state.cache.match_prefix(ids(*tokens)).handle
        assert_same_cache_call("lock_handle", state, handle, False)
    else:
        handle = state.locked[which % len(state.locked)]
        assert_same_cache_call("lock_handle", state, handle, choice == 2)


@given(page_size=PAGE_SIZES, program=PROGRAMS, tokens=PROMPTS)
@settings(max_examples=40)
def test_insert_prefix_matches_the_reference(page_size, program, tokens):
    """Already cached whole, in part, not at all; ending inside a page or on its boundary."""
    state = build_state(page_size, program)
    indices = fresh_slots(state, len(tokens))
    assert_same_cache_call("insert_prefix", state, ids(*tokens), indices)


@given(
    page_size=PAGE_SIZES,
    program=PROGRAMS,
    how_much=st.sampled_from(["all", "some", "too much", "nothing", "less than nothing"]),
    number=st.integers(0, 60),
)
@example(  # a running request holds [1, 2]; [3, 4] below it and a newer [2, 2] are not held
    page_size=1,
    program=[
        ("comes and goes", [1, 2, 3, 4], 0, 0),
        ("is admitted", [1, 2, 1], 3, 0),
        ("comes and goes", [2, 2], 0, 0),
    ],
    how_much="all",
    number=0,
)
@settings(max_examples=50)
def test_evict_matches_the_reference(page_size, program, how_much, number):
    """From nothing (0 or less) to everything evictable, exactly, and past it (RuntimeError),
    with leaves whose parents a running request holds. The slots are compared as a set: their
    order is not part of the contract."""
    state = build_state(page_size, program)
    evictable = state.cache.size_info.evictable_size
    num_tokens = {
        "nothing": 0,
        "less than nothing": -1,
        "some": 1 + number % max(evictable, 1),
        "all": evictable,
        "too much": evictable + 1 + number % 3,
    }[how_much]
    assert_same_cache_call("evict", state, num_tokens, sort_result=True)


EVERY_SEVENTH_ID = set(range(3, 49152, 7))  # as EOS: the tiny model samples all sorts
RADIX_WORKLOADS = [  # (seed, page size, KV pool tokens, table rows): pools that force evictions
    (0, 1, 150, 2),
    (1, 4, 128, 3),
]


def radix_requests(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Nine prompts, every third with the same 20-token prefix, then one of them again and a
    cut of another (matches that end inside an edge); some requests stop at EOS."""
    rng = random.Random(seed)
    prompts = shared_prefix_prompts(seed)
    prompts += [prompts[0], prompts[3][:25]]
    return [
        (p, SamplingParams(max_tokens=rng.randint(1, 5), ignore_eos=rng.random() < 0.5))
        for p in prompts
    ]


@pytest.mark.parametrize("seed, page_size, pool_tokens, rows", RADIX_WORKLOADS)
def test_the_radix_cache_serves_a_workload_as_the_reference_does(
    seed, page_size, pool_tokens, rows
):
    """Every stub inside the engine: the same batches (with their cached lengths, rows, input
    ids, positions and KV slots, so the same matches and the same evictions), tokens, running
    and waiting sets and free pages, step by step, as with the chapter's reference code. The
    slots evict returns are sorted on both sides: their order is not part of its contract."""
    overrides = dict(max_running_req=rows, num_pages=pool_tokens // page_size)

    def run() -> list[str]:
        built = Scheduler(SchedulerConfig(str(QWEN3), **config(page_size, **overrides)))
        built.eos_token_ids |= EVERY_SEVENTH_ID  # so that some requests stop early
        cache = built.cache_manager.prefix_cache
        evict = cache.evict  # yours, or the reference's inside use_reference_stubs
        cache.evict = lambda num_tokens: evict(num_tokens).sort().values
        return scheduler_trace(built, radix_requests(seed))

    assert_same_trace(9, run, f"radix workload {seed}")
