"""Tests of problem 41 (TableManager.prepare_inputs), by hand and inside the scheduler."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.scheduler.table import TableManager
from submission import prepare_inputs

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

ROWS, MAX_SEQ_LEN = 4, 32


def setup(ledgers: list[tuple[int, int, int]], seed: int = 0):
    """ledgers: (row, cached_len, device_len). Fills the page table with scattered slots and the
    token pool with random ids; returns the table, the batch and the expected tensors."""
    gen = torch.Generator().manual_seed(seed)
    page_table = torch.zeros(ROWS, MAX_SEQ_LEN, dtype=torch.int32)
    table = TableManager(ROWS, page_table)
    # Every (row, position) gets its own slot, scattered over the pool as paging leaves them.
    table.page_table[:] = torch.randperm(ROWS * MAX_SEQ_LEN, generator=gen).view(ROWS, MAX_SEQ_LEN)
    table.token_pool[:] = torch.randint(
        0, 1000, (ROWS, MAX_SEQ_LEN), generator=gen, dtype=torch.int32
    )
    reqs, positions, ids, locs = [], [], [], []
    for uid, (row, cached, device_len) in enumerate(ledgers):
        req = Req(table.token_pool[row, :device_len].clone(), row, cached, 4, uid, SamplingParams())
        reqs.append(req)
        for pos in range(cached, device_len):
            positions.append(pos)
            ids.append(int(table.token_pool[row, pos]))
            locs.append(int(table.page_table[row, pos]))
    phase = "decode" if all(d - c == 1 for _, c, d in ledgers) else "prefill"
    return table, Batch(reqs, phase), positions, ids, locs


def check(ledgers):
    table, batch, positions, ids, locs = setup(ledgers)
    prepare_inputs(table, batch)
    for field, want in (("positions", positions), ("input_ids", ids), ("out_loc", locs)):
        got = getattr(batch, field, None)
        assert isinstance(got, torch.Tensor), (
            f"ledgers (row, cached_len, device_len) {ledgers}: batch.{field} must be a tensor, "
            f"got {type(got).__name__}"
        )
        assert got.tolist() == want, (
            f"ledgers (row, cached_len, device_len) {ledgers}: batch.{field}\n"
            f"expected {want}\ngot      {got.tolist()}"
        )
    assert batch.positions.dtype == torch.int64, (
        f"batch.positions must be int64 (it indexes the RoPE tables), got {batch.positions.dtype}"
    )


def test_example_one_request_with_a_cached_prefix():
    table = TableManager(2, torch.zeros(2, 8, dtype=torch.int32))
    table.page_table[1, :6] = torch.tensor([40, 41, 42, 43, 12, 13])
    table.token_pool[1, :6] = torch.tensor([7, 7, 7, 7, 8, 9])
    req = Req(torch.tensor([7, 7, 7, 7, 8, 9], dtype=torch.int32), 1, 4, 4, 0, SamplingParams())
    batch = Batch([req], "prefill")
    prepare_inputs(table, batch)
    got = (batch.positions.tolist(), batch.input_ids.tolist(), batch.out_loc.tolist())
    assert got == ([4, 5], [8, 9], [12, 13]), (
        f"(positions, input_ids, out_loc): expected ([4, 5], [8, 9], [12, 13]), got {got}"
    )


def test_example_prefill_of_two_requests():
    check([(2, 0, 5), (0, 0, 3)])


def test_prefill_mixing_cache_hits():
    check([(0, 0, 7), (3, 5, 9), (1, 10, 11)])


def test_decode_batch():
    check([(0, 4, 5), (1, 11, 12), (2, 20, 21), (3, 0, 1)])


def test_rows_in_any_order():
    check([(3, 2, 6), (0, 0, 2), (2, 7, 8)])


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_scheduler_runs_on_your_inputs(monkeypatch, page_size):
    from minisgl.llm import LLM

    kwargs = dict(
        num_pages=256 // page_size,
        page_size=page_size,
        max_running_req=4,
        max_seq_len=64,
        show_progress=False,
    )
    shared = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46]
    prompts = [shared + [1, 2], shared + [5], [9, 9, 9], shared + [7, 7, 7, 7, 7]]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    llm = LLM(str(MODELS / "tiny-qwen3"), **kwargs)
    want = [o["token_ids"] for o in llm.generate(prompts, params)]
    monkeypatch.setattr(TableManager, "prepare_inputs", prepare_inputs)
    got_cached = [o["token_ids"] for o in llm.generate(prompts, params)]  # prefix-cache hits
    got_fresh = [
        o["token_ids"] for o in LLM(str(MODELS / "tiny-qwen3"), **kwargs).generate(prompts, params)
    ]
    for label, got in (("on a fresh engine", got_fresh), ("with prefix-cache hits", got_cached)):
        assert got == want, (
            f"LLM.generate (page_size {page_size}, radix cache) {label} with "
            f"your prepare_inputs:\nexpected {want}\ngot      {got}"
        )
