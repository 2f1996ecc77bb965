"""Tests of problem 11 (the Req ledger), alone and inside the real scheduler."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from minisgl.core import Req, SamplingParams
import submission

MODELS = Path(os.environ["PRACTICE_MODELS"])  # the repository's models/: the judge sets it

PROMPTS = [
    [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45],  # the last two share a long prefix
    [1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53],
    [2, 4, 8],
]


def make_req(prompt_len: int, cached_len: int, output_len: int) -> Req:
    return Req(
        torch.arange(prompt_len, dtype=torch.int32),
        table_idx=0,
        cached_len=cached_len,
        output_len=output_len,
        uid=0,
        sampling_params=SamplingParams(),
    )


def ledger(req: Req) -> tuple[int, int, int]:
    return req.cached_len, req.device_len, req.max_device_len


def derived(req: Req) -> tuple[int, int, bool]:
    return (submission.extend_len(req), submission.remain_len(req), submission.can_decode(req))


def test_example_prefill_after_a_prefix_hit():
    req = make_req(5, 2, 3)
    got = derived(req)
    assert got == (3, 3, True), (
        f"Req(prompt 5, cached_len 2, max_tokens 3): (extend_len, "
        f"remain_len, can_decode) expected (3, 3, True), got {got}"
    )


def test_example_complete_one_moves_the_ledger():
    req = make_req(5, 2, 3)
    submission.complete_one(req)
    assert ledger(req) == (5, 6, 8), (
        f"after complete_one on Req(prompt 5, cached_len 2, "
        f"max_tokens 3): (cached_len, device_len, max_device_len) "
        f"expected (5, 6, 8), got {ledger(req)}"
    )


def test_decode_steps_until_done():
    req = make_req(4, 0, 3)  # device_len 4, max_device_len 7
    seen = [derived(req)]
    for _ in range(3):
        submission.complete_one(req)
        seen.append(derived(req))
    expected = [(4, 3, True), (1, 2, True), (1, 1, True), (1, 0, False)]
    assert seen == expected, (
        f"Req(prompt 4, max_tokens 3): (extend_len, remain_len, "
        f"can_decode) before each of 3 forwards and after:\n"
        f"expected {expected}\ngot      {seen}"
    )


def test_complete_one_changes_only_the_two_lengths():
    req = make_req(6, 0, 2)
    ids = req.input_ids.clone()
    submission.complete_one(req)
    assert req.max_device_len == 8 and torch.equal(req.input_ids, ids), (
        "complete_one must not touch max_device_len or input_ids (the token itself is appended "
        "later by append_host)"
    )
    assert submission.complete_one(req) is None


def test_one_token_request_is_done_after_prefill():
    req = make_req(3, 0, 1)
    assert derived(req) == (3, 1, True), f"got {derived(req)}"
    submission.complete_one(req)
    assert derived(req) == (1, 0, False), (
        f"Req(prompt 3, max_tokens 1) after its prefill: expected (1, 0, False), got {derived(req)}"
    )


@pytest.fixture(scope="module")
def llm():
    from minisgl.llm import LLM

    return LLM(
        str(MODELS / "tiny-qwen3"),
        num_pages=512,
        max_running_req=4,
        max_seq_len=128,
        show_progress=False,
    )


def run(llm, max_tokens: int) -> tuple[list[list[int]], int]:
    scheduler = llm.scheduler
    before = scheduler.stats.computed_prompt_tokens
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return [o["token_ids"] for o in outs], scheduler.stats.computed_prompt_tokens - before


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Req, "extend_len", property(submission.extend_len))
    monkeypatch.setattr(Req, "remain_len", property(submission.remain_len))
    monkeypatch.setattr(Req, "can_decode", property(submission.can_decode))
    monkeypatch.setattr(Req, "complete_one", submission.complete_one)


@pytest.mark.parametrize("max_tokens", [1, 6])
def test_the_scheduler_runs_on_your_ledger(llm, monkeypatch, max_tokens):
    from minisgl.llm import LLM

    fresh = LLM(
        llm.scheduler.config.model_path,
        num_pages=512,
        max_running_req=4,
        max_seq_len=128,
        show_progress=False,
    )
    want, want_computed = run(fresh, max_tokens)
    install(monkeypatch)
    got, computed = run(llm, max_tokens)
    assert got == want, (
        f"LLM.generate({PROMPTS}, max_tokens={max_tokens}) on tiny-qwen3 with "
        f"your ledger:\nexpected {want}\ngot      {got}"
    )
    llm.scheduler.cache_manager.check_integrity()
    assert computed <= want_computed, (
        f"prompt tokens computed: {computed}, the reference computes {want_computed}"
    )
