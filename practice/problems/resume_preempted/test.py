"""Tests of problem 233: Bring a preempted request back."""

import os
import random
from pathlib import Path

import pytest
import torch

import minisgl.scheduler.preempt as preempt
from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.preempt import ResumedReq
from submission import resume

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it


def test_example_prompt_and_generated_tokens_come_back():
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    req = Req(torch.tensor([5, 6, 7], dtype=torch.int32), 0, 0, 10, 3, params)
    for token in (8, 9):
        req.complete_one()
        req.append_host(token)
    entry = resume(req)
    assert isinstance(entry, ResumedReq), f"expected a ResumedReq, got {type(entry).__name__}"
    assert entry.input_ids.tolist() == [5, 6, 7, 8, 9], entry.input_ids.tolist()
    assert entry.remaining == 8, f"remaining: expected 8, got {entry.remaining}"
    assert entry.uid == 3 and entry.sampling_params is params
    assert entry.chunked_req is None


def test_a_token_in_flight_is_not_part_of_the_new_prompt():
    req = Req(torch.tensor([1, 2], dtype=torch.int32), 0, 0, 5, 0, SamplingParams(max_tokens=5))
    req.complete_one()
    req.append_host(4)
    req.complete_one()  # launched, not yet seen by the host
    entry = resume(req)
    assert entry.input_ids.tolist() == [1, 2, 4], entry.input_ids.tolist()
    assert entry.output_len == 4 and entry.input_len + entry.output_len == req.max_device_len


def tokens(overlap: bool, admission: str) -> tuple[list[list[int]], int]:
    scheduler = Scheduler(
        SchedulerConfig(
            str(MODEL),
            device="cpu",
            show_progress=False,
            cache_type="radix",
            enable_overlap=overlap,
            admission=admission,
            num_pages=48,
            max_running_req=8,
        )
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 400) for _ in range(rng.randint(3, 16))] for _ in range(12)]
    uids = [
        scheduler.add_request(p, SamplingParams(max_tokens=14, ignore_eos=True)) for p in prompts
    ]
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    for _ in range(500):
        if not scheduler.has_work:
            break
        for o in scheduler.step():
            out[o.uid].append(o.token)
    assert not scheduler.has_work, "the scheduler never finished"
    scheduler.cache_manager.check_integrity()
    preemptor = getattr(scheduler.policy, "preemptor", None)
    return [out[u] for u in uids], preemptor.preemptions if preemptor else 0


@pytest.mark.parametrize("overlap", [False, True])
def test_preempted_requests_produce_the_tokens_of_an_unpreempted_run(overlap, monkeypatch):
    expected, _ = tokens(overlap, "conservative")
    monkeypatch.setattr(preempt, "resume", resume)
    got, preemptions = tokens(overlap, "optimistic")
    assert preemptions > 0, "the pool was meant to be tight enough to preempt"
    for i, (a, b) in enumerate(zip(expected, got)):
        assert a == b, f"request {i}: expected {a}, got {b}"
