"""Tests of problem 44 (TableManager.write_next_tokens), by hand and inside the scheduler."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.scheduler.prefill import ChunkedReq
from minisgl.scheduler.table import TableManager
from submission import write_next_tokens

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

ROWS, MAX_SEQ_LEN = 4, 16


def make_table() -> TableManager:
    table = TableManager(ROWS, torch.zeros(ROWS, MAX_SEQ_LEN, dtype=torch.int32))
    table.token_pool[:] = -torch.arange(ROWS * MAX_SEQ_LEN, dtype=torch.int32).view(ROWS, -1) - 1
    return table


def make_req(row: int, device_len: int, cached_len: int, chunk: bool = False) -> Req:
    kind = ChunkedReq if chunk else Req
    return kind(
        torch.zeros(device_len, dtype=torch.int32), row, cached_len, 4, row, SamplingParams()
    )


def check(reqs: list[Req], tokens: list[int], phase: str) -> None:
    table = make_table()
    expected = table.token_pool.clone()
    for req, token in zip(reqs, tokens):
        if req.can_decode:
            expected[req.table_idx, req.device_len] = token
    write_next_tokens(table, Batch(reqs, phase), torch.tensor(tokens, dtype=torch.int64))
    desc = [(r.table_idx, r.device_len, "chunk" if not r.can_decode else "decodes") for r in reqs]
    assert table.token_pool.dtype == torch.int32, (
        f"the token pool must stay int32, it became {table.token_pool.dtype}"
    )
    wrong = (table.token_pool != expected).nonzero().tolist()
    assert not wrong, (
        f"requests (row, device_len, kind) {desc}, next_tokens {tokens}: token pool entries "
        f"[row, col] {wrong[:4]} are wrong, e.g. {wrong[0]}: expected "
        f"{int(expected[tuple(wrong[0])])}, got {int(table.token_pool[tuple(wrong[0])])}"
    )


def test_example_two_requests():
    check([make_req(2, 5, 4), make_req(0, 3, 2)], [11, 22], "decode")


def test_prefill_writes_after_the_prompt():
    check([make_req(1, 7, 0), make_req(3, 2, 0)], [5, 6], "prefill")


def test_a_chunk_is_skipped_and_does_not_shift_the_others():
    check(
        [make_req(0, 6, 0, chunk=True), make_req(1, 4, 0), make_req(2, 9, 3)],
        [100, 200, 300],
        "prefill",
    )


def test_only_chunks_write_nothing():
    check([make_req(3, 8, 0, chunk=True)], [7], "prefill")


def test_the_scheduler_runs_on_your_writes(monkeypatch):
    from minisgl.llm import LLM

    kwargs = dict(
        num_pages=256,
        max_running_req=4,
        max_seq_len=64,
        cache_type="naive",
        max_extend_tokens=8,
        show_progress=False,
    )  # a 20-token prompt takes 3 chunks
    prompts = [[(5 * i) % 97 + 3 for i in range(20)], [4, 5, 6]]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    llm = LLM(str(MODELS / "tiny-qwen3"), **kwargs)
    want = [o["token_ids"] for o in llm.generate(prompts, params)]
    monkeypatch.setattr(TableManager, "write_next_tokens", write_next_tokens)
    got = [o["token_ids"] for o in llm.generate(prompts, params)]
    assert got == want, (
        f"LLM.generate with chunked prefill (max_extend_tokens=8) and your "
        f"write_next_tokens:\nexpected {want}\ngot      {got}"
    )
