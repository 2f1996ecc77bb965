"""Chapter 4 tests: the KV pool, the naive prefix cache and the table manager.

What the student writes here is bookkeeping, so every expected value is derived in the test from
the inputs it built (random K/V, random slot permutations, request ledgers): the pool must put
each token's K/V exactly at its slot in exactly one layer, and the table manager must turn
ledgers into the positions, token ids and KV slots a forward reads. Slots are always scattered
over the pool (a random permutation), never contiguous, because that is what paging produces.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_trace
from course.differential import assert_same_call
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVCache, MatchResult, NaivePrefixCache
from minisgl.scheduler.table import TableManager

NUM_LAYERS, NUM_SLOTS, KV_HEADS, HEAD_DIM = 3, 64, 2, 8
MAX_SEQ_LEN = 32  # columns of the page table in the table-manager tests
CPU = torch.device("cpu")


def make_pool() -> MHAKVCache:
    return MHAKVCache(NUM_SLOTS, NUM_LAYERS, KV_HEADS, HEAD_DIM, torch.float32, CPU)


def scattered_slots(n: int, seed: int, num_slots: int = NUM_SLOTS) -> torch.Tensor:
    """n distinct slots in random order: what a paged allocator hands out after some churn."""
    return torch.randperm(num_slots, generator=torch.Generator().manual_seed(seed))[:n]


def all_layers(pool: MHAKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's keys and values, stacked: [layers, slots, kv_heads, head_dim] each."""
    keys = torch.stack([pool.k_cache(layer).clone() for layer in range(NUM_LAYERS)])
    values = torch.stack([pool.v_cache(layer).clone() for layer in range(NUM_LAYERS)])
    return keys, values


def make_req(ids: list[int], table_idx: int, cached_len: int, uid: int = 0) -> Req:
    return Req(
        torch.tensor(ids, dtype=torch.int32),
        table_idx,
        cached_len=cached_len,
        output_len=4,
        uid=uid,
        sampling_params=SamplingParams(),
    )


# --- the KV pool -----------------------------------------------------------------------------


def test_kv_pool_gives_one_slots_by_heads_by_dim_view_per_layer():
    pool = make_pool()
    for layer in range(NUM_LAYERS):
        for view in (pool.k_cache(layer), pool.v_cache(layer)):
            assert view.shape == (NUM_SLOTS, KV_HEADS, HEAD_DIM)
            assert view.dtype == torch.float32
    # Different layers, and K versus V, must not share storage.
    pool.store_kv(
        torch.ones(1, KV_HEADS, HEAD_DIM),
        2 * torch.ones(1, KV_HEADS, HEAD_DIM),
        torch.tensor([3]),
        1,
    )
    keys, values = all_layers(pool)
    assert keys[1, 3].eq(1).all() and values[1, 3].eq(2).all()
    assert keys.count_nonzero() == KV_HEADS * HEAD_DIM, "one token of one layer was written"
    assert values.count_nonzero() == KV_HEADS * HEAD_DIM


def test_store_kv_puts_each_token_at_its_out_loc_slot_of_that_layer_and_nowhere_else():
    pool = make_pool()
    torch.manual_seed(0)
    out_loc = scattered_slots(7, seed=1)
    k, v = torch.randn(7, KV_HEADS, HEAD_DIM), torch.randn(7, KV_HEADS, HEAD_DIM)
    pool.store_kv(k, v, out_loc, layer_id=2)

    expected_k = torch.zeros(NUM_LAYERS, NUM_SLOTS, KV_HEADS, HEAD_DIM)
    expected_v = torch.zeros_like(expected_k)
    expected_k[2, out_loc], expected_v[2, out_loc] = k, v
    keys, values = all_layers(pool)
    torch.testing.assert_close(keys, expected_k, atol=0, rtol=0)
    torch.testing.assert_close(values, expected_v, atol=0, rtol=0)


def test_store_kv_keeps_earlier_tokens_and_overwrites_a_reused_slot():
    pool = make_pool()
    torch.manual_seed(0)
    first, second = scattered_slots(10, seed=2).split([6, 4])
    k1, v1 = torch.randn(6, KV_HEADS, HEAD_DIM), torch.randn(6, KV_HEADS, HEAD_DIM)
    k2, v2 = torch.randn(4, KV_HEADS, HEAD_DIM), torch.randn(4, KV_HEADS, HEAD_DIM)
    pool.store_kv(k1, v1, first, 0)
    pool.store_kv(k2, v2, second, 0)  # a later step: the earlier tokens must survive
    torch.testing.assert_close(pool.k_cache(0)[first], k1, atol=0, rtol=0)
    torch.testing.assert_close(pool.v_cache(0)[first], v1, atol=0, rtol=0)
    torch.testing.assert_close(pool.k_cache(0)[second], k2, atol=0, rtol=0)
    torch.testing.assert_close(pool.v_cache(0)[second], v2, atol=0, rtol=0)
    # A freed slot handed to another request is simply overwritten.
    k3, v3 = torch.randn(1, KV_HEADS, HEAD_DIM), torch.randn(1, KV_HEADS, HEAD_DIM)
    pool.store_kv(k3, v3, first[:1], 0)
    torch.testing.assert_close(pool.k_cache(0)[first[0]], k3[0], atol=0, rtol=0)
    torch.testing.assert_close(pool.v_cache(0)[first[0]], v3[0], atol=0, rtol=0)
    torch.testing.assert_close(pool.k_cache(0)[first[1:]], k1[1:], atol=0, rtol=0)


# --- the naive prefix cache ------------------------------------------------------------------


def test_naive_cache_never_matches_and_holds_nothing_even_after_insert():
    cache = NaivePrefixCache(CPU)
    ids = torch.tensor([5, 6, 7, 8, 9], dtype=torch.int32)
    for _ in range(2):  # before and after inserting the very same sequence
        match = cache.match_prefix(ids)
        assert match.handle.cached_len == 0
        assert match.indices.numel() == 0
        assert match.indices.dtype in (torch.int32, torch.int64), "indices are KV slots"
        already_cached, handle = cache.insert_prefix(ids, scattered_slots(len(ids), seed=3))
        assert already_cached == 0, "nothing is ever cached, so no inserted slot is a duplicate"
        assert handle.cached_len == 0
    info = cache.size_info
    assert (info.evictable_size, info.protected_size, info.total_size) == (0, 0, 0)


def test_naive_cache_evicts_nothing_and_refuses_to_evict_any_token():
    cache = NaivePrefixCache(CPU)
    cache.insert_prefix(torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))
    assert cache.evict(0).numel() == 0
    with pytest.raises(RuntimeError) as error:
        cache.evict(1)
    assert not isinstance(error.value, NotImplementedError)


# --- the table manager -----------------------------------------------------------------------


def make_table(rows: int = 4) -> TableManager:
    return TableManager(rows, torch.zeros(rows, MAX_SEQ_LEN, dtype=torch.int32))


def test_allocate_hands_out_every_row_once_then_raises():
    table = make_table(4)
    rows = [table.allocate() for _ in range(4)]
    assert sorted(rows) == [0, 1, 2, 3]
    assert table.available_size == 0
    with pytest.raises(RuntimeError) as error:
        table.allocate()
    assert not isinstance(error.value, NotImplementedError)


def test_freed_row_is_allocated_again():
    table = make_table(3)
    rows = [table.allocate() for _ in range(3)]
    table.free(rows[1])
    assert table.available_size == 1
    assert table.allocate() == rows[1]
    table.free(rows[0])
    table.free(rows[2])
    assert table.available_size == 2
    assert sorted(table.allocate() for _ in range(2)) == sorted([rows[0], rows[2]])


def test_write_prompt_fills_only_the_request_row_up_to_device_len():
    table = make_table(4)
    short = make_req([11, 12, 13], table_idx=2, cached_len=0)
    long = make_req(list(range(100, 120)), table_idx=0, cached_len=5)
    table.write_prompt(short)
    table.write_prompt(long)
    expected = torch.zeros(4, MAX_SEQ_LEN, dtype=table.token_pool.dtype)
    expected[2, :3] = short.input_ids
    expected[0, :20] = long.input_ids  # the whole known sequence, cached part included
    assert torch.equal(table.token_pool, expected)


def mixed_batch(table: TableManager) -> tuple[Batch, dict[int, torch.Tensor]]:
    """One request extending a cached prefix plus three decode requests, on scattered slots.

    Returns the batch (inputs not yet prepared) and each request's slots by table row.
    """
    torch.manual_seed(0)
    # (sequence length, cached_len): a prefix-cache hit of 5 tokens, then three decodes.
    ledgers = [(12, 5), (7, 6), (20, 19), (2, 1)]
    all_slots = scattered_slots(sum(n for n, _ in ledgers), seed=4, num_slots=200).split(
        [n for n, _ in ledgers]
    )
    reqs, slots_by_row = [], {}
    for uid, ((seq_len, cached), slots) in enumerate(zip(ledgers, all_slots)):
        req = make_req(torch.randint(1, 1000, (seq_len,)).tolist(), table.allocate(), cached, uid)
        table.page_table[req.table_idx, :seq_len] = slots.to(torch.int32)
        table.write_prompt(req)
        slots_by_row[req.table_idx] = slots
        reqs.append(req)
    # Entries past each request's length are stale (here: invalid) and must never be read.
    for row in range(table.page_table.shape[0]):
        table.page_table[row, len(slots_by_row.get(row, [])) :] = -1
    return Batch(reqs, "prefill"), slots_by_row


def test_prepare_inputs_gathers_positions_tokens_and_slots_of_a_mixed_batch():
    table = make_table(6)
    table.allocate()  # row taken by a request outside this batch: rows are not 0, 1, 2, ...
    batch, slots_by_row = mixed_batch(table)
    table.prepare_inputs(batch)

    expected_positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in batch.reqs])
    expected_ids = torch.cat([r.input_ids[r.cached_len : r.device_len] for r in batch.reqs])
    expected_loc = torch.cat(
        [slots_by_row[r.table_idx][r.cached_len : r.device_len] for r in batch.reqs]
    )
    num_tokens = sum(r.extend_len for r in batch.reqs)
    assert num_tokens == 7 + 1 + 1 + 1
    for name, got, expected in [
        ("positions", batch.positions, expected_positions),
        ("input_ids", batch.input_ids, expected_ids),
        ("out_loc", batch.out_loc, expected_loc),
    ]:
        assert got.shape == (num_tokens,), name
        assert not got.is_floating_point(), f"{name} index tensors, so must be integers"
        assert got.tolist() == expected.tolist(), name


def test_prepare_inputs_of_a_decode_step_reads_the_token_written_by_write_next_tokens():
    table = make_table(4)
    batch, _ = mixed_batch(table)
    table.prepare_inputs(batch)
    sampled = torch.tensor([901, 902, 903, 904])
    table.write_next_tokens(batch, sampled)
    for req in batch.reqs:
        req.complete_one()  # no append_host: the device copy alone must feed the next step
    decode = Batch(batch.reqs, "decode")
    table.prepare_inputs(decode)
    assert decode.input_ids.tolist() == sampled.tolist()
    assert decode.positions.tolist() == [r.device_len - 1 for r in batch.reqs]
    assert decode.out_loc.tolist() == [
        table.page_table[r.table_idx, r.device_len - 1].item() for r in batch.reqs
    ]


def test_write_next_tokens_writes_each_token_at_its_request_device_len_only():
    table = make_table(5)
    reqs = [
        make_req(list(range(10, 10 + n)), row, cached_len=n - 1, uid=i)
        for i, (n, row) in enumerate([(3, 4), (9, 0), (6, 2)])
    ]
    for req in reqs:
        table.write_prompt(req)
    before = table.token_pool.clone()
    next_tokens = torch.tensor([71, 72, 73], dtype=torch.int64)  # the sampler returns int64
    table.write_next_tokens(Batch(reqs, "decode"), next_tokens)

    expected = before.clone()
    for req, token in zip(reqs, next_tokens.tolist()):
        expected[req.table_idx, req.device_len] = token
    assert torch.equal(table.token_pool, expected)


class PromptChunk(Req):
    """A prompt chunk as chapter 10 makes it: it only fills the KV cache and samples no token."""

    @property
    def can_decode(self) -> bool:
        return False


def test_write_next_tokens_skips_requests_that_sample_no_token():
    table = make_table(5)
    prompt = list(range(30, 40))
    table.write_prompt(make_req(prompt, table_idx=1, cached_len=0))  # the whole prompt's row
    chunk = PromptChunk(
        torch.tensor(prompt[:6], dtype=torch.int32),
        1,
        cached_len=0,
        output_len=4,
        uid=1,
        sampling_params=SamplingParams(),
    )
    # A request whose budget is used up: device_len == max_device_len, nothing reads its token.
    spent = Req(
        torch.tensor([5, 6, 7], dtype=torch.int32),
        3,
        cached_len=2,
        output_len=0,
        uid=2,
        sampling_params=SamplingParams(),
    )
    first = make_req([1, 2, 3], table_idx=0, cached_len=2, uid=0)
    last = make_req([8, 9], table_idx=4, cached_len=1, uid=3)
    for req in (first, spent, last):
        table.write_prompt(req)
    before = table.token_pool.clone()
    # The skipped requests sit mid-batch: each writer takes the token of its own batch position.
    table.write_next_tokens(
        Batch([first, chunk, spent, last], "prefill"), torch.tensor([71, 72, 73, 74])
    )

    expected = before.clone()
    expected[first.table_idx, first.device_len] = 71
    expected[last.table_idx, last.device_len] = 74
    assert torch.equal(table.token_pool, expected)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to the
# objects, and exceptions must match. Row allocation leaves the choice of row free, so
# allocate/free are compared by what every correct table manager does (a free row, never one
# in use, the right count), over random sequences of allocations and frees.

FLOAT_DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])
POOL_SHAPES = st.tuples(  # (slots, layers, kv_heads, head_dim)
    st.integers(1, 40), st.integers(1, 3), st.integers(1, 3), st.integers(1, 8)
)


def random_pool(shape: tuple[int, int, int, int], dtype: torch.dtype, seed: int) -> MHAKVCache:
    """A pool whose every slot of every layer holds distinct garbage, K and V alike."""
    slots, layers, heads, dim = shape
    pool = MHAKVCache(slots, layers, heads, dim, dtype, CPU)
    gen = torch.Generator().manual_seed(seed)
    pool._buffer.copy_(torch.randn(pool._buffer.shape, generator=gen))  # __init__ is given
    return pool


def as_slots(indices: torch.Tensor) -> dict:
    """An integer tensor whose dtype the contract leaves open (int32 or int64), by value."""
    return {
        "an integer tensor": not indices.is_floating_point(),
        "device": indices.device,
        "values (as int64)": indices.long(),
    }


@given(shape=POOL_SHAPES, dtype=FLOAT_DTYPES, layer=st.integers(0, 2), seed=st.integers(0, 99))
@settings(max_examples=30)
def test_k_cache_and_v_cache_match_the_reference(shape, dtype, layer, seed):
    """Each layer's keys and values, in every dtype: the same values, shape and dtype, and a
    view of the pool (what store_kv writes shows through it), not a copy."""
    layer %= shape[1]

    def observe(view: torch.Tensor, pool: MHAKVCache, layer_id: int) -> tuple:
        shares = view.untyped_storage().data_ptr() == pool._buffer.untyped_storage().data_ptr()
        return {"the view": view, "is a view of the pool's buffer": shares}

    for stub in (MHAKVCache.k_cache, MHAKVCache.v_cache):
        assert_same_call(
            stub, build=lambda: (random_pool(shape, dtype, seed), layer), observe=observe
        )


@given(
    shape=POOL_SHAPES,
    dtype=FLOAT_DTYPES,
    layer=st.integers(0, 2),
    tokens=st.integers(0, 40),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 99),
)
@settings(max_examples=40)
def test_store_kv_matches_the_reference(shape, dtype, layer, tokens, index_dtype, seed):
    """No new token to every slot of the pool, scattered, into any layer, in every dtype: the
    whole pool afterwards (every layer, K and V) must be the reference's, bit for bit."""
    slots, layers, heads, dim = shape
    layer, tokens = layer % layers, min(tokens, slots)

    def build() -> tuple:
        gen = torch.Generator().manual_seed(seed + 1)
        k = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
        v = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
        out_loc = torch.randperm(slots, generator=gen)[:tokens].to(index_dtype)
        return random_pool(shape, dtype, seed), k, v, out_loc, layer

    assert_same_call(
        MHAKVCache.store_kv,
        build=build,
        observe=lambda result, pool, *_: {"returned": result, "the pool's buffer": pool._buffer},
    )


def naive_observe(result, cache, *arguments) -> tuple:  # noqa: ANN001
    """A naive cache's answer, with its KV slots compared by value (int32 or int64 alike)."""
    if isinstance(result, torch.Tensor):
        return as_slots(result)
    if isinstance(result, MatchResult):
        return {"handle": result.handle, "indices": as_slots(result.indices), "inputs": arguments}
    return {"returned": result, "inputs": arguments}


@given(length=st.integers(0, 20), evict=st.integers(0, 20), seed=st.integers(0, 99))
@settings(max_examples=30)
def test_naive_cache_stubs_match_the_reference(length, evict, seed):
    """match_prefix and insert_prefix of any sequence, empty to long, before and after an
    insert; evict of nothing and of any positive number of tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 1000, (length,), generator=gen, dtype=torch.int32)
    slots = torch.randperm(64, generator=gen)[:length].to(torch.int32)
    for inserted in (False, True):

        def build() -> tuple:
            cache = NaivePrefixCache(CPU)
            if inserted:
                cache.insert_prefix(ids, slots)
            return (cache,)

        assert_same_call(
            NaivePrefixCache.match_prefix, build=lambda: (*build(), ids), observe=naive_observe
        )
        assert_same_call(NaivePrefixCache.insert_prefix, build=lambda: (*build(), ids, slots))
        for tokens in (0, evict):
            assert_same_call(
                NaivePrefixCache.evict, build=lambda: (*build(), tokens), observe=naive_observe
            )


def table_events(max_running_req: int, operations: list[int | None]) -> list[str]:
    """Allocations (None) and frees (of the i-th row in use, modulo how many are) in words, by
    what any correct table manager does: which row allocate picks is its own choice."""
    table = make_table(max_running_req)
    in_use: list[int] = []
    events = []
    for operation in operations:
        if operation is None or not in_use:
            try:
                row = table.allocate()
            except Exception as error:  # noqa: BLE001 - its type is compared with the reference's
                events.append(
                    f"allocate with {len(in_use)} rows in use raised {type(error).__name__}"
                )
                continue
            free = isinstance(row, int) and 0 <= row < max_running_req and row not in in_use
            events.append(
                "allocate gave a free row"
                if free
                else f"allocate gave {row!r} while rows {sorted(in_use)} are in use"
            )
            in_use.append(row)
        else:
            table.free(in_use.pop(operation % len(in_use)))
            events.append("freed a row in use")
        events.append(f"  available_size {table.available_size}")
    return events


@given(
    max_running_req=st.integers(1, 6),
    operations=st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=25),
)
@settings(max_examples=40)
def test_allocate_and_free_behave_as_the_reference(max_running_req, operations):
    """TableManager.allocate and free over random sequences, rows used up and reused: every
    allocation gives a row that is free, every exhausted table raises as the reference's does,
    and available_size follows."""
    assert_same_trace(
        4,
        lambda: table_events(max_running_req, [None] * max_running_req + operations),
        "allocate/free",
    )


WIDTH = 12  # columns of the generated tables: a request may fill its row exactly

REQUEST_SPECS = st.lists(  # (prompt length, cached tokens, max_tokens, a prompt chunk?)
    st.tuples(st.integers(1, WIDTH), st.integers(0, WIDTH), st.integers(0, 3), st.booleans()),
    min_size=1,
    max_size=5,
)


def generated_table(rows: int, seed: int) -> TableManager:
    """A table whose page table and token pool hold garbage everywhere (stale entries)."""
    gen = torch.Generator().manual_seed(seed)
    table = TableManager(rows, torch.randint(0, 500, (rows, WIDTH), generator=gen).int())
    table.token_pool.copy_(torch.randint(1000, 2000, (rows, WIDTH), generator=gen))
    return table


def generated_reqs(specs: list, seed: int, rows: int = 6) -> list[Req]:
    """Requests on distinct random rows: fresh prompts, cached prefixes, decodes (cached_len =
    device_len - 1), requests at max_tokens, prompt chunks that sample nothing."""
    gen = torch.Generator().manual_seed(seed)
    table_rows = torch.randperm(rows, generator=gen).tolist()
    reqs = []
    for uid, ((length, cached, max_tokens, chunk), row) in enumerate(zip(specs, table_rows)):
        max_tokens = min(max_tokens, WIDTH - length)
        ids = torch.randint(1, 1000, (length,), generator=gen, dtype=torch.int32)
        kind = PromptChunk if chunk else Req
        reqs.append(kind(ids, row, min(cached, length - 1), max_tokens, uid, SamplingParams()))
    return reqs


@given(specs=REQUEST_SPECS, seed=st.integers(0, 99))
@settings(max_examples=30)
def test_write_prompt_matches_the_reference(specs, seed):
    """Prompts from one token to a whole row, with or without a cached prefix."""
    for i in range(len(specs)):
        assert_same_call(
            TableManager.write_prompt,
            build=lambda: (generated_table(6, seed), generated_reqs(specs, seed)[i]),
        )


BATCH_INPUTS = ("positions", "input_ids", "out_loc")


def prepared_inputs(result, table: TableManager, batch: Batch) -> tuple:  # noqa: ANN001
    """The batch's three index tensors (int32 or int64 alike), and the table, untouched."""
    observed = {f"batch.{name}": as_slots(getattr(batch, name)) for name in BATCH_INPUTS}
    return observed | {
        "returned": result,
        "page_table": table.page_table,
        "token_pool": table.token_pool,
    }


@given(specs=REQUEST_SPECS, phase=st.sampled_from(["prefill", "decode"]), seed=st.integers(0, 99))
@settings(max_examples=40)
def test_prepare_inputs_matches_the_reference(specs, phase, seed):
    """Batches of one to five requests on scattered rows, each from one token to a whole row,
    over stale page-table and token-pool entries."""
    assert_same_call(
        TableManager.prepare_inputs,
        build=lambda: (generated_table(6, seed), Batch(generated_reqs(specs, seed), phase)),
        observe=prepared_inputs,
    )


@given(
    specs=REQUEST_SPECS,
    token_dtype=st.sampled_from([torch.int32, torch.int64]),
    seed=st.integers(0, 99),
)
@settings(max_examples=40)
def test_write_next_tokens_matches_the_reference(specs, token_dtype, seed):
    """Batches mixing requests that sample (one token left, or more) with prompt chunks and
    requests at max_tokens that must keep their rows, the sampled ids int32 or int64."""

    def build() -> tuple:
        reqs = generated_reqs(specs, seed)
        tokens = torch.randint(
            3000, 4000, (len(reqs),), generator=torch.Generator().manual_seed(seed)
        )
        return generated_table(6, seed), Batch(reqs, "decode"), tokens.to(token_dtype)

    assert_same_call(TableManager.write_next_tokens, build=build)
