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

from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVCache, NaivePrefixCache
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
