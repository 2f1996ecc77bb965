"""Tests of problem 103: Make the request of a prefill chunk."""

import os
from pathlib import Path


import torch

from minisgl.core import Req, SamplingParams
from minisgl.kvcache import BaseCacheHandle
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
from minisgl.scheduler.utils import PendingReq
from submission import add_one_req

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it


def pending(prompt_len: int, max_tokens: int = 5, uid: int = 3) -> PendingReq:
    p = PendingReq(
        uid,
        torch.arange(10, 10 + prompt_len, dtype=torch.int32),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True),
    )
    return p


def adder(budget: int) -> PrefillAdder:
    return PrefillAdder(
        cache_manager=None, table_manager=None, token_budget=budget, reserved_size=0
    )


def check(prompt_len, cached_len, budget, chunk, device_len, budget_left):
    a, p, handle = adder(budget), pending(prompt_len), BaseCacheHandle(0)
    req = add_one_req(a, p, handle, 2, cached_len)
    call = f"prompt {prompt_len} tokens, cached_len {cached_len}, budget {budget}"
    kind = "ChunkedReq" if chunk else "Req"
    assert isinstance(req, Req), f"{call}: expected a {kind}, got {type(req).__name__}"
    assert isinstance(req, ChunkedReq) == chunk, (
        f"{call}: expected a {kind}, got {type(req).__name__}"
    )
    got = (req.cached_len, req.device_len)
    assert got == (cached_len, device_len), (
        f"{call}: expected cached_len, device_len = {(cached_len, device_len)}, got {got}"
    )
    assert req.input_ids.tolist() == p.input_ids[:device_len].tolist(), (
        f"{call}: input_ids must be the prompt's first {device_len} tokens"
    )
    assert a.token_budget == budget_left, (
        f"{call}: expected {budget_left} budget left, got {a.token_budget}"
    )
    assert (req.table_idx, req.uid, req.cache_handle, req.sampling_params) == (
        2,
        3,
        handle,
        p.sampling_params,
    ), (
        f"{call}: table_idx and cache_handle must be the ones given, uid and sampling_params "
        f"those of the pending request"
    )
    assert req.max_device_len == device_len + p.output_len, (
        f"{call}: output_len must be the pending request's max_tokens ({p.output_len})"
    )
    return req


def run(
    monkeypatch, patched: bool, *, cache_type: str, page_size: int, max_extend_tokens: int, trace
):
    with monkeypatch.context() as m:
        if patched:
            m.setattr(PrefillAdder, "_add_one_req", add_one_req)
        sched = Scheduler(
            SchedulerConfig(
                str(MODEL),
                device="cpu",
                show_progress=False,
                cache_type=cache_type,
                enable_overlap=False,
                page_size=page_size,
                num_pages=512 // page_size,
                max_running_req=4,
                max_extend_tokens=max_extend_tokens,
            )
        )
        for ids, max_tokens in trace:
            sched.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        outputs = []
        while sched.has_work:
            assert len(outputs) < 300, "the scheduler never finished (a request is stuck)"
            outputs.append([(o.uid, o.token, o.finished) for o in sched.step()])
        sched.cache_manager.check_integrity()
    return outputs, sched.stats.steps


def compare(monkeypatch, what, **kw):
    expected = run(monkeypatch, False, **kw)
    got = run(monkeypatch, True, **kw)
    assert got[1] == expected[1], (
        f"{what}: batches (phase, requests, tokens) per step\n"
        f"expected {expected[1]}\ngot      {got[1]}"
    )
    assert got[0] == expected[0], (
        f"{what}: outputs (uid, token, finished) per step\n"
        f"expected {expected[0]}\ngot      {got[0]}"
    )
    return expected


def ids(seed: int, n: int) -> list[int]:
    return [(41 * seed + 17 * j) % 4000 + 3 for j in range(n)]


# --- samples ---------------------------------------------------------------------------------


def test_example_the_first_chunk_of_a_long_prompt():
    check(300, 0, 96, chunk=True, device_len=96, budget_left=0)


def test_example_chunked_prefill_in_the_real_scheduler(monkeypatch):
    steps = compare(
        monkeypatch,
        "two long prompts, budget 16",
        cache_type="naive",
        page_size=1,
        max_extend_tokens=16,
        trace=[(ids(0, 40), 3), (ids(1, 7), 4), (ids(2, 35), 2)],
    )[1]
    assert sum(1 for phase, _, _ in steps if phase == "prefill") >= 6


# --- hidden ----------------------------------------------------------------------------------


def test_the_last_chunk():
    check(300, 288, 96, chunk=False, device_len=300, budget_left=84)


def test_a_middle_chunk():
    check(300, 96, 96, chunk=True, device_len=192, budget_left=0)


def test_a_whole_prompt_within_the_budget():
    check(20, 0, 96, chunk=False, device_len=20, budget_left=76)


def test_exactly_the_budget_is_not_a_chunk():
    check(96, 0, 96, chunk=False, device_len=96, budget_left=0)


def test_a_cached_prefix_is_not_computed_again():
    check(12, 8, 100, chunk=False, device_len=12, budget_left=96)


def test_a_cached_prefix_and_a_chunk():
    check(50, 8, 10, chunk=True, device_len=18, budget_left=0)


def test_the_remaining_budget_of_a_batch():
    a = adder(30)
    first = add_one_req(a, pending(20, uid=0), BaseCacheHandle(0), 0, 0)
    second = add_one_req(a, pending(25, uid=1), BaseCacheHandle(0), 1, 0)
    assert not isinstance(first, ChunkedReq) and first.device_len == 20
    assert isinstance(second, ChunkedReq) and second.device_len == 10, (
        f"budget 30, prompts of 20 then 25: the second gets a 10-token chunk, got "
        f"{type(second).__name__} with device_len {second.device_len}"
    )
    assert a.token_budget == 0, f"the budget must be spent: {a.token_budget} left"


def test_a_budget_of_one(monkeypatch):
    compare(
        monkeypatch,
        "budget 1",
        cache_type="naive",
        page_size=1,
        max_extend_tokens=1,
        trace=[(ids(3, 5), 3), (ids(4, 3), 2)],
    )


def test_chunks_with_a_radix_cache_and_pages_of_4(monkeypatch):
    system = ids(9, 18)
    trace = [(system + ids(i, n), 3) for i, n in enumerate([5, 9, 2, 7])]
    compare(
        monkeypatch,
        "shared prefix, radix, page 4, budget 7",
        cache_type="radix",
        page_size=4,
        max_extend_tokens=7,
        trace=trace,
    )
