"""Chapter 10 tests: chunked prefill under a token budget (max_extend_tokens).

A prompt longer than the budget is prefilled in chunks: each chunk is a ChunkedReq that only
fills the KV cache and samples nothing, and between two chunks the running requests get a
decode step. The chunk sizes are read from the scheduler's step records (`stats.steps`), and
the output must not change: chunked equals unchunked equals transformers' greedy `generate`.
Overlap scheduling is chapter 11: it stays off.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from conftest import (
    TINY_MODELS,
    assert_same_trace,
    encode,
    engine_config,
    generate,
    greedy,
    guarded_llm,
    hf_greedy_cached,
    llm_fixture,
    load_tokenizer,
    random_prompts,
    run_until_idle,
    scheduler_trace,
)
from hypothesis import given, settings, strategies as st

from course.differential import assert_same_call, reference_function
from minisgl.core import Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle, NaivePrefixCache

from minisgl.kvcache.radix_cache import RadixCacheHandle, RadixPrefixCache
from minisgl.scheduler import Scheduler, SchedulerConfig, TableManager
from minisgl.scheduler.cache import CacheManager
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.utils import PendingReq
from minisgl.utils import div_ceil

CPU = torch.device("cpu")
QWEN3 = TINY_MODELS["qwen3"]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hi",
]
LONG_TEXT = (
    "The history of bread goes back at least thirty thousand years. Early people ground wild "
    "grains between stones, mixed the flour with water and baked flat cakes on hot rocks. "
    "When farming began in the Fertile Crescent, wheat and barley were planted on purpose, and "
    "bread became a daily food. The Egyptians learned to let dough rise with wild yeast, and "
    "their bakers made dozens of kinds of loaves, some sweetened with honey or dates. The "
    "Greeks and Romans built public ovens, and in Rome bakers formed a guild whose members "
    "were counted among the most important craftsmen of the city. In the Middle Ages the "
    "colour of a loaf showed the rank of the person eating it: white bread for the rich, dark "
    "rye and barley bread for everyone else. Mills driven by water and wind made flour "
    "cheaper, and towns passed laws on the weight and price of bread. The industrial age "
    "brought steel roller mills, commercial yeast and sliced bread in paper wrappers, while "
    "today small bakeries are rediscovering sourdough, whole grains and long fermentation. "
    "A good sourdough starts with a culture of flour and water that is fed every day until it "
    "bubbles. The baker mixes it with more flour, water and salt, folds the dough every half "
    "hour, and leaves it to rise slowly in a cool place, often overnight. The long rest lets "
    "bacteria produce the acids that give the bread its tangy taste and help it keep for "
    "days. Before baking, the loaf is scored with a sharp blade so that it can open in the "
    "oven, and it is baked hot, with steam for the first minutes, until the crust is deep "
    "brown and the bottom sounds hollow when tapped. Many bakers say that patience is the "
    "most important ingredient, and that no two loaves are ever exactly the same."
)


config = engine_config()


llms = llm_fixture(config)


# --- the chunk itself ------------------------------------------------------------------------


def test_a_chunk_samples_nothing_and_only_advances_cached_len():
    chunk = ChunkedReq(
        torch.arange(100, 110, dtype=torch.int32),
        table_idx=0,
        cached_len=4,
        output_len=5,
        uid=0,
        sampling_params=SamplingParams(),
    )
    assert isinstance(chunk, Req)
    assert not chunk.can_decode, "a chunk samples no token: it must not join the decode batch"
    assert chunk.extend_len == 6
    chunk.complete_one()
    assert (chunk.cached_len, chunk.device_len) == (10, 10), (
        "after its forward the chunk's tokens are cached and nothing new is known"
    )
    assert chunk.extend_len == 0


def test_the_token_budget_cuts_a_prompt_into_chunks():
    page_table = torch.zeros(4, 128, dtype=torch.int32)
    cache_manager = CacheManager(128, 1, page_table, NaivePrefixCache(CPU))
    table = TableManager(4, page_table)
    params = SamplingParams(max_tokens=4)
    short = PendingReq(0, torch.arange(3, dtype=torch.int32), params)
    long = PendingReq(1, torch.arange(100, 120, dtype=torch.int32), params)

    adder = PrefillAdder(cache_manager, table, token_budget=10, reserved_size=0)
    first = adder.try_add_one(short)
    assert type(first) is Req and first.extend_len == 3, "a prompt within budget is whole"
    assert adder.token_budget == 7
    chunk = adder.try_add_one(long)
    assert isinstance(chunk, ChunkedReq), "the rest of the budget takes a chunk"
    assert (chunk.cached_len, chunk.device_len) == (0, 7)
    assert chunk.input_ids.tolist() == list(range(100, 107))
    assert adder.token_budget == 0
    assert adder.try_add_one(PendingReq(2, torch.arange(2, dtype=torch.int32), params)) is None, (
        "an exhausted budget admits nothing more"
    )

    chunk.complete_one()  # its forward ran: the chunk's K/V are cached
    long.chunked_req = chunk  # what the prefill manager records after a chunk
    adder = PrefillAdder(cache_manager, table, token_budget=10, reserved_size=0)
    second = adder.try_add_one(long)
    assert isinstance(second, ChunkedReq) and (second.cached_len, second.device_len) == (7, 17)
    assert second.table_idx == chunk.table_idx, "every chunk of a request uses its one row"
    assert second.cache_handle is chunk.cache_handle, "and its one cache handle"
    second.complete_one()
    long.chunked_req = second
    adder = PrefillAdder(cache_manager, table, token_budget=10, reserved_size=0)
    last = adder.try_add_one(long)
    assert type(last) is Req, "the last chunk is a normal request: it samples the first token"
    assert (last.cached_len, last.device_len, last.max_device_len) == (17, 20, 24)
    assert adder.token_budget == 7


# --- through the scheduler -------------------------------------------------------------------


@pytest.mark.slow  # 300 tokens through SmolLM2 (30 layers; transformers' tokens committed): ~2 s
def test_a_300_token_prompt_is_prefilled_in_chunks_of_96(smollm2_dir):
    budget, max_tokens = 96, 3
    ids = load_tokenizer(smollm2_dir).encode(LONG_TEXT)
    assert len(ids) >= 300
    ids = ids[:300]
    with guarded_llm(smollm2_dir, **config(page_size=16, max_extend_tokens=budget)) as llm:
        (out,) = generate(llm, [ids], greedy(max_tokens))
        stats = llm.scheduler.stats
    steps = stats.steps
    chunks = [tokens for phase, _, tokens in steps if phase == "prefill"]
    assert len(chunks) == div_ceil(len(ids), budget)
    assert chunks == [96, 96, 96, len(ids) - 3 * 96]
    assert steps[len(chunks) :] == [("decode", 1, 1)] * (max_tokens - 1)
    assert stats.computed_prompt_tokens == len(ids)
    assert out["token_ids"] == hf_greedy_cached(smollm2_dir, ids, max_tokens)


def test_decode_steps_interleave_between_the_chunks_of_a_long_prompt():
    budget = 16
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(max_extend_tokens=budget)))
    short_ids, long_text = encode(QWEN3, [PROMPTS[0], LONG_TEXT])
    long_ids = long_text[:50]  # chunks of 16, 16, 16 and 2
    short = scheduler.add_request(short_ids, greedy(12))
    first = scheduler.step()  # the short request is prefilled and starts decoding
    assert [o.uid for o in first] == [short]
    long = scheduler.add_request(long_ids, greedy(3))
    steps = [first] + run_until_idle(scheduler)

    records = scheduler.stats.steps
    chunk_steps = [i for i, (phase, _, _) in enumerate(records) if phase == "prefill"][1:]
    assert [records[i][2] for i in chunk_steps] == [16, 16, 16, 2]
    for a, b in zip(chunk_steps, chunk_steps[1:]):
        assert any(records[i][0] == "decode" for i in range(a + 1, b)), (
            f"no decode step between the chunks at steps {a} and {b}: {records}"
        )
        assert short in {o.uid for i in range(a + 1, b) for o in steps[i]}, (
            "the running request must keep decoding while the long prompt is chunked"
        )
    # a chunk samples nothing: the long request's first token comes with its last chunk
    first_long = next(i for i, outs in enumerate(steps) if any(o.uid == long for o in outs))
    assert first_long == chunk_steps[-1]
    tokens: dict[int, list[int]] = {}
    for outs in steps:
        for o in outs:
            tokens.setdefault(o.uid, []).append(o.token)
    assert tokens[short] == hf_greedy_cached(QWEN3, short_ids, 12)
    assert tokens[long] == hf_greedy_cached(QWEN3, long_ids, 3)


PARITY_MAX_TOKENS = (9, 4, 12, 1, 6)


def parity_prompts(model_dir: Path) -> list[list[int]]:
    tokenizer = load_tokenizer(model_dir)
    return [tokenizer.encode(p) for p in PROMPTS] + [tokenizer.encode(LONG_TEXT)[:45]]


@pytest.fixture(scope="module")
def unchunked(llms):
    """unchunked(model_dir) -> the outputs of the parity prompts without chunking, once."""
    outputs: dict[Path, list[dict]] = {}

    def get(model_dir: Path) -> list[dict]:
        if model_dir not in outputs:
            outputs[model_dir] = generate(
                llms(model_dir), parity_prompts(model_dir), [greedy(n) for n in PARITY_MAX_TOKENS]
            )
        return outputs[model_dir]

    return get


@pytest.mark.parametrize("budget, page_size", [(7, 1), (7, 16), (32, 16)])
def test_chunked_prefill_matches_unchunked_and_transformers(
    tiny_model_dir, budget, page_size, llms, unchunked
):
    prompts = parity_prompts(tiny_model_dir)
    params = [greedy(n) for n in PARITY_MAX_TOKENS]
    llm = llms(tiny_model_dir, page_size=page_size, max_extend_tokens=budget)
    stats = llm.scheduler.stats
    start, computed = len(stats.steps), stats.computed_prompt_tokens
    chunked = generate(llm, prompts, params)
    prefills = [tokens for phase, _, tokens in stats.steps[start:] if phase == "prefill"]
    assert max(prefills) <= budget, "a prefill step went over the token budget"
    assert sum(prefills) == sum(map(len, prompts)) == stats.computed_prompt_tokens - computed, (
        "every prompt token is computed exactly once"
    )
    assert len(prefills) >= div_ceil(sum(map(len, prompts)), budget)
    for ids, a, b in zip(prompts, chunked, unchunked(tiny_model_dir)):
        assert a["token_ids"] == b["token_ids"], "chunking changed the output"
        assert a["token_ids"] == hf_greedy_cached(tiny_model_dir, ids, len(a["token_ids"]))


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunks_start_after_a_prefix_found_in_the_radix_cache(page_size):
    budget = 5
    llm = guarded_llm(QWEN3, **config(page_size, cache_type="radix", max_extend_tokens=budget))
    tokenizer = load_tokenizer(QWEN3)
    base = tokenizer.encode(PROMPTS[2])
    generate(llm, [base], greedy(2))
    longer = base + tokenizer.encode(" sold his fish at the market every morning")
    stats = llm.scheduler.stats
    start = len(stats.steps)
    (out,) = generate(llm, [longer], greedy(6))
    reused = (len(base) - 1) // page_size * page_size  # whole pages of the first prompt
    prefills = [tokens for phase, _, tokens in stats.steps[start:] if phase == "prefill"]
    assert sum(prefills) <= len(longer) - reused and max(prefills) <= budget
    assert len(prefills) == div_ceil(sum(prefills), budget)
    assert out["token_ids"] == hf_greedy_cached(QWEN3, longer, 6)


def test_a_chunk_ending_inside_a_page_does_not_stall_a_request_that_fills_the_pool():
    """40 prompt tokens + 8 output tokens + one page of slack = 64 = the whole pool, so the
    request is accepted. Chunks of 7 end inside a page of 16: the next chunk must still be
    admitted, since the rest of that page is already the request's (a reservation that counts
    it again never fits, and the scheduler spins forever)."""
    page_size, num_pages = 16, 4
    scheduler = Scheduler(
        SchedulerConfig(str(QWEN3), **config(page_size, num_pages=num_pages, max_extend_tokens=7))
    )
    ids = load_tokenizer(QWEN3).encode(LONG_TEXT)[:40]
    uid = scheduler.add_request(ids, greedy(8))
    steps = run_until_idle(scheduler, max_steps=50)
    tokens = [o.token for outs in steps for o in outs if o.uid == uid]
    assert tokens == hf_greedy_cached(QWEN3, ids, 8)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Then the scheduler runs seeded random workloads under small
# token budgets, your chunks against the chapter's reference stubs, event by event.

CHUNKS = st.tuples(  # (prompt length so far, tokens cached before this chunk, max_tokens)
    st.integers(1, 40), st.integers(0, 39), st.integers(1, 8)
)


def make_chunk(prompt_len: int, cached: int, max_tokens: int, *, ran: bool = False) -> ChunkedReq:
    """A chunk of a prompt: ids up to its end, the part before it cached; `ran`: after its
    forward (the reference's complete_one has run)."""
    chunk = ChunkedReq(
        torch.arange(100, 100 + prompt_len, dtype=torch.int32),
        table_idx=3,
        cached_len=cached % prompt_len,
        output_len=max_tokens,
        uid=7,
        sampling_params=greedy(max_tokens),
    )
    if ran:
        reference_function(ChunkedReq, "complete_one")(chunk)
    return chunk


@given(chunk=CHUNKS, ran=st.booleans())
@settings(max_examples=30)
def test_chunk_can_decode_matches_the_reference(chunk, ran):
    """Before and after its forward, at every length, cached part and max_tokens."""
    assert_same_call(ChunkedReq.can_decode.fget, make_chunk(*chunk, ran=ran))


@given(chunk=CHUNKS)
@settings(max_examples=30)
def test_chunk_complete_one_matches_the_reference(chunk):
    assert_same_call(ChunkedReq.complete_one, make_chunk(*chunk))


@given(
    prompt_len=st.integers(1, 40),
    cached=st.integers(0, 39),
    budget=st.integers(1, 50),
    budget_near_the_rest=st.sampled_from([None, -1, 0, 1]),
    max_tokens=st.integers(1, 8),
    handle=st.sampled_from(["none", "naive", "radix"]),
)
@settings(max_examples=50)
def test_add_one_req_matches_the_reference(
    prompt_len, cached, budget, budget_near_the_rest, max_tokens, handle
):
    """Budgets from one token to more than the rest of the prompt, and exactly the rest, one
    less and one more; prompts cached in part (a prefix match, or earlier chunks) or not."""
    cached_len = cached % prompt_len
    rest = prompt_len - cached_len
    if budget_near_the_rest is not None:
        budget = max(1, rest + budget_near_the_rest)

    cache_handle = {  # one handle for both sides (a radix node stamps a clock when made)
        "none": None,
        "naive": BaseCacheHandle(0),
        "radix": RadixCacheHandle(cached_len, RadixPrefixCache(CPU).root),
    }[handle]

    def build() -> tuple:
        page_table = torch.zeros(8, 128, dtype=torch.int32)
        cache_manager = CacheManager(32, 4, page_table, NaivePrefixCache(CPU))
        adder = PrefillAdder(cache_manager, TableManager(8, page_table), budget, reserved_size=9)
        ids = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
        return adder, PendingReq(5, ids, greedy(max_tokens)), cache_handle, 2, cached_len

    assert_same_call(PrefillAdder._add_one_req, build=build)


EVERY_SEVENTH_ID = set(range(3, 49152, 7))  # as EOS: the tiny model samples all sorts
CHUNKED_WORKLOADS = [  # (seed, page size, KV pool tokens, table rows, token budget, cache)
    (0, 1, 256, 3, 5, "naive"),
    (1, 4, 192, 8, 7, "radix"),
    (2, 16, 512, 2, 16, "radix"),
]


def chunked_requests(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Six prompts of 3 to 40 random ids, the first 20 of the first shared by the third and
    the fifth (a radix cache finds them), with random max_tokens; some stop at EOS."""
    rng = random.Random(seed)
    prompts = random_prompts(seed, 6, longest=40)
    prompts[2] = prompts[0][:20] + prompts[2]
    prompts[4] = prompts[0][:20] + prompts[4]
    return [
        (p, SamplingParams(max_tokens=rng.randint(1, 6), ignore_eos=rng.random() < 0.5))
        for p in prompts
    ]


@pytest.mark.parametrize("seed, page_size, pool_tokens, rows, budget, cache", CHUNKED_WORKLOADS)
def test_chunked_prefill_runs_a_workload_as_the_reference_does(
    seed, page_size, pool_tokens, rows, budget, cache
):
    """The same batches (chunks with their lengths, rows, input ids, positions and KV slots),
    tokens, running and waiting sets and free pages, step by step, as with the chapter's
    reference code."""
    overrides = dict(
        cache_type=cache,
        max_running_req=rows,
        num_pages=pool_tokens // page_size,
        max_extend_tokens=budget,
    )

    def run() -> list[str]:
        built = Scheduler(SchedulerConfig(str(QWEN3), **config(page_size, **overrides)))
        built.eos_token_ids |= EVERY_SEVENTH_ID  # so that some requests stop early
        return scheduler_trace(built, chunked_requests(seed))

    assert_same_trace(10, run, f"chunked workload {seed}")
