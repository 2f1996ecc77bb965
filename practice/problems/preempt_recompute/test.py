"""Tests of problem 86: Preemption by recompute."""

import os
from pathlib import Path


from collections import defaultdict

from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.utils import PendingReq
from submission import preempt

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it


def ids(seed: int, n: int) -> list[int]:
    return [(37 * seed + 11 * j) % 4000 + 3 for j in range(n)]


def scheduler(**config) -> Scheduler:
    config = {"cache_type": "naive", "page_size": 1, "num_pages": 256, **config}
    return Scheduler(
        SchedulerConfig(
            str(MODEL), device="cpu", show_progress=False, enable_overlap=False, **config
        )
    )


def run(trace, preemptions=(), **config):
    """Run `trace` (prompt, max_tokens) through a real Scheduler, one step at a time.

    `preemptions` holds (uid, n) pairs: right after the step in which request `uid` emitted
    its n-th token, call `preempt` on it. Returns (tokens per uid, (uid, finish_reason) per
    output, the scheduler, a log of each re-admission: (uid, prompt length, computed))."""
    sched = scheduler(**config)
    for prompt, max_tokens in trace:
        sched.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    todo = defaultdict(list)
    for uid, n in preemptions:
        todo[uid].append(n)
    tokens: dict[int, list[int]] = defaultdict(list)
    finished: list[tuple[int, str | None]] = []
    readmissions = []  # (uid, new prompt length, prompt tokens computed by its re-admission)
    waiting: dict[int, PendingReq] = {}  # preempted, not yet re-admitted
    steps = 0
    while sched.has_work:
        steps += 1
        assert steps < 200, "the scheduler never finished (a request is stuck)"
        computed = sched.stats.computed_prompt_tokens
        outputs = sched.step()
        if sched.stats.steps[-1][0] == "prefill":
            queued = {p.uid for p in sched.prefill_manager.pending_list}
            for uid in [u for u in waiting if u not in queued]:
                pending = waiting.pop(uid)
                delta = sched.stats.computed_prompt_tokens - computed
                readmissions.append((uid, pending.input_len, delta))
        for out in outputs:
            tokens[out.uid].append(out.token)
            finished.append((out.uid, out.finish_reason))
        for out in outputs:
            if len(tokens[out.uid]) in todo[out.uid]:
                req = sched.decode_manager.running_reqs.get(out.uid)
                assert req is not None, (
                    f"request {out.uid} should still be running after its token "
                    f"{len(tokens[out.uid])} (the test preempts it there), but it is not in "
                    f"running_reqs: {list(sched.decode_manager.running_reqs)}"
                )
                pending = preempt(sched, req)
                assert isinstance(pending, PendingReq), (
                    f"preempt must return the PendingReq it queued, got {pending!r}"
                )
                queue = sched.prefill_manager.pending_list
                assert queue and queue[0] is pending, (
                    f"the preempted request {out.uid} must be at the head of the waiting "
                    f"queue; the queue holds uids {[p.uid for p in queue]}"
                )
                assert out.uid not in sched.decode_manager.running_reqs, (
                    f"the preempted request {out.uid} is still in running_reqs"
                )
                waiting[out.uid] = pending
    return dict(tokens), finished, sched, readmissions


def check(trace, preemptions, **config):
    """Compare a run with preemptions against an unpreempted one; check the idle state."""
    what = f"preemptions {list(preemptions)} (uid, after its n-th token), config {config}"
    expected, _, _, _ = run(trace, **config)
    got, finished, sched, readmissions = run(trace, preemptions, **config)
    for uid in sorted(expected):
        assert got.get(uid) == expected[uid], (
            f"{what}: request {uid} must emit the same greedy tokens as without preemption "
            f"(none twice, none lost)\nexpected {expected[uid]}\ngot      {got.get(uid)}"
        )
    assert sorted(got) == sorted(expected), f"{what}: uids {sorted(got)} != {sorted(expected)}"
    for uid in expected:
        ends = [(i, reason) for i, (u, reason) in enumerate(finished) if u == uid and reason]
        last = max(i for i, (u, _) in enumerate(finished) if u == uid)
        assert ends == [(last, "length")], (
            f"{what}: request {uid} must finish once, on its last token, with 'length'; "
            f"its finishing outputs: {ends}"
        )
    status = sched.status()
    assert status.running == 0 and status.waiting == 0, f"{what}: not idle at the end: {status}"
    assert status.used_pages == 0, (
        f"{what}: {status.used_pages} pages still held by requests when idle: {status}"
    )
    assert status.integrity_ok, f"{what}: the idle integrity check did not pass: {status}"
    sched.cache_manager.check_integrity()
    rows = sched.table_manager.available_size
    assert rows == sched.config.max_running_req, (
        f"{what}: {sched.config.max_running_req - rows} table rows never given back"
    )
    return got, readmissions


TRACE = [(ids(0, 7), 8), (ids(1, 5), 9), (ids(2, 9), 7)]


# --- samples ---------------------------------------------------------------------------------


def test_example_preempt_one_request_mid_decode():
    _, readmissions = check(TRACE, [(1, 3)])
    assert readmissions and readmissions[0][:2] == (1, 5 + 3), (
        f"request 1 (5 prompt tokens) preempted after 3 tokens must come back with a prompt "
        f"of 8 tokens; re-admissions (uid, prompt length, computed): {readmissions}"
    )


# --- hidden ----------------------------------------------------------------------------------


def test_several_preemptions_one_request_twice():
    trace = TRACE + [(ids(3, 4), 10), (ids(4, 6), 6)]
    check(trace, [(0, 2), (2, 3), (3, 4), (0, 5), (4, 2)], max_running_req=4)


def test_the_radix_cache_keeps_the_prefix_for_the_recompute():
    for page_size in (1, 4):
        _, readmissions = check(TRACE, [(0, 4), (2, 2)], cache_type="radix", page_size=page_size)
        assert len(readmissions) == 2, f"expected 2 re-admissions, got {readmissions}"
        for uid, prompt_len, computed in readmissions:
            # Everything but the last token was cached by cache_req; whole pages are matched.
            expected = prompt_len - (prompt_len - 1) // page_size * page_size
            assert computed == expected, (
                f"radix cache, page size {page_size}: request {uid} came back with a prompt of "
                f"{prompt_len} tokens; its computed prefix (all but the last token, in whole "
                f"pages) is cached, so its prefill should compute {expected} tokens, not "
                f"{computed}. Hand its pages to the cache as a finished request would."
            )


def test_preempt_right_after_the_prefill():
    check(TRACE, [(0, 1), (2, 1)])
    check(TRACE, [(1, 1), (1, 2)], cache_type="radix", page_size=2)


def test_preempt_with_a_waiting_queue():
    # Two rows: requests wait; the preempted one goes first, before those still waiting.
    trace = TRACE + [(ids(5, 6), 5)]
    check(trace, [(0, 3), (1, 2)], max_running_req=2, cache_type="radix", page_size=4)
