"""Chapter 11 tests: overlap scheduling (Scheduler.overlap_loop).

With overlap on, step N launches batch N+1 and only then processes the results of batch N, so
a batch's tokens come back one step late. Its two hazards are tested directly: a request that
samples EOS in batch N is already in batch N+1 (that extra token is dropped and the request is
freed once), and a request must still get exactly max_tokens tokens. Outputs must equal the
plain loop's and transformers' greedy `generate`, with and without the radix cache and chunked
prefill, for page sizes 1 and 16.
"""

from __future__ import annotations

import random

import pytest
from conftest import (
    TINY_MODELS,
    assert_same_trace,
    encode,
    engine_config,
    generate as generate_idle,
    greedy,
    hf_greedy_cached,
    llm_fixture,
    random_prompts,
    run_until_idle,
    scheduler_trace,
)

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler, SchedulerConfig

QWEN3 = TINY_MODELS["qwen3"]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hi",
    "The capital of France is Paris, and the capital of Italy is",
]
MAX_TOKENS = [9, 4, 12, 1, 6]


config = engine_config(enable_overlap=True)


def generate(llm: LLM, prompts: list[list[int]], params) -> list[dict]:
    """LLM.generate, after which the scheduler must be idle and no page leaked
    (conftest.generate), and no request or table row is left behind by the lagged step."""
    outputs = generate_idle(llm, prompts, params)
    scheduler = llm.scheduler
    assert not scheduler.decode_manager.running_reqs
    assert scheduler.table_manager.available_size == scheduler.config.max_running_req
    return outputs


llms = llm_fixture(config)


# --- parity ----------------------------------------------------------------------------------

SETUPS = {
    "page1-naive": dict(page_size=1),
    "page16-naive-chunk32": dict(page_size=16, max_extend_tokens=32),
    "page1-radix-chunk7": dict(page_size=1, cache_type="radix", max_extend_tokens=7),
    "page16-radix": dict(page_size=16, cache_type="radix"),
}


@pytest.mark.parametrize("setup", list(SETUPS))
def test_overlap_output_equals_the_plain_loop_and_transformers(tiny_model_dir, setup, llms):
    llm = llms(tiny_model_dir, **SETUPS[setup])
    scheduler = llm.scheduler
    assert scheduler.overlap
    prompts = encode(tiny_model_dir, PROMPTS)
    params = [greedy(n) for n in MAX_TOKENS]
    overlapped = generate(llm, prompts, params)
    scheduler.overlap = False  # the same engine (and, with radix, a warm cache) without overlap
    try:
        plain = generate(llm, prompts, params)
    finally:
        scheduler.overlap = True
    for ids, a, b in zip(prompts, overlapped, plain):
        assert a["token_ids"] == b["token_ids"], "overlap changed the output"
        assert a["token_ids"] == hf_greedy_cached(tiny_model_dir, ids, len(a["token_ids"]))
        assert len(a["token_ids"]) == a["sampling_params"]["max_tokens"]


# --- the overlap itself ----------------------------------------------------------------------


def test_with_overlap_a_batch_results_arrive_one_step_later():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config()))
    ids = encode(QWEN3, PROMPTS[:1])[0]
    uid = scheduler.add_request(ids, greedy(3))
    steps = run_until_idle(scheduler)
    assert steps[0] == [], "the first step launches the prefill; its token comes next step"
    assert [[(o.uid, o.finished) for o in outs] for outs in steps[1:]] == [
        [(uid, False)],
        [(uid, False)],
        [(uid, True)],
    ]
    assert [o.token for outs in steps for o in outs] == hf_greedy_cached(QWEN3, ids, 3)
    assert [phase for phase, _, _ in scheduler.stats.steps] == ["prefill", "decode", "decode"], (
        "no batch is launched past max_tokens"
    )


@pytest.mark.parametrize("setup", ["page1-naive", "page16-radix"])
def test_with_overlap_requests_get_exactly_max_tokens(setup, llms):
    llm = llms(QWEN3, **SETUPS[setup])
    ids = encode(QWEN3, PROMPTS[:3])
    stats = llm.scheduler.stats
    start = len(stats.steps)
    outputs = generate(llm, ids, [greedy(n) for n in (1, 2, 3)])
    for n, (p, out) in enumerate(zip(ids, outputs), 1):
        assert out["token_ids"] == hf_greedy_cached(QWEN3, p, n), f"max_tokens={n}"
        assert out["finish_reason"] == "length"
    sizes = [(phase, size) for phase, size, _ in stats.steps[start:]]
    assert sizes == [("prefill", 3), ("decode", 2), ("decode", 1)], (
        "a request that reached max_tokens is in no further batch"
    )


@pytest.mark.parametrize("setup", ["page1-naive", "page16-radix"])
@pytest.mark.parametrize("eos_at", [0, 2])
def test_with_overlap_a_request_stopped_by_eos_drops_its_extra_token_and_is_freed_once(
    setup, eos_at, llms, monkeypatch
):
    """Make a token of the greedy continuation an EOS token. The request that samples it in
    batch N is already in batch N+1 (its ledger could not know); that batch's token for it
    must be dropped, and its pages freed once (a double free fails the integrity check)."""
    llm = llms(QWEN3, **SETUPS[setup])
    stopping, running = encode(QWEN3, [PROMPTS[0], PROMPTS[2]])
    expected = hf_greedy_cached(QWEN3, stopping, 10)
    stop = next(i for i in range(eos_at, 10) if expected[i] not in expected[:i])
    monkeypatch.setattr(llm.scheduler, "eos_token_ids", {expected[stop]})
    assert expected[stop] not in hf_greedy_cached(QWEN3, running, 10)
    stats = llm.scheduler.stats
    start = len(stats.steps)
    stopped, other = generate(
        llm, [stopping, running], [SamplingParams(max_tokens=10), SamplingParams(max_tokens=10)]
    )
    assert stopped["token_ids"] == expected[: stop + 1], "tokens after EOS must be dropped"
    assert stopped["finish_reason"] == "stop"
    assert other["token_ids"] == hf_greedy_cached(QWEN3, running, 10)
    assert other["finish_reason"] == "length"
    decode_sizes = [size for phase, size, _ in stats.steps[start:] if phase == "decode"]
    assert decode_sizes.count(2) == stop + 1, (
        "the stopped request rode along in one batch after the one that sampled its EOS"
    )


# --- switching it on and off -----------------------------------------------------------------


@pytest.mark.parametrize("setup", ["page1-naive", "page16-radix"])
def test_with_overlap_an_aborted_request_is_freed_once_no_launched_batch_uses_it(setup):
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(**SETUPS[setup])))
    kept, aborted = encode(QWEN3, PROMPTS[:2])
    uids = [scheduler.add_request(ids, greedy(8)) for ids in (kept, aborted)]
    scheduler.step()  # launches the prefill
    scheduler.step()  # launches a decode, then processes the prefill
    rows = scheduler.table_manager.available_size
    assert scheduler.abort_request(uids[1])
    assert scheduler.table_manager.available_size == rows, (
        "the aborted request's row is freed too early: the batch in flight still uses it"
    )
    outputs = scheduler.step()  # processes that batch: the aborted request's token is dropped
    assert scheduler.table_manager.available_size == rows + 1, (
        "once no launched batch uses it, the aborted request's row is free"
    )
    steps = [outputs] + run_until_idle(scheduler)
    assert uids[1] not in {out.uid for outs in steps for out in outs}, (
        "an aborted request produced a token"
    )
    assert [out.token for outs in steps for out in outs] == hf_greedy_cached(QWEN3, kept, 8)[1:]


def test_with_overlap_aborting_a_prompt_whose_chunk_is_in_flight_leaks_nothing():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(**SETUPS["page1-radix-chunk7"])))
    long_prompt = encode(QWEN3, PROMPTS[2:3])[0]
    assert len(long_prompt) > 7
    uid = scheduler.add_request(long_prompt, greedy(4))
    scheduler.step()  # launches the first chunk
    assert scheduler.abort_request(uid)
    assert not scheduler.prefill_manager.pending_list
    steps = run_until_idle(scheduler)  # the integrity check finds no leaked page or lock
    assert not [out for outs in steps for out in outs]
    assert scheduler.table_manager.available_size == scheduler.config.max_running_req


def test_overlap_is_on_by_default_and_minisgl_disable_overlap_turns_it_off(monkeypatch):
    ids = encode(QWEN3, PROMPTS[:1])[0]
    expected = hf_greedy_cached(QWEN3, ids, 3)

    def first_two_steps(scheduler: Scheduler) -> list[list[int]]:
        scheduler.add_request(ids, greedy(3))
        steps = run_until_idle(scheduler)
        assert [o.token for outs in steps for o in outs] == expected
        return [[o.token for o in outs] for outs in steps[:2]]

    monkeypatch.delenv("MINISGL_DISABLE_OVERLAP_SCHEDULING", raising=False)
    default = Scheduler(SchedulerConfig(str(QWEN3), **config(enable_overlap=None)))
    assert default.overlap
    assert first_two_steps(default) == [[], expected[:1]], "overlap: results come a step late"

    monkeypatch.setenv("MINISGL_DISABLE_OVERLAP_SCHEDULING", "1")
    disabled = Scheduler(SchedulerConfig(str(QWEN3), **config(enable_overlap=None)))
    assert not disabled.overlap
    assert first_two_steps(disabled) == [expected[:1], expected[1:2]]
    forced = Scheduler(SchedulerConfig(str(QWEN3), **config(enable_overlap=True)))
    assert forced.overlap, "an explicit enable_overlap=True wins over the environment"
    assert first_two_steps(forced) == [[], expected[:1]]


# --- every stub against the reference (tools/course/differential.py) ---
# overlap_loop shows only through the scheduler's loop: seeded random workloads run with
# overlap on, your loop against the chapter's reference one, event by event (every batch
# launched with its requests' lengths, rows, input ids, positions and KV slots; the tokens each
# step returns; who runs and who waits; the free pages). Some requests stop at EOS (their extra
# token must be dropped), some are aborted between steps (freed once no launched batch uses
# them), with the naive and the radix cache, with and without chunked prefill.

EVERY_SEVENTH_ID = set(range(3, 49152, 7))  # as EOS: the tiny model samples all sorts
# (seed, page size, KV pool tokens, table rows, token budget, cache, aborts). Aborts are
# {step: uids aborted before it}; each hits a request of the batch in flight then (a decode
# step or a chunk), so that it is freed only once the next step has processed that batch.
OVERLAP_WORKLOADS = {
    "page1-naive": (0, 1, 120, 4, 512, "naive", {8: [2]}),
    "page16-radix-chunk16": (1, 16, 512, 3, 16, "radix", {2: [1], 10: [3]}),
    "page4-radix-chunk7-tight": (2, 4, 96, 8, 7, "radix", {3: [0], 12: [2]}),
}


def overlap_requests(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Six prompts of 3 to 30 random ids (the second and the fourth share the first's first
    12), random max_tokens; about half may stop at EOS."""
    rng = random.Random(seed)
    prompts = random_prompts(seed, 6, longest=30)
    prompts[1] = prompts[0][:12] + prompts[1]
    prompts[3] = prompts[0][:12] + prompts[3]
    return [
        (p, SamplingParams(max_tokens=rng.randint(1, 8), ignore_eos=rng.random() < 0.5))
        for p in prompts
    ]


def trace_with_aborts(scheduler: Scheduler, seed: int, aborts: dict[int, list[int]]) -> list[str]:
    """`scheduler_trace` of the seed's requests, aborting requests (by uid, the order they
    were queued in) before the steps `aborts` names; what each abort returned comes last."""
    step, calls, aborted = scheduler.step, 0, []

    def step_after_aborts() -> list:
        nonlocal calls
        calls += 1
        for uid in aborts.get(calls, []):
            found = scheduler.abort_request(uid)
            aborted.append(f"before step {calls}: abort request {uid} returned {found}")
        return step()

    scheduler.step = step_after_aborts
    return scheduler_trace(scheduler, overlap_requests(seed)) + aborted


@pytest.mark.parametrize("setup", list(OVERLAP_WORKLOADS))
def test_overlap_runs_a_workload_as_the_reference_does(setup):
    seed, page_size, pool_tokens, rows, budget, cache, aborts = OVERLAP_WORKLOADS[setup]
    overrides = dict(
        cache_type=cache,
        max_running_req=rows,
        num_pages=pool_tokens // page_size,
        max_extend_tokens=budget,
    )

    def run() -> list[str]:
        built = Scheduler(SchedulerConfig(str(QWEN3), **config(page_size, **overrides)))
        assert built.overlap
        built.eos_token_ids |= EVERY_SEVENTH_ID  # so that some requests stop early
        return trace_with_aborts(built, seed, aborts)

    assert_same_trace(11, run, f"overlap workload {setup}")
