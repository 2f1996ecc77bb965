"""Tests of problem 113: One overlapped step."""

import os
from pathlib import Path


from minisgl.core import SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from submission import overlap_loop

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it


def ids(seed: int, n: int) -> list[int]:
    return [(29 * seed + 13 * j) % 4000 + 3 for j in range(n)]


TRACE = [(ids(0, 9), 6), (ids(1, 4), 3), (ids(2, 12), 8), (ids(3, 6), 1), (ids(4, 7), 5)]


def run(monkeypatch, patched: bool, trace=TRACE, eos=None, **config):
    with monkeypatch.context() as m:
        if patched:
            m.setattr(Scheduler, "overlap_loop", overlap_loop)
        settings = (
            dict(
                device="cpu",
                show_progress=False,
                cache_type="naive",
                enable_overlap=True,
                num_pages=512,
                max_running_req=3,
            )
            | config
        )
        sched = Scheduler(SchedulerConfig(str(MODEL), **settings))
        if eos is not None:
            sched.eos_token_ids = set(eos)
        for prompt, max_tokens in trace:
            sched.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=eos is None))
        outputs = []
        while sched.has_work:
            assert len(outputs) < 300, "the scheduler never finished (has_work stays true)"
            outputs.append([(o.uid, o.token, o.finished) for o in sched.step()])
        sched.cache_manager.check_integrity()
    return outputs, sched.stats.steps


def compare(monkeypatch, what: str, **kw):
    expected = run(monkeypatch, False, **kw)
    got = run(monkeypatch, True, **kw)
    if got[0] != expected[0]:
        first = next(
            (i for i, (g, e) in enumerate(zip(got[0], expected[0])) if g != e),
            min(len(got[0]), len(expected[0])),
        )
        raise AssertionError(
            f"{what}: outputs (uid, token, finished) of step {first}: expected "
            f"{expected[0][first] if first < len(expected[0]) else 'no step'}, got "
            f"{got[0][first] if first < len(got[0]) else 'no step'} "
            f"({len(expected[0])} steps expected, {len(got[0])} run)"
        )
    assert got[1] == expected[1], (
        f"{what}: batches (phase, requests, tokens)\nexpected {expected[1]}\ngot      {got[1]}"
    )
    return expected


# --- samples ---------------------------------------------------------------------------------


def test_example_one_request_results_lag_one_step(monkeypatch):
    outputs, _ = run(monkeypatch, True, trace=[(ids(0, 5), 3)])
    shape = [[(uid, finished) for uid, _, finished in step] for step in outputs]
    assert shape == [[], [(0, False)], [(0, False)], [(0, True)]], (
        f"one request, max_tokens=3: expected steps [], [tok], [tok], [tok finished]; got {outputs}"
    )


def test_example_the_real_scheduler_with_overlap(monkeypatch):
    compare(monkeypatch, "five requests, three rows, overlap on")


# --- hidden ----------------------------------------------------------------------------------


def test_the_same_tokens_as_the_plain_loop(monkeypatch):
    overlapped, _ = run(monkeypatch, True)
    plain, _ = run(monkeypatch, False, enable_overlap=False)

    def per_request(steps):
        tokens = {}
        for step in steps:
            for uid, token, _ in step:
                tokens.setdefault(uid, []).append(token)
        return tokens

    assert per_request(overlapped) == per_request(plain), (
        f"overlap must not change what is generated:\nplain loop {per_request(plain)}\n"
        f"overlapped {per_request(overlapped)}"
    )


def test_eos_hits_drop_the_extra_token(monkeypatch):
    first, _ = run(monkeypatch, False)
    tokens = [tok for step in first for uid, tok, _ in step if uid in (0, 2)]
    compare(monkeypatch, f"EOS = {{{tokens[1]}, {tokens[4]}}}", eos={tokens[1], tokens[4]})


def test_chunked_prefill_and_the_radix_cache(monkeypatch):
    system = ids(7, 20)
    trace = [(system + ids(i, n), m) for i, (n, m) in enumerate([(5, 4), (9, 2), (3, 6), (6, 3)])]
    compare(
        monkeypatch,
        "radix, page 2, budget 16",
        trace=trace,
        cache_type="radix",
        page_size=2,
        num_pages=256,
        max_extend_tokens=16,
    )


def test_a_small_pool_with_admission_waits(monkeypatch):
    compare(monkeypatch, "40 slots", num_pages=40)
