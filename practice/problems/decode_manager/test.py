"""Tests of problem 72: The decode manager."""

import os
from pathlib import Path


import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from submission import DecodeManager

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it


def make_req(uid: int, prompt_len: int, max_tokens: int, forwards: int = 1) -> Req:
    """A request after `forwards` forwards (1 = just prefilled)."""
    req = Req(
        torch.arange(1, prompt_len + 1, dtype=torch.int32),
        table_idx=uid,
        cached_len=0,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )
    for _ in range(forwards):
        req.complete_one()
    return req


def uids(dm: DecodeManager) -> list[int]:
    return list(dm.running_reqs)


def run(
    monkeypatch,
    patched: bool,
    eos: set[int] | None = None,
    overlap: bool = False,
    ignore_eos: bool = True,
):
    """Run a fixed trace through a real Scheduler; return per-step outputs and batch shapes."""
    with monkeypatch.context() as m:
        if patched:
            m.setattr("minisgl.scheduler.scheduler.DecodeManager", DecodeManager)
        sched = Scheduler(
            SchedulerConfig(
                str(MODEL),
                device="cpu",
                show_progress=False,
                cache_type="naive",
                enable_overlap=overlap,
                page_size=2,
                num_pages=30,
                max_running_req=4,
            )
        )
    if eos is not None:
        sched.eos_token_ids = set(eos)
    for i, (plen, max_tokens) in enumerate([(12, 6), (9, 8), (15, 3), (7, 7), (11, 5), (5, 2)]):
        ids = [(37 * i + 11 * j) % 4000 + 3 for j in range(plen)]
        sched.add_request(ids, SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos))
    outputs = []
    while sched.has_work:
        assert len(outputs) < 200, "the scheduler never finished (a request is stuck)"
        outputs.append([(o.uid, o.token, o.finished) for o in sched.step()])
    sched.cache_manager.check_integrity()
    return outputs, sched.stats.steps


def compare(monkeypatch, what: str, **kw):
    expected = run(monkeypatch, patched=False, **kw)
    got = run(monkeypatch, patched=True, **kw)
    assert got[1] == expected[1], (
        f"{what}: batches (phase, requests, tokens) per step\n"
        f"expected {expected[1]}\ngot      {got[1]}"
    )
    assert got[0] == expected[0], (
        f"{what}: outputs (uid, token, finished) per step\n"
        f"expected {expected[0]}\ngot      {got[0]}"
    )
    return expected


# --- samples ---------------------------------------------------------------------------------


def test_example_a_prefilled_request_joins_and_decodes():
    dm = DecodeManager(page_size=4)
    r = make_req(0, prompt_len=3, max_tokens=3)
    dm.filter_reqs([r])
    assert dm.runnable, "a request that can decode joined, but runnable is False"
    assert dm.inflight_tokens == 6, (
        f"one request with remain_len 2, page_size 4: expected "
        f"inflight_tokens 6, got {dm.inflight_tokens}"
    )
    batch = dm.schedule_next_batch()
    assert batch is not None and batch.phase == "decode" and batch.reqs == [r], (
        f"expected Batch([r], 'decode'), got {batch}"
    )


def test_example_the_real_scheduler_runs_the_same_steps(monkeypatch):
    compare(monkeypatch, "6 requests, 30 pages of 2 tokens, 4 rows")


# --- hidden ----------------------------------------------------------------------------------


def test_nothing_running():
    dm = DecodeManager(page_size=1)
    assert not dm.runnable, "a new DecodeManager has nothing running"
    assert dm.inflight_tokens == 0, f"nothing running: expected 0, got {dm.inflight_tokens}"
    assert dm.schedule_next_batch() is None, "nothing running: expected None"


def test_a_request_that_reached_max_tokens_leaves():
    dm = DecodeManager(page_size=1)
    a, b = make_req(0, 4, max_tokens=2), make_req(1, 4, max_tokens=5)
    dm.filter_reqs([a, b])
    assert uids(dm) == [0, 1], f"both can decode: expected running [0, 1], got {uids(dm)}"
    a.complete_one()
    b.complete_one()  # a now has its 2 tokens on the device: remain_len 0
    dm.filter_reqs([a, b])
    assert uids(dm) == [1], f"request 0 reached max_tokens: expected running [1], got {uids(dm)}"


def test_a_request_with_max_tokens_1_never_joins():
    dm = DecodeManager(page_size=1)
    dm.filter_reqs([make_req(3, 5, max_tokens=1)])
    assert uids(dm) == [], f"max_tokens=1 is done after prefill: expected [], got {uids(dm)}"


def test_staying_requests_keep_their_admission_order():
    dm = DecodeManager(page_size=1)
    reqs = [make_req(uid, 4, max_tokens=9) for uid in (5, 2, 7)]
    dm.filter_reqs(reqs)
    for req in reqs:
        req.complete_one()
    dm.filter_reqs([reqs[2], reqs[0]])  # a later batch lists them in another order
    dm.filter_reqs([make_req(1, 3, max_tokens=4)])
    assert uids(dm) == [5, 2, 7, 1], f"expected admission order [5, 2, 7, 1], got {uids(dm)}"
    batch = dm.schedule_next_batch()
    assert [r.uid for r in batch.reqs] == [5, 2, 7, 1], (
        f"decode batch order: expected [5, 2, 7, 1], got {[r.uid for r in batch.reqs]}"
    )


def test_remove_req_and_removing_twice():
    dm = DecodeManager(page_size=1)
    a, b = make_req(0, 4, 5), make_req(1, 4, 5)
    dm.filter_reqs([a, b])
    dm.remove_req(a)
    assert uids(dm) == [1], f"after remove_req(0): expected [1], got {uids(dm)}"
    dm.remove_req(a)  # not running any more: no error
    dm.remove_req(make_req(9, 2, 2))
    assert uids(dm) == [1], f"removing requests that are not running changed it to {uids(dm)}"


def test_inflight_tokens_counts_remaining_tokens_and_a_page_each():
    dm = DecodeManager(page_size=16)
    a = make_req(0, 10, max_tokens=8, forwards=1)  # remain 7
    b = make_req(1, 3, max_tokens=20, forwards=5)  # remain 15
    dm.filter_reqs([a, b])
    assert dm.inflight_tokens == 7 + 16 + 15 + 16, (
        f"remain_len 7 and 15, page_size 16: expected {7 + 16 + 15 + 16}, got {dm.inflight_tokens}"
    )
    a.complete_one()
    assert dm.inflight_tokens == 6 + 16 + 15 + 16, (
        f"after one more token of request 0: expected {6 + 16 + 15 + 16}, "
        f"got {dm.inflight_tokens} (compute it from the ledgers, do not cache it)"
    )


def test_schedule_returns_a_decode_batch():
    dm = DecodeManager(page_size=1)
    dm.filter_reqs([make_req(0, 4, 3)])
    batch = dm.schedule_next_batch()
    assert isinstance(batch, Batch), f"expected a Batch, got {type(batch).__name__}"
    assert batch.phase == "decode", f"expected phase 'decode', got {batch.phase!r}"


def test_early_finish_by_eos_in_the_real_scheduler(monkeypatch):
    first = run(monkeypatch, patched=False)[0]
    eos_token = next(tok for step in first for uid, tok, _ in step if uid == 0)
    compare(monkeypatch, f"EOS = token {eos_token}", eos={eos_token}, ignore_eos=False)


def test_overlap_scheduling_in_the_real_scheduler(monkeypatch):
    first = run(monkeypatch, patched=False)[0]
    eos_token = [tok for step in first for uid, tok, _ in step if uid == 1][2]
    compare(
        monkeypatch,
        f"overlap on, EOS = token {eos_token}",
        eos={eos_token},
        ignore_eos=False,
        overlap=True,
    )
