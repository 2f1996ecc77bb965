"""Chapter 22 tests: our Triton paged attention kernels against the torch backend, on the CPU.

Triton's interpreter runs the kernels on CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1
without a GPU), exactly but slowly, so the shapes are tiny. The oracle is chapter 5's torch
backend: the same requests, on random pages of a random pool, go through its `forward` and
through our kernels, in float32. The cases cover every page size the course uses (1, 4, 16,
256), query heads per KV head of 1 and more, ragged lengths, a context of one token, contexts
that end inside a chunk and inside a block, prefills with and without a cached prefix, and
split counts from 1 to more chunks than keys. The split-KV partials are checked on their own
(each chunk's normalised output and log-sum-exp), and so is the merge. The backend is checked
field by field, its step path under chapter 17's `HostSyncGuard`, its graph buffers under
chapter 18's `FakeGraph`; last, engines generate the torch backend's greedy tokens.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before minisgl.kernels imports triton's jit

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from conftest import TINY_MODELS, greedy, guarded_llm, hf_greedy_cached, require_model
from course.differential import Tolerance, assert_same_call, call_differences
from course.differential import reference_function, use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ch17_gpu_attention import HostSyncGuard, prompts
from test_ch18_cuda_graph import FakeGraph
from test_ch19_kernels import make_reqs, paged_table
from triton.runtime.errors import InterpreterError

from minisgl.attention import ATTENTION_BACKENDS, TorchAttnBackend
from minisgl.attention import triton as triton_backend
from minisgl.attention.triton import CPU_SM_COUNT, TritonAttnBackend, TritonAttnMetadata
from minisgl.core import Batch
from minisgl.engine import graph as graph_module
from minisgl.engine.graph import GraphRunner
from minisgl.kernels import paged_attention
from minisgl.kernels.paged_attention import (
    MAX_SPLITS,
    MIN_DOT,
    decode_attention,
    decode_partials,
    merge_partials,
    num_decode_splits,
    prefill_attention,
)
from minisgl.kvcache import MHAKVCache

QWEN3 = TINY_MODELS["qwen3"]
PAGE_SIZES = [1, 4, 16, 256]  # the course's: chapters 4-10 (1, 4), 17 (16), the benchmark (256)
BLOCK_N = paged_attention.DEFAULT_DECODE.block_n
ATOL = 2e-5  # float32: the kernels sum in another order than torch's softmax


class PagedKV:
    """A one-layer pool of random K/V and a page table over it, for requests given as
    (row, cached_len, device_len) ledgers."""

    def __init__(
        self, ledgers: list[tuple[int, int, int]], kv_heads: int, head_dim: int, page_size: int
    ) -> None:
        seed = sum(map(sum, ledgers)) + page_size
        rows = max(row for row, _, _ in ledgers) + 1
        row_len = -(-max(device for _, _, device in ledgers) // page_size) * page_size
        self.table = paged_table(rows, row_len, page_size, seed)
        num_slots = int(self.table.max()) + 1 + page_size
        self.pool = MHAKVCache(num_slots, 1, kv_heads, head_dim, torch.float32, torch.device("cpu"))
        gen = torch.Generator().manual_seed(seed)
        self.pool.k_cache(0).copy_(torch.randn(num_slots, kv_heads, head_dim, generator=gen))
        self.pool.v_cache(0).copy_(torch.randn(num_slots, kv_heads, head_dim, generator=gen))
        self.reqs = make_reqs(ledgers)

    def batch(self, phase: str) -> Batch:
        """The requests' new tokens as a batch: out_loc is their slots (the pool already holds
        their K/V, so storing them again changes nothing)."""
        batch = Batch(self.reqs, phase)
        batch.out_loc = torch.cat(
            [self.table[r.table_idx, r.cached_len : r.device_len] for r in self.reqs]
        )
        return batch

    def new_kv(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        slots = batch.out_loc.long()
        return self.pool.k_cache(0)[slots], self.pool.v_cache(0)[slots]

    def queries(self, heads: int, head_dim: int) -> torch.Tensor:
        tokens = sum(r.extend_len for r in self.reqs)
        return torch.randn(tokens, heads, head_dim, generator=torch.Generator().manual_seed(7))

    def torch_attention(self, q: torch.Tensor, phase: str) -> torch.Tensor:
        """Chapter 5's torch backend on the same batch: the oracle."""
        backend, batch = TorchAttnBackend(self.pool, self.table), self.batch(phase)
        backend.prepare_metadata(batch)
        return backend.forward(q, *self.new_kv(batch), 0, batch)

    def device_lists(self) -> dict[str, torch.Tensor]:
        """rows, seq_lens, cached_lens, qo_indptr as the kernels read them (int32)."""
        extends = [r.extend_len for r in self.reqs]
        as_int32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
        return {
            "rows": as_int32([r.table_idx for r in self.reqs]),
            "seq_lens": as_int32([r.device_len for r in self.reqs]),
            "cached_lens": as_int32([r.cached_len for r in self.reqs]),
            "qo_indptr": as_int32([0] + torch.tensor(extends).cumsum(0).tolist()),
        }

    def decode(self, q: torch.Tensor, num_splits: int) -> torch.Tensor:
        lists = self.device_lists()
        k_cache, v_cache = self.pool.k_cache(0), self.pool.v_cache(0)
        return decode_attention(
            q, k_cache, v_cache, self.table, lists["rows"], lists["seq_lens"], num_splits
        )

    def prefill(self, q: torch.Tensor) -> torch.Tensor:
        lists = self.device_lists()
        max_extend = max(r.extend_len for r in self.reqs)
        k_cache, v_cache = self.pool.k_cache(0), self.pool.v_cache(0)
        return prefill_attention(
            q, k_cache, v_cache, self.table, **lists, max_extend_len=max_extend
        )


def decode_ledgers(seq_lens: list[int]) -> list[tuple[int, int, int]]:
    """Decoding requests of these lengths on rows 1, 3, 5, ... (row order != batch order)."""
    return [(2 * i + 1, n - 1, n) for i, n in enumerate(seq_lens)][::-1]


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: shape or dtype"
    error = (got - want).abs().max().item()
    assert error <= ATOL, f"{what}: max difference {error:.2e} from the torch backend"


# ----- decode ----------------------------------------------------------------------------------

DECODE_CASES = {
    # name: (query heads, KV heads, head_dim, context lengths, splits)
    "one token, one split": (2, 2, 8, [1], 1),
    "one token, more chunks than keys": (4, 2, 8, [1, 2], 5),
    "MHA, a context ending inside a block": (3, 3, 12, [BLOCK_N + 5, 9], 1),
    "GQA 4/1 over three chunks, ending inside one": (4, 1, 16, [2 * BLOCK_N + 7, 33, 3], 3),
    "GQA 3/1, head_dim not a power of two": (3, 1, 20, [70, 1, 130], 2),
}


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_decode_matches_the_torch_backend(case: str, page_size: int) -> None:
    heads, kv_heads, head_dim, seq_lens, splits = DECODE_CASES[case]
    kv = PagedKV(decode_ledgers(seq_lens), kv_heads, head_dim, page_size)
    q = kv.queries(heads, head_dim)
    assert_close(kv.decode(q, splits), kv.torch_attention(q, "decode"), case)


@settings(max_examples=12)
@given(
    seq_lens=st.lists(st.integers(1, 3 * BLOCK_N), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 3]),
    kv_heads=st.integers(1, 2),
    head_dim=st.sampled_from([4, 16, 24]),
    page_size=st.sampled_from(PAGE_SIZES),
    splits=st.integers(1, 6),
)
def test_decode_matches_the_torch_backend_on_ragged_batches(
    seq_lens, group, kv_heads, head_dim, page_size, splits
):
    kv = PagedKV(decode_ledgers(seq_lens), kv_heads, head_dim, page_size)
    q = kv.queries(group * kv_heads, head_dim)
    assert_close(kv.decode(q, splits), kv.torch_attention(q, "decode"), f"{splits} splits")


def test_every_split_count_gives_the_same_output() -> None:
    kv = PagedKV(decode_ledgers([3 * BLOCK_N + 1, 40]), 2, 8, page_size=16)
    q = kv.queries(4, 8)
    whole = kv.decode(q, 1)
    for splits in (2, 4, 7, MAX_SPLITS):
        assert_close(kv.decode(q, splits), whole, f"{splits} splits against 1")


def chunk_bounds(seq_len: int, splits: int) -> list[tuple[int, int]]:
    """The documented chunks: ceil(seq_len / splits) rounded up to BLOCK_N tokens each."""
    chunk = -(-(-(-seq_len // splits)) // BLOCK_N) * BLOCK_N
    return [(min(s * chunk, seq_len), min((s + 1) * chunk, seq_len)) for s in range(splits)]


@pytest.mark.parametrize(
    "seq_lens, splits",
    [
        ([2 * BLOCK_N + 3, 5], 4),  # chunks of one block, the last one short; empty chunks
        ([2 * BLOCK_N, 4 * BLOCK_N + 1], 2),  # a share of exactly one block: no rounding up
    ],
)
def test_each_split_writes_its_chunks_softmax_and_log_sum_exp(seq_lens, splits) -> None:
    """The partials decode_kernel hands to the merge, against torch on each chunk: the output
    normalised over the chunk alone and the chunk's LSE; an empty chunk writes zeros, -inf."""
    heads, kv_heads, head_dim = 4, 2, 12
    kv = PagedKV(decode_ledgers(seq_lens), kv_heads, head_dim, page_size=4)
    q = kv.queries(heads, head_dim)
    lists = kv.device_lists()
    pools = kv.pool.k_cache(0), kv.pool.v_cache(0)
    partial_out, partial_lse = decode_partials(
        q, *pools, kv.table, lists["rows"], lists["seq_lens"], splits
    )
    group = heads // kv_heads
    for b, req in enumerate(kv.reqs):
        slots = kv.table[req.table_idx, : req.device_len].long()
        keys = kv.pool.k_cache(0)[slots].repeat_interleave(group, dim=1)  # [n, heads, dim]
        values = kv.pool.v_cache(0)[slots].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b], keys) * head_dim**-0.5
        for s, (start, end) in enumerate(chunk_bounds(req.device_len, splits)):
            where = f"request {b} (length {req.device_len}), split {s} = [{start}, {end})"
            if start == end:
                assert torch.equal(partial_lse[b, :, s], torch.full((heads,), -torch.inf)), where
                assert not partial_out[b, :, s].any(), f"{where}: an empty chunk writes zeros"
                continue
            lse = scores[:, start:end].logsumexp(-1)
            out = torch.einsum("hn,nhd->hd", scores[:, start:end].softmax(-1), values[start:end])
            assert (partial_lse[b, :, s] - lse).abs().max() <= ATOL, f"{where}: LSE"
            assert (partial_out[b, :, s, :head_dim] - out).abs().max() <= ATOL, f"{where}: out"


# ----- the merge -------------------------------------------------------------------------------


def chunked_partials(
    scores: torch.Tensor, values: torch.Tensor, bounds: list[tuple[int, int]], block_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials as decode_kernel writes them, computed by torch: [heads, splits, block_dim]
    outputs over each chunk alone (zeros when empty) and [heads, splits] LSEs (-inf)."""
    heads, head_dim = scores.shape[0], values.shape[-1]
    out = torch.zeros(heads, len(bounds), block_dim)
    lse = torch.full((heads, len(bounds)), -torch.inf)
    for s, (start, end) in enumerate(bounds):
        if start < end:
            out[:, s, :head_dim] = scores[:, start:end].softmax(-1) @ values[start:end]
            lse[:, s] = scores[:, start:end].logsumexp(-1)
    return out, lse


@pytest.mark.parametrize(
    "bounds",
    [
        [(0, 9)],  # one split: the merge copies it
        [(0, 4), (4, 9)],
        [(0, 3), (3, 3), (3, 9), (9, 9)],  # empty chunks, in the middle and at the end
        [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 9)],  # six: a block of 8 splits, masked
    ],
)
def test_the_merge_weighs_partials_by_their_log_sum_exp(bounds) -> None:
    heads, head_dim, block_dim = 3, 6, MIN_DOT
    gen = torch.Generator().manual_seed(len(bounds))
    scores = torch.randn(2, heads, 9, generator=gen) * 4  # two requests
    values = torch.randn(2, 9, head_dim, generator=gen)
    parts = [chunked_partials(scores[b], values[b], bounds, block_dim) for b in range(2)]
    partial_out = torch.stack([p[0] for p in parts])
    partial_lse = torch.stack([p[1] for p in parts])
    out = torch.full((2, heads, head_dim), 7.0)
    merge_partials(partial_out, partial_lse, out)
    want = scores.softmax(-1) @ values
    error = (out - want).abs().max().item()
    assert error <= ATOL, f"merged {len(bounds)} partials differ from one softmax by {error:.2e}"


def test_the_merge_ignores_what_an_empty_chunk_holds_and_a_row_without_keys_is_zero() -> None:
    scores = torch.randn(2, 5, generator=torch.Generator().manual_seed(3))
    values = torch.randn(5, 4, generator=torch.Generator().manual_seed(4))
    partial_out, partial_lse = chunked_partials(scores, values, [(0, 2), (2, 2), (2, 5)], 16)
    partial_out[:, 1] = 1e6  # the chunk is empty: its LSE is -inf, whatever its output says
    padding_out = torch.full((2, 3, 16), 5.0)  # a padding row of a graph: every chunk empty
    padding_lse = torch.full((2, 3), -torch.inf)
    out = torch.full((2, 2, 4), 7.0)
    merge_partials(
        torch.stack([partial_out, padding_out]), torch.stack([partial_lse, padding_lse]), out
    )
    assert (out[0] - scores.softmax(-1) @ values).abs().max() <= ATOL
    assert torch.equal(out[1], torch.zeros(2, 4)), "a request with no keys must give zeros"


# ----- prefill ---------------------------------------------------------------------------------

PREFILL_CASES = {
    # name: (query heads, KV heads, head_dim, (cached_len, device_len) of each request)
    "no prefix, one token": (2, 1, 8, [(0, 1)]),
    "no prefix and a prefix, ragged": (4, 2, 12, [(0, 9), (5, 6), (17, 30)]),
    "MHA, more new tokens than a program's block": (2, 2, 16, [(3, 3 + 70), (0, 2)]),
    "GQA 3/1, a long prefix and a short extend": (3, 1, 20, [(150, 153), (0, 40)]),
}


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_prefill_matches_the_torch_backend(case: str, page_size: int) -> None:
    heads, kv_heads, head_dim, lengths = PREFILL_CASES[case]
    ledgers = [(2 * i + 1, cached, device) for i, (cached, device) in enumerate(lengths)][::-1]
    kv = PagedKV(ledgers, kv_heads, head_dim, page_size)
    q = kv.queries(heads, head_dim)
    assert_close(kv.prefill(q), kv.torch_attention(q, "prefill"), case)


@settings(max_examples=10)
@given(
    lengths=st.lists(
        st.tuples(st.integers(0, 40), st.integers(1, 20)), min_size=1, max_size=3
    ),  # (cached_len, extend_len)
    group=st.sampled_from([1, 2]),
    page_size=st.sampled_from(PAGE_SIZES),
)
def test_prefill_matches_the_torch_backend_on_ragged_batches(lengths, group, page_size):
    ledgers = [(i, cached, cached + n) for i, (cached, n) in enumerate(lengths)]
    kv = PagedKV(ledgers, 2, 8, page_size)
    q = kv.queries(2 * group, 8)
    assert_close(kv.prefill(q), kv.torch_attention(q, "prefill"), "prefill")


# ----- how many splits -------------------------------------------------------------------------


def test_splits_fill_the_gpu_twice_over_and_stay_within_bounds() -> None:
    # H200: 132 SMs; Qwen3-0.6B: 8 KV heads
    assert num_decode_splits(1, 8, 132) == MAX_SPLITS  # ceil(264 / 8) = 33, capped
    assert num_decode_splits(4, 8, 132) == 9  # ceil(264 / 32)
    assert num_decode_splits(16, 8, 132) == 3  # ceil(264 / 128)
    assert num_decode_splits(33, 8, 132) == 1  # 264 programs already
    assert num_decode_splits(256, 8, 132) == 1
    assert num_decode_splits(8, 2, 4, waves=4) == 1
    assert num_decode_splits(3, 1, 10, waves=1) == 4
    for batch in range(1, 300, 7):
        splits = num_decode_splits(batch, 8, 132)
        assert 1 <= splits <= MAX_SPLITS
        assert splits == MAX_SPLITS or batch * 8 * splits >= 264, "fewer programs than 2 per SM"


# ----- the backend -----------------------------------------------------------------------------


class Launches:
    """The kernels of paged_attention, watched: each launch's grid is recorded, and runs as
    library code (the interpreter's own host work is not the step's); so is each copy."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.grids: dict[str, list[tuple[int, ...]]] = {}
        self.copies: list[torch.dtype] = []
        for name in ("decode_kernel", "merge_kernel", "prefill_kernel"):
            monkeypatch.setattr(paged_attention, name, self.watched(name))
        from minisgl.attention import triton as backend_module

        real_copy = backend_module.make_device_tensor

        def copy(data: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            self.copies.append(dtype)
            return real_copy(data, dtype, device)

        monkeypatch.setattr(backend_module, "make_device_tensor", copy)

    def watched(self, name: str) -> Any:
        kernel, grids = getattr(paged_attention, name), self.grids.setdefault(name, [])

        class Watched:
            def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
                def launch(*args: Any, **kwargs: Any) -> None:
                    grids.append(tuple(grid))
                    with HostSyncGuard.library():
                        kernel[grid](*args, **kwargs)

                return launch

        return Watched()


def backend_for(kv: PagedKV, kv_heads: int) -> TritonAttnBackend:
    return TritonAttnBackend(kv.pool, kv.table, kv_heads)


def test_prepare_metadata_fills_every_field_in_one_copy(monkeypatch) -> None:
    ledgers = [(3, 10, 14), (0, 0, 6), (5, 2, 3)]  # (row, cached_len, device_len)
    kv = PagedKV(ledgers, 2, 8, page_size=4)
    launches = Launches(monkeypatch)
    backend, batch = backend_for(kv, 2), kv.batch("prefill")
    with HostSyncGuard("prepare_metadata", fatal=True):
        backend.prepare_metadata(batch)
    meta = batch.attn_metadata
    assert isinstance(meta, TritonAttnMetadata)
    assert launches.copies == [torch.int32], f"host-to-device copies: {launches.copies}"
    expected = {
        "rows": [3, 0, 5],
        "seq_lens": [14, 6, 3],
        "cached_lens": [10, 0, 2],
        "qo_indptr": [0, 4, 10, 11],
    }
    for name, values in expected.items():
        tensor = getattr(meta, name)
        assert tensor.dtype == torch.int32, f"{name} must be int32, as the kernels read it"
        assert tensor.tolist() == values, f"{name}"
    assert meta.last_indices.dtype == torch.int64 and meta.last_indices.tolist() == [3, 9, 10]
    assert meta.max_extend_len == 6
    assert meta.num_splits == num_decode_splits(3, 2, backend.sm_count)
    decode = Batch(make_reqs([(1, 7, 8), (2, 0, 1)]), "decode")
    backend.prepare_metadata(decode)
    assert decode.attn_metadata.num_splits == num_decode_splits(2, 2, backend.sm_count)
    assert decode.attn_metadata.max_extend_len == 1
    assert decode.attn_metadata.last_indices.tolist() == [0, 1]


FORWARD_CASES = {
    # name: (phase, (cached_len, device_len) of each request)
    "prefill": ("prefill", [(0, 9), (4, 5), (30, 37)]),
    "prefill of one token each": ("prefill", [(8, 9), (0, 1), (36, 37)]),  # after prefix hits
    "decode": ("decode", [(8, 9), (0, 1), (36, 37)]),
}


@pytest.mark.parametrize("case", sorted(FORWARD_CASES))
def test_forward_stores_then_attends_with_one_launch_per_kernel(monkeypatch, case) -> None:
    """forward stores the new K/V first (a zeroed slot must be filled before the kernels read
    it), runs the phase's kernels on their documented grids (a prefill batch runs the prefill
    kernel, even when each request computes one token), never waits for the device."""
    phase, lengths = FORWARD_CASES[case]
    ledgers = [(2 * i, cached, device) for i, (cached, device) in enumerate(lengths)]
    kv = PagedKV(ledgers, 1, 8, page_size=16)
    q = kv.queries(3, 8)
    want = kv.torch_attention(q, phase)
    batch = kv.batch(phase)
    k, v = kv.new_kv(batch)
    kv.pool.k_cache(0)[batch.out_loc.long()] = 0.0  # forward must store them back
    kv.pool.v_cache(0)[batch.out_loc.long()] = 0.0
    launches = Launches(monkeypatch)
    backend = backend_for(kv, 1)
    with HostSyncGuard(f"a {phase} step", fatal=True):
        backend.prepare_metadata(batch)
        got = backend.forward(q, k, v, 0, batch)
    assert_close(got, want, phase)
    if phase == "decode":
        splits = batch.attn_metadata.num_splits
        assert launches.grids == {
            "decode_kernel": [(3, 1, splits)],
            "merge_kernel": [(3, 3)],
            "prefill_kernel": [],
        }
    else:
        assert launches.grids["prefill_kernel"] == [(3, 3, 1)], "one prefill launch"
        assert launches.grids["decode_kernel"] == [] and launches.grids["merge_kernel"] == []


def test_a_graph_batch_is_written_into_fixed_buffers_with_padding_rows_of_no_keys() -> None:
    kv = PagedKV([(1, 12, 13), (4, 2, 3), (2, 40, 41)], 2, 8, page_size=4)
    backend = backend_for(kv, 2)
    backend.init_cuda_graph(8)
    captured = Batch([], "decode")  # what the graph of 4 rows is captured with
    backend.prepare_for_graph(captured, 4, pad_page=0)
    batch = kv.batch("decode")
    backend.prepare_for_graph(batch, 4, pad_page=0)
    meta, fixed = batch.attn_metadata, captured.attn_metadata
    for name in ("rows", "seq_lens", "cached_lens", "qo_indptr", "last_indices"):
        got, bound = getattr(meta, name), getattr(fixed, name)
        assert got.data_ptr() == bound.data_ptr() and got.shape == bound.shape, (
            f"{name} must be the same fixed tensor at capture and at replay"
        )
    assert fixed.rows.tolist() == [1, 4, 2, 0] and fixed.seq_lens.tolist() == [13, 3, 41, 0]
    assert fixed.cached_lens.tolist() == [12, 2, 40, 0]
    assert fixed.last_indices.tolist() == [0, 1, 2, 3]
    assert fixed.qo_indptr.tolist() == [0, 1, 2, 3, 4]
    assert meta.num_splits == fixed.num_splits == num_decode_splits(4, 2, backend.sm_count)
    # A replay: the captured metadata, the batch's rows, then a padding row on a spare slot.
    replay = Batch([], "decode")
    replay.attn_metadata = fixed
    replay.out_loc = torch.cat([batch.out_loc, torch.tensor([kv.pool.num_slots - 1])])
    k, v = (torch.cat([t, torch.randn(1, 2, 8)]) for t in kv.new_kv(batch))
    q = torch.cat([kv.queries(4, 8), torch.randn(1, 4, 8)])
    out = backend.forward(q, k, v, 0, replay)
    assert_close(out[:3], kv.torch_attention(q[:3], "decode"), "the real rows")
    assert torch.equal(out[3], torch.zeros(4, 8)), "a padding row reads no key: zeros"
    smaller = Batch(make_reqs([(6, 4, 5)]), "decode")
    backend.prepare_for_graph(smaller, 4, pad_page=0)
    assert fixed.rows.tolist() == [6, 0, 0, 0] and fixed.seq_lens.tolist() == [5, 0, 0, 0], (
        "a smaller batch must turn the rows of the larger one before it into padding"
    )


# ----- the engine ------------------------------------------------------------------------------


def engine_tokens(backend: str, page_size: int, graph_max_bs: int = 0) -> list[list[int]]:
    """Greedy tokens of 4 requests (two sharing a prefix), some chunked, with `backend`."""
    llm = guarded_llm(
        require_model(QWEN3),
        device="cpu",  # the interpreter's home, even where there is a GPU
        attention_backend=backend,
        page_size=page_size,
        num_pages=1024 // page_size,
        max_running_req=4,
        max_extend_tokens=32,  # chunked prefills: a cached prefix of the request's own
        cuda_graph_max_bs=graph_max_bs,
        show_progress=False,
    )
    with llm:
        outs = llm.generate(PROMPTS, [greedy(2 + i % 3) for i in range(len(PROMPTS))])
        if graph_max_bs:
            assert isinstance(llm.scheduler.engine.runner, GraphRunner)
            replays = sum(g.replays for g in llm.scheduler.engine.runner.graphs.values())
            assert replays > 0, "no decode step replayed a graph"
    return [out["token_ids"] for out in outs]


PROMPTS = prompts(4, seed=22)  # 0 and 3 share a prefix: a radix hit


@pytest.mark.parametrize("page_size", [1, 16])
def test_the_engine_on_triton_gives_the_torch_backends_greedy_tokens(page_size) -> None:
    assert "triton" in ATTENTION_BACKENDS
    tokens = engine_tokens("triton", page_size)
    assert tokens == engine_tokens("torch", page_size)
    assert tokens[0] == hf_greedy_cached(QWEN3, PROMPTS[0], len(tokens[0])), "transformers"


def test_decode_graphs_on_triton_give_the_eager_tokens(monkeypatch) -> None:
    """Chapter 18's graphs over the triton backend, with FakeGraph for CUDA graphs: a replay
    sees only what the capture bound, so a batch not written into the fixed buffers would
    decode the captured one."""
    monkeypatch.setattr(
        graph_module, "wanted_graph_batch_size", lambda e: e.config.cuda_graph_max_bs
    )
    monkeypatch.setattr(GraphRunner, "graph_type", FakeGraph)
    assert engine_tokens("triton", 4, graph_max_bs=4) == engine_tokens("torch", 4)


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# Each stub against the reference's body of it, on generated inputs. A kernel (yours and the
# reference's) is launched by the reference's launcher, so any difference is the kernel's; the
# two device functions are called by a one-program probe kernel of this file; the backend's
# methods run the reference's kernels. Blocks are made small (16 keys, 16 queries), so that
# small inputs cross block and chunk edges, and shapes stay tiny: the interpreter's time goes
# by the program. float32 results must agree to float32 rounding (a correct kernel may sum in
# another order); 16-bit inputs leave a 16-bit rounding of their own.

KERNEL_STUBS = frozenset(
    f"kernels/paged_attention.py:{name}"
    for name in (
        "load_kv_block",
        "online_softmax_step",
        "decode_kernel",
        "merge_kernel",
        "prefill_kernel",
    )
)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOLERANCES = {
    torch.float32: Tolerance(rtol=1e-5, atol=2e-5),
    torch.bfloat16: Tolerance(rtol=1.6e-2, atol=1e-2),  # 8 bits of mantissa
    torch.float16: Tolerance(rtol=2e-3, atol=2e-3),
}
SMALL_BLOCK = MIN_DOT  # keys per block, and queries per prefill program, in these comparisons
SMALL_DECODE = paged_attention.DecodeConfig(block_n=SMALL_BLOCK)


def raised_in_the_kernel(error: BaseException) -> BaseException:
    """The exception a kernel raised, not the interpreter's InterpreterError around it: a stub
    not written yet shows as NotImplementedError, which is never a match."""
    while isinstance(error, InterpreterError) and error.__cause__ is not None:
        error = error.__cause__
    return error


def assert_same_with_stub(
    stub: str,
    launch: Callable[..., Any],
    build: Callable[[], tuple],
    tolerance: Tolerance,
    observe: Callable[..., Any] | None = None,
    reference_stubs: frozenset[str] = frozenset(),
) -> None:
    """`launch(*build())` with your `stub` against the same with the reference's body of it
    (`reference_stubs`, other stubs of the chapter, are the reference's on both sides)."""

    @functools.wraps(launch)
    def yours(*args: Any) -> Any:
        try:
            return launch(*args)
        except InterpreterError as error:
            raise raised_in_the_kernel(error) from None

    def reference(*args: Any) -> Any:
        with use_reference_stubs(22, only={stub}):
            return yours(*args)

    with use_reference_stubs(22, only=set(reference_stubs)):
        found = call_differences(
            yours, build=build, reference=reference, tolerance=tolerance, observe=observe
        )
    if found:
        path, _, name = stub.partition(":")
        raise AssertionError(
            f"{name} (minisgl/{path}) differs from the reference on these inputs:\n  "
            + "\n  ".join(found)
        )


def dims_of(head_dim: int) -> int:
    """BLOCK_DIM, as the launchers choose it."""
    return max(MIN_DOT, triton.next_power_of_2(head_dim))


def random_pool(
    slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype, padded: bool, gen: torch.Generator
) -> torch.Tensor:
    """[slots, kv_heads, head_dim] of noise; `padded`: a view with room between heads and
    between slots, so that a stride taken for a size shows."""
    extra = (1, 3) if padded else (0, 0)
    pool = torch.randn(slots, kv_heads + extra[0], head_dim + extra[1], generator=gen)
    return pool.to(dtype)[:, :kv_heads, :head_dim]


# ----- the device functions, through probe kernels ---------------------------------------------


@triton.jit
def load_kv_block_probe(
    k_cache_ptr,
    v_cache_ptr,
    table_row_ptr,
    pos_ptr,
    key_ok_ptr,
    k_out_ptr,
    v_out_ptr,
    head_offset,
    cache_slot_stride,
    head_dim,
    BLOCK_N: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
):
    """One program: load_kv_block on the given positions, its K and V tiles stored whole."""
    keys = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_DIM)
    pos = tl.load(pos_ptr + keys)
    key_ok = tl.load(key_ok_ptr + keys) != 0
    k, v = paged_attention.load_kv_block(
        k_cache_ptr,
        v_cache_ptr,
        table_row_ptr,
        pos,
        key_ok,
        head_offset,
        cache_slot_stride,
        dims,
        dims < head_dim,
    )
    tile = keys[:, None] * BLOCK_DIM + dims[None, :]
    tl.store(k_out_ptr + tile, k)
    tl.store(v_out_ptr + tile, v)


def probe_load_kv_block(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table_row: torch.Tensor,
    pos: torch.Tensor,
    key_ok: torch.Tensor,
    kv_head: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = k_cache.shape[2]
    block_dim = dims_of(head_dim)
    k_out = torch.full((len(pos), block_dim), 7.0, dtype=k_cache.dtype)
    v_out = torch.full((len(pos), block_dim), 7.0, dtype=k_cache.dtype)
    load_kv_block_probe[(1,)](
        k_cache,
        v_cache,
        table_row,
        pos,
        key_ok,
        k_out,
        v_out,
        kv_head * k_cache.stride(1),
        k_cache.stride(0),
        head_dim,
        BLOCK_N=len(pos),
        BLOCK_DIM=block_dim,
    )
    return k_out, v_out


@settings(max_examples=12)
@given(
    kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([1, 4, 16, 20]),
    page_size=st.sampled_from([1, 4, 16]),
    dtype=st.sampled_from(DTYPES),
    padded=st.booleans(),
    block_n=st.sampled_from([16, 32]),
    start=st.integers(0, 40),
    end=st.one_of(st.integers(0, 40), st.just(None)),  # None: keys masked at random
    seed=st.integers(0, 2**16),
)
def test_load_kv_block_matches_the_reference(
    kv_heads, head_dim, page_size, dtype, padded, block_n, start, end, seed
):
    """A block of positions from `start`, the keys from `end` on masked (or a random mask),
    through a paged table row, from any KV head of padded or packed pools; masked keys and
    the dims past head_dim must load as 0."""
    gen = torch.Generator().manual_seed(seed)
    table = paged_table(3, start + block_n, page_size, seed)
    slots = int(table.max()) + 1 + page_size
    pos = torch.arange(start, start + block_n, dtype=torch.int32)
    if end is None:
        key_ok = torch.randint(0, 2, (block_n,), generator=gen, dtype=torch.int32)
    else:
        key_ok = (pos < end).to(torch.int32)
    kv_head = int(torch.randint(0, kv_heads, (1,), generator=gen))
    k_cache = random_pool(slots, kv_heads, head_dim, dtype, padded, gen)
    v_cache = random_pool(slots, kv_heads, head_dim, dtype, padded, gen)
    assert_same_with_stub(
        "kernels/paged_attention.py:load_kv_block",
        probe_load_kv_block,
        lambda: (k_cache, v_cache, table[1], pos, key_ok, kv_head),  # loads change nothing
        Tolerance(),  # loads are exact
    )


@triton.jit
def online_softmax_step_probe(
    q_ptr,
    k_ptr,
    v_ptr,
    allowed_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    sm_scale,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DIM: tl.constexpr,
    PER_ROW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One program: one online_softmax_step on the given tiles and running state, the new
    state stored back. `allowed` is [ROWS, BLOCK_N] (prefill's causal mask) or, without
    PER_ROW, [1, BLOCK_N] (decode's keys in the chunk), broadcast."""
    rows = tl.arange(0, ROWS)
    keys = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_DIM)
    q = tl.load(q_ptr + rows[:, None] * BLOCK_DIM + dims[None, :])
    k = tl.load(k_ptr + keys[:, None] * BLOCK_DIM + dims[None, :])
    v = tl.load(v_ptr + keys[:, None] * BLOCK_DIM + dims[None, :])
    if PER_ROW:
        allowed = tl.load(allowed_ptr + rows[:, None] * BLOCK_N + keys[None, :]) != 0
    else:
        allowed = (tl.load(allowed_ptr + keys) != 0)[None, :]
    m_i = tl.load(m_ptr + rows)
    l_i = tl.load(l_ptr + rows)
    acc = tl.load(acc_ptr + rows[:, None] * BLOCK_DIM + dims[None, :])
    m_i, l_i, acc = paged_attention.online_softmax_step(
        q, k, v, allowed, m_i, l_i, acc, sm_scale, DOT_PRECISION
    )
    tl.store(m_ptr + rows, m_i)
    tl.store(l_ptr + rows, l_i)
    tl.store(acc_ptr + rows[:, None] * BLOCK_DIM + dims[None, :], acc)


def probe_online_softmax_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    m_i: torch.Tensor,
    l_i: torch.Tensor,
    acc: torch.Tensor,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    online_softmax_step_probe[(1,)](
        q,
        k,
        v,
        allowed,
        m_i,
        l_i,
        acc,
        sm_scale,
        ROWS=q.shape[0],
        BLOCK_N=k.shape[0],
        BLOCK_DIM=q.shape[1],
        PER_ROW=allowed.dim() == 2,
        DOT_PRECISION=paged_attention.dot_precision(q.dtype),
    )
    return m_i, l_i, acc


@settings(max_examples=12)
@given(
    rows=st.sampled_from([16, 32]),
    block_n=st.sampled_from([16, 32]),
    head_dim=st.sampled_from([3, 16, 20]),
    dtype=st.sampled_from(DTYPES),
    per_row=st.booleans(),
    first_block=st.booleans(),
    spread=st.sampled_from([0.5, 4.0]),
    seed=st.integers(0, 2**16),
)
def test_online_softmax_step_matches_the_reference(
    rows, block_n, head_dim, dtype, per_row, first_block, spread, seed
):
    """A block folded into a running softmax: rows seeing their first block (m = -inf, l = 0,
    acc = 0: each has an allowed key, as the contract asks) or rows half-way through their walk
    (a running maximum above or below this block's, any keys allowed, none too); the mask
    per row (prefill) or shared (decode); scores small or spread far apart."""
    gen = torch.Generator().manual_seed(seed)
    block_dim = dims_of(head_dim)

    def tile(count: int) -> torch.Tensor:
        values = torch.zeros(count, block_dim)  # the dims past head_dim are zeros, as loaded
        values[:, :head_dim] = torch.randn(count, head_dim, generator=gen) * spread
        return values.to(dtype)

    q, k, v = tile(rows), tile(block_n), tile(block_n)
    allowed = torch.randint(0, 2, (rows if per_row else 1, block_n), generator=gen)
    if first_block:
        allowed[:, 0] = 1  # key 0 of a walk is always allowed
        m_i = torch.full((rows,), -torch.inf)
        l_i, acc = torch.zeros(rows), torch.zeros(rows, block_dim)
    else:
        m_i = torch.randn(rows, generator=gen) * spread * 2
        l_i = torch.rand(rows, generator=gen) * 8 + 1
        acc = torch.randn(rows, block_dim, generator=gen) * l_i[:, None]
    allowed = allowed.to(torch.int32) if per_row else allowed[0].to(torch.int32)
    assert_same_with_stub(
        "kernels/paged_attention.py:online_softmax_step",
        probe_online_softmax_step,
        lambda: (q, k, v, allowed, m_i.clone(), l_i.clone(), acc.clone(), head_dim**-0.5),
        TOLERANCES[dtype],
    )


# ----- the kernels, through the reference's launchers ------------------------------------------


@dataclass
class KernelInputs:
    """Requests on random rows of a paged table over random pools, and their new tokens' q."""

    q: torch.Tensor  # [tokens, heads, head_dim]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    table: torch.Tensor
    rows: torch.Tensor
    seq_lens: torch.Tensor
    cached_lens: torch.Tensor
    qo_indptr: torch.Tensor
    max_extend_len: int


def kernel_inputs(
    lengths: list[tuple[int, int]],
    heads: int,
    kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    padded: bool,
    seed: int,
    decode: bool = False,
) -> KernelInputs:
    """Inputs for requests of (cached_len, device_len), on distinct rows in another order; q
    has a row per new token, or with `decode` one per request (a padding row's too)."""
    gen = torch.Generator().manual_seed(seed)
    count = len(lengths)
    rows = torch.randperm(count + 2, generator=gen)[:count].to(torch.int32)
    table = paged_table(count + 2, max(1, *(device for _, device in lengths)), page_size, seed)
    slots = int(table.max()) + 1 + page_size
    extends = [device - cached for cached, device in lengths]
    tokens = count if decode else sum(extends)
    q = torch.randn(tokens, heads, head_dim + (5 if padded else 0), generator=gen)
    as_int32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    return KernelInputs(
        q=q.to(dtype)[:, :, :head_dim],
        k_cache=random_pool(slots, kv_heads, head_dim, dtype, padded, gen),
        v_cache=random_pool(slots, kv_heads, head_dim, dtype, padded, gen),
        table=table,
        rows=rows,
        seq_lens=as_int32([device for _, device in lengths]),
        cached_lens=as_int32([cached for cached, _ in lengths]),
        qo_indptr=as_int32([0, *torch.tensor(extends).cumsum(0).tolist()]),
        max_extend_len=max(extends),
    )


ATTENTION_SHAPES = dict(
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 2),
    head_dim=st.sampled_from([4, 16, 20]),
    page_size=st.sampled_from([1, 4, 16]),
    dtype=st.sampled_from(DTYPES),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
# Context lengths: none (a graph's padding row), one token, block edges, up to three blocks.
CONTEXTS = st.one_of(
    st.integers(0, 3 * SMALL_BLOCK + 1),
    st.sampled_from([1, SMALL_BLOCK, SMALL_BLOCK + 1, 2 * SMALL_BLOCK]),
)


@settings(max_examples=6)
@given(
    seq_lens=st.lists(CONTEXTS, min_size=1, max_size=2),
    splits=st.integers(1, 4),
    **ATTENTION_SHAPES,
)
def test_decode_kernel_matches_the_reference(
    seq_lens, splits, kv_heads, group, head_dim, page_size, dtype, padded, seed
):
    """The partials of every split (the output normalised over its chunk, the chunk's LSE,
    zeros and -inf for an empty chunk), the reference's decode_partials launching both
    kernels. The lanes past head_dim of a partial are the kernel's scratch: not compared."""
    inputs = kernel_inputs(
        [(max(n - 1, 0), n) for n in seq_lens],
        kv_heads * group,
        kv_heads,
        head_dim,
        page_size,
        dtype,
        padded,
        seed,
        decode=True,
    )
    launch = reference_function(paged_attention, "decode_partials")
    fields = (inputs.q, inputs.k_cache, inputs.v_cache, inputs.table, inputs.rows)
    assert_same_with_stub(
        "kernels/paged_attention.py:decode_kernel",
        launch,
        lambda: (*fields, inputs.seq_lens, splits, SMALL_DECODE),
        TOLERANCES[dtype],
        observe=lambda result, *args: (result[0][..., :head_dim], result[1]),
    )


@settings(max_examples=8)
@given(
    batch=st.integers(1, 3),
    heads=st.integers(1, 3),
    splits=st.integers(1, 6),
    head_dim=st.sampled_from([3, 16, 20]),
    dtype=st.sampled_from(DTYPES),
    strided_out=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_merge_kernel_matches_the_reference(
    batch, heads, splits, head_dim, dtype, strided_out, seed
):
    """Partials of any split count (a power of two or not), chunks empty (LSE -inf, whatever
    their output holds) here and there, a request with no keys at all, into an output of any
    dtype, packed or strided; the reference's merge_partials launching both kernels."""
    gen = torch.Generator().manual_seed(seed)
    block_dim = dims_of(head_dim)
    partial_out = torch.randn(batch, heads, splits, block_dim, generator=gen)
    partial_lse = torch.randn(batch, heads, splits, generator=gen) * 3
    empty = torch.rand(batch, heads, splits, generator=gen) < 0.3
    partial_lse[empty] = -torch.inf
    partial_lse[0, 0] = -torch.inf  # a row without keys (a graph's padding row)
    partial_out[partial_lse == -torch.inf] = 1e3  # what an empty chunk holds must not count

    def build() -> tuple:
        out = torch.full((batch, heads, head_dim + (2 if strided_out else 0)), 7.0, dtype=dtype)
        return partial_out, partial_lse, out[:, :, :head_dim]  # (a clone would be packed)

    assert_same_with_stub(
        "kernels/paged_attention.py:merge_kernel",
        reference_function(paged_attention, "merge_partials"),
        build,
        TOLERANCES[dtype],
    )


# (cached_len, extend_len): no prefix, a prefix, extends at and one past a block of queries.
EXTENDS = st.tuples(
    st.integers(0, 2 * SMALL_BLOCK + 1),
    st.one_of(st.integers(1, 2 * SMALL_BLOCK + 1), st.sampled_from([SMALL_BLOCK, SMALL_BLOCK + 1])),
)


@settings(max_examples=6)
@given(extends=st.lists(EXTENDS, min_size=1, max_size=2), **ATTENTION_SHAPES)
def test_prefill_kernel_matches_the_reference(
    extends, kv_heads, group, head_dim, page_size, dtype, padded, seed
):
    """Ragged extends after cached prefixes (block edges in both), the reference's
    prefill_attention launching both kernels with blocks of 16 queries and 16 keys."""
    inputs = kernel_inputs(
        [(cached, cached + n) for cached, n in extends],
        kv_heads * group,
        kv_heads,
        head_dim,
        page_size,
        dtype,
        padded,
        seed,
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paged_attention, "PREFILL_BLOCK_M", SMALL_BLOCK)
        patch.setattr(paged_attention, "PREFILL_BLOCK_N", SMALL_BLOCK)
        assert_same_with_stub(
            "kernels/paged_attention.py:prefill_kernel",
            reference_function(paged_attention, "prefill_attention"),
            lambda: tuple(vars(inputs).values()),
            TOLERANCES[dtype],
        )


@settings(max_examples=50)
@given(
    batch_size=st.one_of(st.integers(1, 40), st.integers(1, 1000)),
    num_kv_heads=st.integers(1, 16),
    sm_count=st.integers(1, 200),
    waves=st.one_of(st.none(), st.integers(1, 4)),
)
def test_num_decode_splits_matches_the_reference(batch_size, num_kv_heads, sm_count, waves):
    """Grids from one program short of the aim to far past it, the cap, and the default waves."""
    args = (batch_size, num_kv_heads, sm_count) + (() if waves is None else (waves,))
    assert_same_call(num_decode_splits, *args)


# ----- the backend, on the reference's kernels -------------------------------------------------

BACKEND = "attention/triton.py"


@st.composite
def batch_ledgers(draw: st.DrawFn, max_reqs: int = 4) -> tuple[str, list[tuple[int, int, int]]]:
    """A phase and 1 to max_reqs requests (table row, cached_len, device_len) on distinct rows
    of 8: decode (one new token each), or prefill (ragged, with and without prefixes, some of
    one token each)."""
    phase = draw(st.sampled_from(["prefill", "decode"]))
    rows = draw(st.permutations(range(8)))[: draw(st.integers(1, max_reqs))]
    ledgers = []
    for row in rows:
        if phase == "decode":
            device = draw(st.integers(1, 40))
            ledgers.append((row, device - 1, device))
        else:
            cached = draw(st.integers(0, 30))
            ledgers.append((row, cached, cached + draw(st.integers(1, 20))))
    return phase, ledgers


def backend_over(
    ledgers: list[tuple[int, int, int]],
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int,
    sm_count: int = CPU_SM_COUNT,
) -> TritonAttnBackend:
    """A backend over a two-layer pool of noise and a paged table of 8 rows."""
    gen = torch.Generator().manual_seed(seed)
    row_len = max(device for _, _, device in ledgers) + 1
    table = paged_table(8, row_len, 4, seed)
    pool = MHAKVCache(int(table.max()) + 5, 2, kv_heads, head_dim, dtype, torch.device("cpu"))
    pool._buffer.copy_(torch.randn(pool._buffer.shape, generator=gen))
    backend = TritonAttnBackend(pool, table, kv_heads)
    backend.sm_count = sm_count  # the split count follows it
    return backend


class CopyRecorder:
    """The backend module's host-to-device copies (make_device_tensor), per side."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.sides: list[list[str]] = []
        real = triton_backend.make_device_tensor

        def copy(data: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
            tensor = real(data, dtype, device)
            self.sides[-1].append(f"copy of {tensor.numel()} {dtype} values")
            return tensor

        patch.setattr(triton_backend, "make_device_tensor", copy)

    def side(self) -> None:
        self.sides.append([])


@settings(max_examples=30)
@given(batch=batch_ledgers(max_reqs=6), sm_count=st.sampled_from([1, 4, 132]))
def test_prepare_metadata_matches_the_reference(batch, sm_count):
    """Every metadata field (values, dtypes) and the host-to-device copies, for decode and
    prefill batches on rows out of order, with split counts from GPUs small and large."""
    phase, ledgers = batch

    def build() -> tuple:
        recorder.side()
        return backend_over(ledgers, 2, 8, torch.float32, 0, sm_count), Batch(
            make_reqs(ledgers), phase
        )

    with pytest.MonkeyPatch.context() as patch:
        recorder = CopyRecorder(patch)
        found = call_differences(TritonAttnBackend.prepare_metadata, build=build)
    if recorder.sides[0] != recorder.sides[1]:
        found.append(f"copies: yours {recorder.sides[0]}, the reference's {recorder.sides[1]}")
    assert not found, "TritonAttnBackend.prepare_metadata differs:\n  " + "\n  ".join(found)


class KernelRecorder:
    """The launches of paged_attention's kernels (name and grid), per side."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.sides: list[list[str]] = []
        for name in ("decode_kernel", "merge_kernel", "prefill_kernel"):
            patch.setattr(paged_attention, name, self.watched(name, getattr(paged_attention, name)))

    def watched(self, name: str, kernel: Any) -> Any:
        recorder = self

        class Watched:
            def __getitem__(self, grid: tuple[int, ...]) -> Any:
                recorder.sides[-1].append(f"{name} on grid {tuple(grid)}")
                return kernel[grid]

        return Watched()

    def side(self) -> None:
        self.sides.append([])


@settings(max_examples=6)
@given(
    batch=batch_ledgers(max_reqs=2),
    layer_id=st.integers(0, 1),
    kv_heads=st.integers(1, 2),
    group=st.integers(1, 2),
    dtype=st.sampled_from(DTYPES),
    graph_rows=st.integers(0, 2),
    seed=st.integers(0, 2**16),
)
def test_forward_matches_the_reference(batch, layer_id, kv_heads, group, dtype, graph_rows, seed):
    """A layer's attention, the reference's kernels below: the output, the pool after (the
    new K/V stored in this layer only) and the kernels launched (names, grids). A decode batch
    may come as a graph's, with `graph_rows` padding rows of no keys (prepare_for_graph's
    metadata)."""
    phase, ledgers = batch
    head_dim = 8
    heads = kv_heads * group
    graph = phase == "decode" and graph_rows > 0

    def build() -> tuple:
        gen = torch.Generator().manual_seed(seed)
        backend = backend_over(ledgers, kv_heads, head_dim, dtype, seed)
        reqs = make_reqs(ledgers)
        step = Batch(reqs, phase)
        slots = [backend.page_table[r.table_idx, r.cached_len : r.device_len] for r in reqs]
        pad = [torch.tensor([backend.kv_cache.num_slots - 1], dtype=torch.int32)] * graph_rows
        step.out_loc = torch.cat(slots + (pad if graph else []))
        if graph:
            backend.init_cuda_graph(len(reqs) + graph_rows)
            reference_function(TritonAttnBackend, "prepare_for_graph")(
                backend, step, len(reqs) + graph_rows, 0
            )
        else:
            reference_function(TritonAttnBackend, "prepare_metadata")(backend, step)
        tokens = len(step.out_loc)
        q = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype)
        k, v = (torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype) for _ in "kv")
        kernels.side()
        return backend, q, k, v, layer_id, step

    # The kernels are the reference's while the recorder watches them (it is undone first).
    with use_reference_stubs(22, only=KERNEL_STUBS), pytest.MonkeyPatch.context() as patch:
        kernels = KernelRecorder(patch)
        found = call_differences(
            TritonAttnBackend.forward,
            build=build,
            tolerance=TOLERANCES[dtype],
            observe=lambda out, backend, *args: (out, backend.kv_cache._buffer),
        )
    if kernels.sides[0] != kernels.sides[1]:
        found.append(f"launches: yours {kernels.sides[0]}, the reference's {kernels.sides[1]}")
    assert not found, "TritonAttnBackend.forward differs:\n  " + "\n  ".join(found)


def graph_views(backend: TritonAttnBackend, meta: Any) -> dict[str, str]:
    """Which fixed buffer (and where in it) each metadata tensor is a view of."""
    buffers = {
        "_graph_batch": backend._graph_batch,
        "_graph_indptr": backend._graph_indptr,
        "_graph_rows": backend._graph_rows,
    }
    views = {}
    for name, value in vars(meta).items():
        if isinstance(value, torch.Tensor):
            ptr = value.untyped_storage().data_ptr()
            owner = [b for b, t in buffers.items() if t.untyped_storage().data_ptr() == ptr]
            where = f"offset {value.storage_offset()}, strides {value.stride()}"
            views[name] = f"a view of {owner[0]} at {where}" if owner else "not a fixed buffer"
    return views


@st.composite
def graph_batches(draw: st.DrawFn) -> tuple[int, int, list[tuple[int, int, int]]]:
    """init_cuda_graph's size (1 to 8), a graph's rows (up to it), and a decode batch of 0 up
    to that many requests on rows out of order."""
    max_batch = draw(st.integers(1, 8))
    graph_batch_size = draw(st.integers(1, max_batch))
    count = draw(st.integers(0, graph_batch_size))
    rows = draw(st.permutations(range(8)))[:count]
    return (
        max_batch,
        graph_batch_size,
        [(row, n - 1, n) for row in rows for n in [draw(st.integers(1, 40))]],
    )


@settings(max_examples=30)
@given(graph=graph_batches(), sm_count=st.sampled_from([1, 4, 132]), pad_page=st.integers(0, 3))
def test_prepare_for_graph_matches_the_reference(graph, sm_count, pad_page):
    """A batch written into the fixed buffers of a graph of its size or larger (padding rows),
    over what an earlier batch left there: the buffers' values after, the metadata (values,
    split count), and which fixed buffer each of its tensors is a view of."""
    max_batch, graph_batch_size, ledgers = graph

    def build() -> tuple:
        backend = backend_over(ledgers or [(0, 0, 1)], 2, 8, torch.float32, 0, sm_count)
        backend.init_cuda_graph(max_batch)
        earlier = torch.randint(
            1, 50, backend._graph_batch.shape, generator=torch.Generator().manual_seed(1)
        )
        backend._graph_batch.copy_(earlier)
        return backend, Batch(make_reqs(ledgers), "decode"), graph_batch_size, pad_page

    def observe(result: Any, backend: TritonAttnBackend, batch: Batch, *_: Any) -> tuple:
        meta = batch.attn_metadata
        return result, backend._graph_batch, meta, graph_views(backend, meta)

    assert_same_call(TritonAttnBackend.prepare_for_graph, build=build, observe=observe)
