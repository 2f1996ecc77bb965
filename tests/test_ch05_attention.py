"""Chapter 5 tests: paged attention in plain PyTorch against a dense reference.

The reference is written here from the definition, per request, with nothing but torch:
softmax(q k^T / sqrt(d)) over the request's own keys, a query at absolute position p seeing
keys at positions <= p, and grouped-query attention by repeating each KV head for its group of
query heads. The backend must agree whatever the batch looks like: several prefills of
different lengths, a prefill on top of a cached prefix, a decode batch, any GQA ratio, and KV
slots scattered at random over a pool whose other slots (and other layers) hold garbage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from course.differential import Tolerance, assert_same_call, reference_of, use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.attention import TorchAttnBackend
from minisgl.core import Batch, Req, SamplingParams
from minisgl.kvcache import MHAKVCache

NUM_LAYERS, NUM_SLOTS, TABLE_ROWS, MAX_SEQ_LEN = 2, 256, 8, 64
# float32 on the CPU: the backend and the reference differ only in summation order.
ATOL, RTOL = 1e-5, 1e-4


def dense_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first_pos: int
) -> torch.Tensor:
    """One request. q: [n, heads, d] at positions first_pos..; keys, values: [len, kv_heads, d]
    at positions 0..len-1. Returns [n, heads, d]."""
    group = q.shape[1] // keys.shape[1]
    keys = keys.repeat_interleave(group, dim=1)  # query head h uses KV head h // group
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, keys) / math.sqrt(q.shape[-1])
    query_pos = torch.arange(first_pos, first_pos + q.shape[0])
    future = torch.arange(keys.shape[0])[None, :] > query_pos[:, None]
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, values)


@dataclass
class Scenario:
    """A batch over a pool and page table, with the full K/V and the queries of every request."""

    pool: MHAKVCache
    page_table: torch.Tensor
    batch: Batch
    keys: list[torch.Tensor]  # per request: [seq_len, kv_heads, d], every position
    values: list[torch.Tensor]
    q: torch.Tensor  # [new tokens, heads, d], the batch's queries in order
    slots: list[torch.Tensor]  # per request: KV slot of each position

    def new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V of the tokens this batch computes, in batch order."""
        k = torch.cat([k[r.cached_len :] for k, r in zip(self.keys, self.batch.reqs)])
        v = torch.cat([v[r.cached_len :] for v, r in zip(self.values, self.batch.reqs)])
        return k, v

    def reference(self) -> torch.Tensor:
        outs, start = [], 0
        for req, k, v in zip(self.batch.reqs, self.keys, self.values):
            q = self.q[start : start + req.extend_len]
            outs.append(dense_attention(q, k, v, req.cached_len))
            start += req.extend_len
        return torch.cat(outs)


def make_scenario(
    ledgers: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    phase: str,
    layer_id: int = 1,
    seed: int = 0,
    contiguous: bool = False,
) -> Scenario:
    """ledgers: (sequence length, cached_len) per request. The cached prefix's K/V are stored
    in the pool beforehand; the rest are this batch's new tokens."""
    gen = torch.Generator().manual_seed(seed)
    pool = MHAKVCache(NUM_SLOTS, NUM_LAYERS, kv_heads, head_dim, torch.float32, torch.device("cpu"))
    # Garbage everywhere, in every layer: a read of a wrong slot or layer cannot go unnoticed.
    everywhere = torch.arange(NUM_SLOTS)
    for layer in range(NUM_LAYERS):
        pool.store_kv(
            10 * torch.randn(NUM_SLOTS, kv_heads, head_dim, generator=gen),
            10 * torch.randn(NUM_SLOTS, kv_heads, head_dim, generator=gen),
            everywhere,
            layer,
        )
    page_table = torch.randint(
        0, NUM_SLOTS, (TABLE_ROWS, MAX_SEQ_LEN), generator=gen, dtype=torch.int32
    )
    lengths = [n for n, _ in ledgers]
    # Slots come from their own generator, so the same seed gives the same K/V and queries
    # whether the slots are contiguous or scattered.
    scattered = torch.randperm(NUM_SLOTS, generator=torch.Generator().manual_seed(seed + 1))
    order = torch.arange(sum(lengths)) if contiguous else scattered[: sum(lengths)]
    rows = torch.randperm(TABLE_ROWS, generator=gen)[: len(ledgers)].tolist()
    reqs, keys, values, slots = [], [], [], []
    for uid, ((seq_len, cached), row, req_slots) in enumerate(
        zip(ledgers, rows, order.split(lengths))
    ):
        ids = torch.randint(0, 1000, (seq_len,), generator=gen, dtype=torch.int32)
        reqs.append(
            Req(
                ids, row, cached_len=cached, output_len=4, uid=uid, sampling_params=SamplingParams()
            )
        )
        page_table[row, :seq_len] = req_slots.to(torch.int32)
        k = torch.randn(seq_len, kv_heads, head_dim, generator=gen)
        v = torch.randn(seq_len, kv_heads, head_dim, generator=gen)
        pool.store_kv(k[:cached], v[:cached], req_slots[:cached], layer_id)  # the cached prefix
        keys.append(k), values.append(v), slots.append(req_slots)
    batch = Batch(reqs, phase)
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.input_ids = torch.cat([r.input_ids[r.cached_len :] for r in reqs])
    batch.out_loc = torch.cat([s[r.cached_len :] for s, r in zip(slots, reqs)]).to(torch.int32)
    q = torch.randn(len(batch.positions), heads, head_dim, generator=gen)
    return Scenario(pool, page_table, batch, keys, values, q, slots)


def run_backend(s: Scenario, layer_id: int = 1) -> torch.Tensor:
    backend = TorchAttnBackend(s.pool, s.page_table)
    backend.prepare_metadata(s.batch)
    k, v = s.new_kv()
    return backend.forward(s.q, k, v, layer_id, s.batch)


GQA = [
    pytest.param(4, 2, 16, id="gqa4/2"),
    pytest.param(9, 3, 64, id="gqa9/3-smollm2"),
    pytest.param(4, 4, 16, id="mha4/4"),
    pytest.param(8, 1, 8, id="mqa8/1"),
]


@pytest.mark.parametrize("heads, kv_heads, head_dim", GQA)
def test_prefill_of_several_requests_of_different_lengths_matches_dense_causal_reference(
    heads, kv_heads, head_dim
):
    s = make_scenario([(5, 0), (17, 0), (1, 0), (9, 0)], heads, kv_heads, head_dim, "prefill")
    out = run_backend(s)
    assert out.shape == s.q.shape and out.dtype == s.q.dtype
    torch.testing.assert_close(out, s.reference(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("heads, kv_heads, head_dim", GQA[:2])
def test_prefill_on_a_cached_prefix_attends_to_the_keys_already_in_the_pool(
    heads, kv_heads, head_dim
):
    # A prefix-cache hit of 11 tokens, a fresh prompt, and a hit covering all but the last token.
    s = make_scenario([(20, 11), (6, 0), (9, 8)], heads, kv_heads, head_dim, "prefill", seed=1)
    torch.testing.assert_close(run_backend(s), s.reference(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("heads, kv_heads, head_dim", GQA)
def test_decode_batch_with_different_sequence_lengths_matches_dense_reference(
    heads, kv_heads, head_dim
):
    lengths = [2, 7, 40, 13, 3]
    s = make_scenario([(n, n - 1) for n in lengths], heads, kv_heads, head_dim, "decode", seed=2)
    out = run_backend(s)
    assert out.shape == (len(lengths), heads, head_dim)
    torch.testing.assert_close(out, s.reference(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    "phase, ledgers",
    [("prefill", [(12, 4), (7, 0), (30, 0)]), ("decode", [(12, 11), (7, 6), (30, 29)])],
)
def test_scattering_the_slots_does_not_change_the_output(phase, ledgers):
    contiguous = make_scenario(ledgers, 4, 2, 16, phase, seed=3, contiguous=True)
    scattered = make_scenario(ledgers, 4, 2, 16, phase, seed=3)
    assert not torch.equal(torch.cat(contiguous.slots), torch.cat(scattered.slots))
    torch.testing.assert_close(
        run_backend(scattered), run_backend(contiguous), atol=ATOL, rtol=RTOL
    )


def test_forward_stores_the_new_keys_and_values_at_out_loc_and_touches_nothing_else():
    s = make_scenario([(10, 4), (5, 0), (8, 7)], 4, 2, 16, "prefill", seed=4)
    before_k = [s.pool.k_cache(layer).clone() for layer in range(NUM_LAYERS)]
    before_v = [s.pool.v_cache(layer).clone() for layer in range(NUM_LAYERS)]
    run_backend(s, layer_id=1)
    k, v = s.new_kv()
    out_loc = s.batch.out_loc.long()
    expected_k, expected_v = before_k[1].clone(), before_v[1].clone()
    expected_k[out_loc], expected_v[out_loc] = k, v
    torch.testing.assert_close(s.pool.k_cache(1), expected_k, atol=0, rtol=0)
    torch.testing.assert_close(s.pool.v_cache(1), expected_v, atol=0, rtol=0)
    torch.testing.assert_close(s.pool.k_cache(0), before_k[0], atol=0, rtol=0)
    torch.testing.assert_close(s.pool.v_cache(0), before_v[0], atol=0, rtol=0)


@pytest.mark.parametrize(
    "phase, ledgers",
    [("prefill", [(3, 0), (1, 0), (10, 5), (4, 0)]), ("decode", [(3, 2), (9, 8), (5, 4)])],
)
def test_metadata_last_indices_point_at_each_request_last_token_in_the_batch(phase, ledgers):
    s = make_scenario(ledgers, 4, 2, 16, phase, seed=5)
    TorchAttnBackend(s.pool, s.page_table).prepare_metadata(s.batch)
    extend = torch.tensor([r.extend_len for r in s.batch.reqs])
    expected = extend.cumsum(0) - 1
    assert s.batch.attn_metadata.last_indices.tolist() == expected.tolist()
    # Those are the positions device_len - 1 of each request: the ones whose logits are sampled.
    positions = s.batch.positions[s.batch.attn_metadata.last_indices]
    assert positions.tolist() == [r.device_len - 1 for r in s.batch.reqs]


def test_metadata_prepared_once_serves_every_layer():
    """prepare_metadata runs once per batch; forward then runs once per layer with it."""
    s = make_scenario([(9, 3), (4, 0)], 4, 2, 16, "prefill", seed=6)
    backend = TorchAttnBackend(s.pool, s.page_table)
    backend.prepare_metadata(s.batch)
    gen = torch.Generator().manual_seed(7)
    for layer in range(NUM_LAYERS):
        # Each layer has its own K/V (the cached prefix too) and its own queries.
        keys = [torch.randn(k.shape, generator=gen) for k in s.keys]
        values = [torch.randn(v.shape, generator=gen) for v in s.values]
        for req, k, v, slots in zip(s.batch.reqs, keys, values, s.slots):
            s.pool.store_kv(
                k[: req.cached_len], v[: req.cached_len], slots[: req.cached_len], layer
            )
        layer_s = Scenario(
            s.pool,
            s.page_table,
            s.batch,
            keys,
            values,
            torch.randn(s.q.shape, generator=gen),
            s.slots,
        )
        k_new, v_new = layer_s.new_kv()
        out = backend.forward(layer_s.q, k_new, v_new, layer, s.batch)
        torch.testing.assert_close(out, layer_s.reference(), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    "phase, ledgers",
    [("prefill", [(6, 0), (13, 5), (2, 0)]), ("decode", [(6, 5), (13, 12), (2, 1)])],
)
def test_page_table_entries_past_a_request_length_are_never_read(phase, ledgers):
    """Past device_len a row holds stale entries (here: no slot at all); padding must not
    gather through them, whatever the mask would hide afterwards."""
    s = make_scenario(ledgers, 4, 2, 16, phase, seed=8)
    for req in s.batch.reqs:
        s.page_table[req.table_idx, req.device_len :] = -1
    torch.testing.assert_close(run_backend(s), s.reference(), atol=ATOL, rtol=RTOL)


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated batches go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code). The metadata is yours to lay out where nothing
# reads it (the mask of padding queries, the slot that padding keys name), so prepare_metadata
# is compared on what forward reads; forward's output within the float tolerance of its dtype
# (another order of summation rounds differently), the KV pool bit for bit.

# Per dtype: the tolerance of a correct backend that sums in another order.
TOLERANCES = {
    torch.float32: Tolerance(rtol=RTOL, atol=ATOL),
    torch.float16: Tolerance(rtol=5e-3, atol=5e-3),
    torch.bfloat16: Tolerance(rtol=3e-2, atol=3e-2),
}
GEN_SLOTS = 128  # slots of the generated pools: every request's keys, scattered

LEDGERS = st.lists(  # (sequence length, cached tokens) per request
    st.tuples(st.integers(1, 20), st.integers(0, 19)), min_size=1, max_size=4
)
ATTENTION_INPUTS = dict(
    ledgers=LEDGERS,
    phase=st.sampled_from(["prefill", "decode"]),
    heads=st.sampled_from([(1, 1), (2, 2), (4, 2), (6, 3), (3, 1), (4, 4)]),  # (query, KV)
    head_dim=st.sampled_from([4, 8, 16]),
    dtype=st.sampled_from(list(TOLERANCES)),
    stale=st.booleans(),
    seed=st.integers(0, 999),
)


def generated_batch(
    ledgers: list[tuple[int, int]],
    phase: str,
    heads: tuple[int, int],
    head_dim: int,
    dtype: torch.dtype,
    stale: bool,
    seed: int,
) -> tuple[TorchAttnBackend, torch.Tensor, torch.Tensor, torch.Tensor, int, Batch]:
    """A backend over a pool of garbage in every slot and layer, a batch on scattered rows and
    slots (a decode batch: one new token each), and the new tokens' q, k, v of one layer.
    Page-table entries past each request's length are stale: -1 (no slot at all) or garbage."""
    gen = torch.Generator().manual_seed(seed)
    num_heads, kv_heads = heads
    pool = MHAKVCache(GEN_SLOTS, NUM_LAYERS, kv_heads, head_dim, dtype, torch.device("cpu"))
    pool._buffer.copy_(torch.randn(pool._buffer.shape, generator=gen))  # __init__ is given
    page_table = torch.randint(0, GEN_SLOTS, (TABLE_ROWS, MAX_SEQ_LEN), generator=gen)
    page_table = page_table.int() if not stale else torch.full_like(page_table, -1).int()
    slots = torch.randperm(GEN_SLOTS, generator=gen)
    rows = torch.randperm(TABLE_ROWS, generator=gen).tolist()
    reqs, used = [], 0
    for uid, ((seq_len, cached), row) in enumerate(zip(ledgers, rows)):
        cached = seq_len - 1 if phase == "decode" else min(cached, seq_len - 1)
        page_table[row, :seq_len] = slots[used : used + seq_len].int()
        used += seq_len
        ids = torch.randint(0, 1000, (seq_len,), generator=gen, dtype=torch.int32)
        reqs.append(Req(ids, row, cached, 4, uid, SamplingParams()))
    batch = Batch(reqs, phase)
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs])
    batch.input_ids = torch.cat([r.input_ids[r.cached_len :] for r in reqs])
    batch.out_loc = torch.cat([page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs])
    tokens = len(batch.positions)
    q = torch.randn(tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    layer = int(torch.randint(0, NUM_LAYERS, (1,), generator=gen))
    return TorchAttnBackend(pool, page_table), q, k, v, layer, batch


def what_forward_reads(result, backend: TorchAttnBackend, batch: Batch) -> dict:  # noqa: ANN001
    """The metadata as forward uses it: last_indices, max_extend_len and query_slots exactly;
    each request's key slots, and the mask rows of its real queries over its keys, exactly;
    padding keys hidden from every real query, and naming slots of the pool (the reference's
    name slot 0; the width of the padding is free too). The mask of padding queries is free.
    Index tensors compare by value (int32 or int64 alike)."""
    meta = batch.attn_metadata
    batch_size, width = meta.kv_indices.shape
    observed = {
        "returned": result,
        "type": type(meta).__name__,
        "last_indices": meta.last_indices.long(),
        "max_extend_len": meta.max_extend_len,
        "query_slots": meta.query_slots.long(),
        "kv_indices has a row per request": batch_size == batch.size,
        "mask is [batch, 1, max_extend_len, kv_indices width]": tuple(meta.mask.shape)
        == (batch.size, 1, meta.max_extend_len, width),
        "mask dtype": meta.mask.dtype,
        "page_table": backend.page_table,
    }
    for i, req in enumerate(batch.reqs):
        keys, queries = req.device_len, req.extend_len
        padding = meta.kv_indices[i, keys:].long()
        observed[f"request {i}"] = {
            "its key slots": meta.kv_indices[i, :keys].long(),
            "its queries' mask over its keys": meta.mask[i, :, :queries, :keys],
            "padding keys hidden from its queries": not meta.mask[i, :, :queries, keys:].any(),
            "padding keys name slots of the pool": bool(
                ((padding >= 0) & (padding < backend.kv_cache.num_slots)).all()
            ),
        }
    return observed


@given(**ATTENTION_INPUTS)
@settings(max_examples=40)
def test_prepare_metadata_matches_the_reference(
    ledgers, phase, heads, head_dim, dtype, stale, seed
):
    """Prefill batches (fresh prompts, cached prefixes up to all but the last token, one-token
    prompts) and decode batches of one to four requests on scattered rows and slots."""

    def build() -> tuple:
        backend, *_, batch = generated_batch(ledgers, phase, heads, head_dim, dtype, stale, seed)
        return backend, batch

    assert_same_call(TorchAttnBackend.prepare_metadata, build=build, observe=what_forward_reads)


def output_and_pool(out, backend: TorchAttnBackend, *_) -> dict:  # noqa: ANN001, ANN002
    """The output (compared within a tolerance) and the pool's bits (exactly: it holds copies)."""
    buffer = backend.kv_cache._buffer
    bits = buffer.view(torch.int32 if buffer.element_size() == 4 else torch.int16)
    return {"output": out, "the KV pool, every layer, bit for bit": bits}


@given(**ATTENTION_INPUTS)
@settings(max_examples=30)
def test_forward_matches_the_reference(ledgers, phase, heads, head_dim, dtype, stale, seed):
    """forward on the reference's metadata, with MHA, GQA and MQA head groupings, in float32,
    float16 and bfloat16: the output within the dtype's tolerance, the pool (the new K/V in
    their slots of their layer, nothing else touched) exactly."""
    prepare = reference_of(TorchAttnBackend.prepare_metadata)

    def build() -> tuple:
        backend, q, k, v, layer, batch = generated_batch(
            ledgers, phase, heads, head_dim, dtype, stale, seed
        )
        prepare(backend, batch)
        return backend, q, k, v, layer, batch

    assert_same_call(
        TorchAttnBackend.forward, build=build, observe=output_and_pool, tolerance=TOLERANCES[dtype]
    )


@given(**ATTENTION_INPUTS)
@settings(max_examples=10)
def test_your_metadata_and_forward_together_match_the_reference(
    ledgers, phase, heads, head_dim, dtype, stale, seed
):
    """prepare_metadata then forward, both yours, against both of the reference's: whatever
    layout your metadata chose, your forward must read it to the same output."""

    def run() -> torch.Tensor:
        backend, q, k, v, layer, batch = generated_batch(
            ledgers, phase, heads, head_dim, dtype, stale, seed
        )
        backend.prepare_metadata(batch)
        return backend.forward(q, k, v, layer, batch)

    yours = run()
    with use_reference_stubs(5):
        reference = run()
    tolerance = TOLERANCES[dtype]
    assert yours.dtype == reference.dtype and yours.shape == reference.shape
    torch.testing.assert_close(yours, reference, rtol=tolerance.rtol, atol=tolerance.atol)
