"""Chapter 7 tests: the scheduler's loop, the prefill and decode managers, and LLM.generate.

Continuous batching is checked on the scheduler's own records: which requests are running
after each step (`decode_manager.running_reqs`), who is still waiting
(`prefill_manager.pending_list`) and the phase and size of every batch (`stats.steps`).
Generated tokens are compared with transformers' greedy `generate`: computed at test time on the
tiny checkpoints, committed for SmolLM2 (tests/transformers_greedy.json).

This chapter's snapshot has neither the radix cache (chapter 9) nor overlap scheduling
(chapter 11): every engine here runs with cache_type="naive" and enable_overlap=False.
After every run the cache manager's integrity check must pass: no page leaked.
"""

from __future__ import annotations


import pytest
import torch
from conftest import (
    SCHEDULER_MAX_STEPS,
    TINY_MODELS,
    assert_same_trace,
    encode,
    engine_config,
    generate,
    greedy,
    guarded_llm,
    hf_greedy_cached,
    llm_fixture,
    load_tokenizer,
    raise_if_a_later_chapters_stub,
    random_prompts,
    run_until_idle,
    scheduler_trace,
)
from course.differential import assert_same_call, use_reference_stubs
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Req, SamplingParams
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.scheduler.decode import DecodeManager
from minisgl.utils import InvalidRequestError, RequestTooLongError

QWEN3 = TINY_MODELS["qwen3"]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "Hi",
]
MAX_TOKENS = [9, 4, 12, 1]  # different lengths, so requests leave the batch at different steps
POOL_TOKENS = 1024  # KV slots of every engine here: plenty for these prompts


config = engine_config(pool_tokens=POOL_TOKENS)


llms = llm_fixture(config)


# --- LLM.generate ----------------------------------------------------------------------------


def test_generate_returns_one_result_per_prompt_in_order(llms):
    llm = llms(QWEN3)
    params = [greedy(n) for n in MAX_TOKENS]
    outputs = generate(llm, PROMPTS, params)
    assert len(outputs) == len(PROMPTS)
    tokenizer = load_tokenizer(QWEN3)
    for prompt, n, out in zip(PROMPTS, MAX_TOKENS, outputs):
        ids = tokenizer.encode(prompt)
        assert out["prompt_token_ids"] == ids
        assert out["token_ids"] == hf_greedy_cached(QWEN3, ids, n), f"wrong output for {prompt!r}"
        assert out["text"] == tokenizer.decode(out["token_ids"], skip_special_tokens=True)
        assert out["finish_reason"] == "length"
    # token-id prompts are the same requests as their text
    assert generate(llm, encode(QWEN3, PROMPTS), params) == outputs
    # a single string is a batch of one
    single = generate(llm, PROMPTS[0], greedy(MAX_TOKENS[0]))
    assert [o["token_ids"] for o in single] == [outputs[0]["token_ids"]]


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_matches_transformers_for_mixed_length_prompts(tiny_model_dir, page_size, llms):
    llm = llms(tiny_model_dir, page_size=page_size)
    prompt_ids = encode(tiny_model_dir, PROMPTS)
    assert len({len(ids) for ids in prompt_ids}) == len(prompt_ids), "prompts of mixed lengths"
    outputs = generate(llm, prompt_ids, [greedy(n) for n in MAX_TOKENS])
    for ids, n, out in zip(prompt_ids, MAX_TOKENS, outputs):
        assert out["token_ids"] == hf_greedy_cached(tiny_model_dir, ids, n)


@pytest.mark.slow  # SmolLM2 (30 layers; transformers' tokens committed): ~2 s on 2 cores
def test_greedy_matches_transformers_on_smollm2(smollm2_dir, llms):
    llm = llms(smollm2_dir, page_size=16)
    prompt_ids = encode(smollm2_dir, PROMPTS[:3])
    outputs = generate(llm, prompt_ids, [greedy(n) for n in (6, 3, 5)])
    for ids, out in zip(prompt_ids, outputs):
        assert out["token_ids"] == hf_greedy_cached(smollm2_dir, ids, len(out["token_ids"]))
    assert outputs[0]["text"].startswith(" Paris")


# --- continuous batching ---------------------------------------------------------------------


def test_requests_join_and_leave_the_running_batch_at_any_step():
    """Two table rows, four requests of different lengths: a request joins as soon as a row
    frees up, while the others keep decoding, and leaves as soon as it is done."""
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(max_running_req=2)))
    prompt_ids = encode(QWEN3, PROMPTS)
    max_tokens = [2, 5, 3, 4]
    uids = [scheduler.add_request(ids, greedy(n)) for ids, n in zip(prompt_ids, max_tokens)]
    assert len(set(uids)) == 4
    assert [p.uid for p in scheduler.prefill_manager.pending_list] == uids, (
        "queued in arrival order"
    )

    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    running_after_step: list[set[int]] = []
    finished_at: dict[int, int] = {}
    while scheduler.has_work:
        assert len(running_after_step) < SCHEDULER_MAX_STEPS, "the scheduler never finished"
        for out in scheduler.step():
            assert out.uid not in finished_at, f"request {out.uid} produced a token after finishing"
            tokens[out.uid].append(out.token)
            if out.finished:
                finished_at[out.uid] = len(running_after_step)
        running = set(scheduler.decode_manager.running_reqs)
        assert len(running) <= 2, "more requests running than table rows"
        running_after_step.append(running)
    scheduler.cache_manager.check_integrity()

    for uid, ids, n in zip(uids, prompt_ids, max_tokens):
        assert tokens[uid] == hf_greedy_cached(QWEN3, ids, n)
    first, second, third, fourth = uids
    # request 3 joins while request 2 is still decoding (and only once request 1 has left)
    joined = next(i for i, running in enumerate(running_after_step) if third in running)
    assert second in running_after_step[joined], "a new request must join a running batch"
    assert finished_at[first] < joined
    # request 1 leaves while request 2 goes on
    assert second in running_after_step[finished_at[first]]
    assert first not in running_after_step[finished_at[first]]
    # request 4 waits for a row too, and every request finishes
    assert fourth not in running_after_step[0]
    assert set(finished_at) == set(uids)
    assert not running_after_step[-1]


def test_more_requests_than_table_rows_all_complete_as_rows_free_up(llms):
    llm = llms(QWEN3, max_running_req=3)
    stats = llm.scheduler.stats
    start = len(stats.steps)
    prompts = [f"Request number {i} asks about" for i in range(7)]
    max_tokens = [3, 8, 5, 2, 7, 4, 6]
    outputs = generate(llm, prompts, [greedy(n) for n in max_tokens])
    for ids, n, out in zip(encode(QWEN3, prompts), max_tokens, outputs):
        assert out["token_ids"] == hf_greedy_cached(QWEN3, ids, n)

    steps = stats.steps[start:]
    assert max(size for _, size, _ in steps) <= 3, "a batch larger than max_running_req"
    prefills = [size for phase, size, _ in steps if phase == "prefill"]
    assert sum(prefills) == len(prompts), "every request is prefilled exactly once"
    phases = [phase for phase, _, _ in steps]
    assert "decode" in phases[: phases.index("prefill", 1)], (
        f"steps {phases}: waiting requests must join between decode steps"
    )
    decode_sizes = [size for phase, size, _ in steps if phase == "decode"]
    assert decode_sizes[0] == 3 and decode_sizes[-1] == 1, (
        f"decode batch sizes {decode_sizes}: a full batch at first, one request at the end"
    )
    for phase, size, num_tokens in steps:
        if phase == "decode":
            assert num_tokens == size, "a decode step computes one token per request"


def test_each_step_reports_the_tokens_it_produced_and_flags_the_last():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config()))
    short, long = encode(QWEN3, PROMPTS[:2])
    uid_short = scheduler.add_request(short, greedy(1))
    uid_long = scheduler.add_request(long, greedy(3))
    steps = run_until_idle(scheduler)
    assert [[(o.uid, o.finish_reason) for o in outs] for outs in steps] == [
        [(uid_short, "length"), (uid_long, None)],  # the prefill samples every first token
        [(uid_long, None)],
        [(uid_long, "length")],
    ]
    assert [o.token for outs in steps for o in outs if o.uid == uid_long] == hf_greedy_cached(
        QWEN3, long, 3
    )
    assert scheduler.stats.steps == [
        ("prefill", 2, len(short) + len(long)),
        ("decode", 1, 1),
        ("decode", 1, 1),
    ]
    assert scheduler.stats.prompt_tokens == len(short) + len(long)
    assert scheduler.stats.generated_tokens == 4


def test_a_request_that_cannot_decode_never_joins_the_running_set():
    """After a forward, only requests with tokens left to generate (`can_decode`) run on: a
    request that reached max_tokens leaves, and a prompt chunk (chapter 10), which samples
    nothing although its remain_len is positive, never joins."""

    class PromptChunk(Req):  # what chapter 10's ChunkedReq says about itself
        @property
        def can_decode(self) -> bool:
            return False

    def request(uid: int, cls: type[Req] = Req) -> Req:
        return cls(
            torch.tensor([5, 6, 7], dtype=torch.int32),
            table_idx=uid,
            cached_len=0,
            output_len=2,
            uid=uid,
            sampling_params=greedy(2),
        )

    decode = DecodeManager(page_size=1)
    done, going, chunk = request(0), request(1), request(2, PromptChunk)
    for req in (done, going, chunk):
        req.complete_one()  # prefilled: one token of two generated
    decode.filter_reqs([done, going, chunk])
    assert list(decode.running_reqs) == [0, 1], "a prompt chunk must not join the running set"
    done.complete_one()  # its second and last token: remain_len 0
    decode.filter_reqs([done, going])
    assert list(decode.running_reqs) == [1], "a request at max_tokens must leave"


def test_remove_req_drops_only_that_request_and_tolerates_one_already_gone():
    def request(uid: int) -> Req:
        return Req(torch.tensor([5, 6], dtype=torch.int32), uid, 0, 3, uid, greedy(3))

    decode = DecodeManager(page_size=1)
    old, other = request(0), request(1)
    decode.running_reqs.update({0: old, 1: other})
    decode.remove_req(old)
    assert list(decode.running_reqs) == [1]
    decode.remove_req(old)  # gone already (filter_reqs drops a request at max_tokens): no error
    reused = request(0)  # a later request with the same uid (added after `old` was aborted)
    decode.running_reqs[0] = reused
    decode.remove_req(old)
    assert decode.running_reqs == {1: other, 0: reused}, "another request with its uid stays"


def test_append_tokens_stops_at_the_first_token_that_finishes_the_request(llms):
    """A verify step (chapter 24) settles several tokens of a request at once through
    `append_tokens`: the tokens after the one that finishes the request are not appended."""
    scheduler = llms(QWEN3).scheduler
    eos = next(iter(scheduler.eos_token_ids))
    req = Req(torch.tensor([5, 6, 7], dtype=torch.int32), 0, 2, 6, 0, SamplingParams(max_tokens=6))
    generated = scheduler.stats.generated_tokens
    outs = scheduler.append_tokens(req, [11, eos, 12, 13])
    assert [(o.uid, o.token, o.finish_reason) for o in outs] == [(0, 11, None), (0, eos, "stop")]
    assert req.input_ids.tolist() == [5, 6, 7, 11, eos], "nothing after the EOS is appended"
    assert scheduler.stats.generated_tokens == generated + 2
    req = Req(torch.tensor([5, 6, 7], dtype=torch.int32), 1, 2, 2, 1, greedy(2))
    outs = scheduler.append_tokens(req, [11, 12, 13])
    assert [o.finish_reason for o in outs] == [None, "length"], "max_tokens=2 ends it at 12"
    assert req.input_ids.tolist() == [5, 6, 7, 11, 12]


def test_a_decode_step_follows_every_prefill_while_requests_keep_arriving():
    """With a new request arriving before every step, always preferring prefill would starve
    the running requests (as a long chunked prompt would, chapter 10): right after a prefill,
    the running requests get a decode step."""
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(max_running_req=16)))
    prompts = encode(QWEN3, [f"Arrival {i} says" for i in range(10)])
    first = scheduler.add_request(prompts[0], greedy(8))
    first_tokens, running_before = 0, []
    for ids in prompts[1:]:
        scheduler.add_request(ids, greedy(2))
        running_before.append(bool(scheduler.decode_manager.running_reqs))
        first_tokens += sum(1 for out in scheduler.step() if out.uid == first)
    phases = [phase for phase, _, _ in scheduler.stats.steps]
    for i in range(1, len(phases)):
        if phases[i - 1] == "prefill" and running_before[i]:
            assert phases[i] == "decode", (
                f"steps {phases}: a prefill right after a prefill "
                "while requests were running: they are starved"
            )
    assert first_tokens >= 4, f"the first request got {first_tokens} tokens in 9 steps"
    run_until_idle(scheduler)


def test_under_kv_pressure_a_smaller_later_request_does_not_overtake_a_waiting_one():
    """First come, first served: a large request that does not fit yet blocks the queue, so a
    small one behind it, which would fit, waits too; otherwise a stream of small requests
    could starve the large one forever."""
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(num_pages=64)))
    running, large, small = encode(QWEN3, ["A running request", "Then a large one " * 5, "Small"])
    # worst cases, page_size 1: running len+20+1, large len+20+1: together more than 64 slots
    assert len(running) + len(large) + 2 * 21 > 64 >= len(running) + len(small) + 4 + 21 + 1
    uids = [
        scheduler.add_request(running, greedy(20)),
        scheduler.add_request(large, greedy(20)),
        scheduler.add_request(small, greedy(3)),
    ]
    first_token_step: dict[int, int] = {}
    for i, outs in enumerate(run_until_idle(scheduler)):
        for out in outs:
            first_token_step.setdefault(out.uid, i)
    assert first_token_step[uids[0]] < first_token_step[uids[1]], "the large request must wait"
    assert first_token_step[uids[2]] >= first_token_step[uids[1]], (
        f"first tokens at steps {[first_token_step[u] for u in uids]}: the small request "
        "overtook the large one that was waiting before it"
    )


def test_finished_requests_give_back_their_rows_and_pages(llms):
    llm = llms(QWEN3, page_size=16)
    scheduler = llm.scheduler
    generate(llm, PROMPTS, [greedy(n) for n in MAX_TOKENS])
    assert not scheduler.decode_manager.running_reqs and not scheduler.prefill_manager.pending_list
    assert scheduler.table_manager.available_size == scheduler.config.max_running_req
    assert scheduler.cache_manager.num_free_pages == scheduler.cache_manager.num_pages


# --- stopping --------------------------------------------------------------------------------


def test_eos_stops_a_request_unless_it_ignores_eos(llms, monkeypatch):
    """Make the third greedy token an end-of-sequence token: the request that respects EOS
    stops right there, the one that ignores it runs to max_tokens."""
    llm = llms(QWEN3)
    ids = encode(QWEN3, PROMPTS[:1])[0]
    expected = hf_greedy_cached(QWEN3, ids, 8)
    stop_at = next(i for i in range(2, 8) if expected[i] not in expected[:i])
    monkeypatch.setattr(llm.scheduler, "eos_token_ids", {expected[stop_at]})
    respects, ignores = generate(
        llm,
        [ids, ids],
        [SamplingParams(max_tokens=8), SamplingParams(max_tokens=8, ignore_eos=True)],
    )
    assert respects["token_ids"] == expected[: stop_at + 1], "stop at EOS, keeping the EOS token"
    assert respects["finish_reason"] == "stop"
    assert ignores["token_ids"] == expected
    assert ignores["finish_reason"] == "length"


def test_a_request_that_ignores_eos_finishes_by_length_even_if_its_last_token_is_eos(
    llms, monkeypatch
):
    llm = llms(QWEN3)
    ids = encode(QWEN3, PROMPTS[:1])[0]
    expected = hf_greedy_cached(QWEN3, ids, 4)
    monkeypatch.setattr(llm.scheduler, "eos_token_ids", {expected[-1]})
    (out,) = generate(llm, [ids], greedy(4))
    assert out["token_ids"] == expected
    assert out["finish_reason"] == "length"


# --- bad input -------------------------------------------------------------------------------


def test_bad_requests_raise_clear_errors_and_leave_the_scheduler_usable(llms):
    for max_tokens in (0, -3):
        with pytest.raises(ValueError, match="max_tokens"):
            SamplingParams(max_tokens=max_tokens)
    llm = llms(QWEN3, num_pages=32)  # a pool of 32 tokens
    scheduler = llm.scheduler
    prompt_tokens = scheduler.stats.prompt_tokens
    with pytest.raises(InvalidRequestError):
        llm.generate([""], greedy(4))
    with pytest.raises(InvalidRequestError):
        llm.generate([[]], greedy(4))
    with pytest.raises(RequestTooLongError):  # 30 + 8 tokens + a page of slack > 32 slots
        llm.generate([list(range(100, 130))], greedy(8))
    with pytest.raises(InvalidRequestError):  # one bad prompt: nothing of the batch is queued
        llm.generate(["Hi", ""], greedy(4))
    with pytest.raises(InvalidRequestError):  # two prompts, one sampling params
        llm.generate(["Hi", "Hello"], [greedy(4)])
    with pytest.raises(InvalidRequestError):
        scheduler.add_request(torch.tensor([], dtype=torch.int32), greedy(4))
    assert not scheduler.has_work, "a rejected request must leave nothing behind"
    assert scheduler.stats.prompt_tokens == prompt_tokens

    ids = encode(QWEN3, PROMPTS[:1])[0]
    out = generate(llm, [ids], greedy(5))
    assert out[0]["token_ids"] == hf_greedy_cached(QWEN3, ids, 5)
    assert scheduler.cache_manager.num_free_pages == 32


# --- the scheduler's API: uids, aborts, status ------------------------------------------------


def test_add_request_takes_a_given_uid_and_refuses_one_in_use():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config()))
    ids = encode(QWEN3, PROMPTS[:1])[0]
    assert scheduler.add_request(ids, greedy(2), uid=7) == 7
    assert scheduler.add_request(ids, greedy(2)) > 7, "new uids never collide with given ones"
    with pytest.raises(InvalidRequestError, match="7"):
        scheduler.add_request(ids, greedy(2), uid=7)
    assert len(scheduler.prefill_manager.pending_list) == 2, "a refused request is not queued"
    run_until_idle(scheduler)


def test_an_aborted_request_produces_nothing_more_and_frees_its_row_and_pages_at_once():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(max_running_req=2)))
    kept, aborted, waiting = encode(QWEN3, PROMPTS[:3])
    uids = [scheduler.add_request(ids, greedy(6)) for ids in (kept, aborted, waiting)]
    scheduler.step()  # both rows taken by a prefill; the third request waits
    status = scheduler.status()
    assert (status.running, status.waiting, scheduler.table_manager.available_size) == (2, 1, 0)
    assert status.used_pages == len(kept) + len(aborted), "a page per prompt token (page 1)"
    assert status.integrity_ok is None, "no idle check has run yet"
    free_pages = scheduler.cache_manager.num_free_pages

    assert scheduler.abort_request(uids[1]) and scheduler.abort_request(uids[2])
    assert not scheduler.abort_request(uids[1]), "an aborted request is gone"
    assert not scheduler.abort_request(12345), "no such request"
    assert scheduler.table_manager.available_size == 1, "the aborted row is free at once"
    assert scheduler.cache_manager.num_free_pages == free_pages + len(aborted), (
        "the aborted request's pages are free at once"
    )
    steps = run_until_idle(scheduler)
    assert {out.uid for outs in steps for out in outs} == {uids[0]}
    assert [out.token for outs in steps for out in outs] == hf_greedy_cached(QWEN3, kept, 6)[1:]
    status = scheduler.status()
    assert (status.running, status.waiting, status.used_pages) == (0, 0, 0)
    assert status.free_pages + status.cached_pages == status.num_pages
    assert status.generated_tokens == 6 + 1 and status.integrity_ok is True


def test_llm_is_a_context_manager_that_shuts_down_on_exit():
    with guarded_llm(QWEN3, **config(num_pages=128)) as llm:
        ids = encode(QWEN3, PROMPTS[:1])[0]
        out = generate(llm, [ids], greedy(3))
        assert out[0]["token_ids"] == hf_greedy_cached(QWEN3, ids, 3)
    assert getattr(llm, "scheduler", None) is None, "shutdown() releases the engine"
    llm.shutdown()  # a second shutdown is harmless


def test_new_uids_never_collide_with_given_ones_given_out_of_order():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config()))
    ids = encode(QWEN3, PROMPTS[:1])[0]
    uids = [scheduler.add_request(ids, greedy(1), uid=uid) for uid in (10, 5)]
    uids += [scheduler.add_request(ids, greedy(1)) for _ in range(6)]
    assert len(set(uids)) == len(uids), f"uids {uids}: a new uid repeats a queued one"
    run_until_idle(scheduler)


def test_admission_reserves_what_the_running_requests_may_still_need():
    """A request whose worst case fits in the free pages, but not beside the worst case of
    the running request, waits until that request is done: otherwise both could outgrow
    the pool."""
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(num_pages=64)))
    running, later = encode(QWEN3, ["A running request", "A later one"])
    # worst cases, page_size 1: prompt + max_tokens + a page of slack
    assert len(later) + 26 <= 64 - len(running) < len(later) + 26 + 41
    first = scheduler.add_request(running, greedy(40))
    scheduler.step()  # the first request is prefilled and runs
    second = scheduler.add_request(later, greedy(25))
    tokens: dict[int, list[int]] = {first: [], second: []}
    finished_at, first_token_at = None, None
    for i, outs in enumerate(run_until_idle(scheduler)):
        for out in outs:
            tokens[out.uid].append(out.token)
            if out.uid == first and out.finished:
                finished_at = i
            if out.uid == second and first_token_at is None:
                first_token_at = i
    assert first_token_at is not None and finished_at is not None
    assert first_token_at > finished_at, "admitted although its worst case did not fit"
    assert tokens[second] == hf_greedy_cached(QWEN3, later, 25)


def test_the_idle_integrity_check_waits_until_no_request_waits_or_runs():
    """One table row: after the first request finishes, the second still waits, so the
    scheduler is not idle yet and its idle check has not run."""
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config(max_running_req=1)))
    first, second = encode(QWEN3, PROMPTS[:2])
    scheduler.add_request(first, greedy(1))
    scheduler.add_request(second, greedy(1))
    scheduler.step()  # the first request: prefilled and finished at once
    status = scheduler.status()
    assert (status.running, status.waiting) == (0, 1)
    assert status.integrity_ok is None, "the idle check ran while a request was waiting"
    run_until_idle(scheduler)
    assert scheduler.status().integrity_ok is True


def test_an_eos_sampled_as_the_last_allowed_token_finishes_by_stop(llms, monkeypatch):
    llm = llms(QWEN3)
    ids = encode(QWEN3, PROMPTS[:1])[0]
    expected = hf_greedy_cached(QWEN3, ids, 8)
    n = next(i for i in range(2, 9) if expected[i - 1] not in expected[: i - 1])
    monkeypatch.setattr(llm.scheduler, "eos_token_ids", {expected[n - 1]})
    (out,) = generate(llm, [ids], SamplingParams(max_tokens=n))
    assert out["token_ids"] == expected[:n]
    assert out["finish_reason"] == "stop", "it sampled EOS: that is why it ended"


# --- every stub against the reference's (tools/course/differential.py) ------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The scheduler's stubs show only through its loop: a seeded
# random workload's trace of events, yours against the chapter's reference stubs.

REQ_SPECS = st.lists(  # (prompt length, tokens already generated, max_tokens, can start cached)
    st.tuples(st.integers(1, 12), st.integers(0, 4), st.integers(1, 6), st.booleans()),
    max_size=6,
)


def make_reqs(specs: list[tuple[int, int, int, bool]], first_uid: int = 0) -> list[Req]:
    """Requests in every state a scheduler holds: fresh prompts, part-decoded, at max_tokens."""
    reqs = []
    for i, (prompt_len, generated, max_tokens, cached) in enumerate(specs):
        generated = min(generated, max_tokens)
        ids = torch.arange(10, 10 + prompt_len + generated, dtype=torch.int32)
        req = Req(ids[:prompt_len], i, 0, max_tokens, first_uid + i, greedy(max_tokens))
        for token in ids[prompt_len:].tolist():
            req.complete_one()
            req.append_host(token)
        if cached and req.device_len > 1:
            req.cached_len = req.device_len - 1
        reqs.append(req)
    return reqs


def decode_manager_with(running: list[Req], page_size: int = 4) -> DecodeManager:
    manager = DecodeManager(page_size)
    manager.running_reqs = {req.uid: req for req in running}
    return manager


def running_and_batch(running: list, batch: list, page_size: int) -> tuple:
    """A decode manager running `running`, and a batch of every other one of them followed by
    new requests (`batch`, uids after theirs)."""
    reqs = make_reqs(running)
    return decode_manager_with(reqs, page_size), reqs[::2] + make_reqs(batch, len(reqs))


DECODE_INPUTS = dict(running=REQ_SPECS, batch=REQ_SPECS, page_size=st.sampled_from([1, 4, 16]))


@given(**DECODE_INPUTS)
@settings(max_examples=40)
def test_filter_reqs_matches_the_reference(running, batch, page_size):
    assert_same_call(
        DecodeManager.filter_reqs, build=lambda: running_and_batch(running, batch, page_size)
    )


@given(**DECODE_INPUTS)
@settings(max_examples=20)
def test_decode_schedule_next_batch_matches_the_reference(running, batch, page_size):
    assert_same_call(
        DecodeManager.schedule_next_batch,
        build=lambda: running_and_batch(running, batch, page_size)[:1],
    )


@given(**DECODE_INPUTS, which=st.integers(0, 6))
@settings(max_examples=40)
def test_remove_req_matches_the_reference(running, batch, page_size, which):
    """A running request, one that already left, or a stranger whose uid a running one has."""

    def build() -> tuple:
        manager, batch_reqs = running_and_batch(running, batch, page_size)
        everyone = list(manager.running_reqs.values()) + batch_reqs
        if which < len(everyone):
            return manager, everyone[which]
        return manager, make_reqs([(3, 0, 2, False)])[0]

    assert_same_call(DecodeManager.remove_req, build=build)


@given(
    pending=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 24)), max_size=6),
    running=REQ_SPECS,
    budget=st.integers(1, 64),
    free_pages=st.integers(0, 24),
    rows=st.integers(0, 4),
    page_size=st.sampled_from([1, 4]),
)
@settings(max_examples=40)
def test_prefill_manager_stubs_match_the_reference(
    pending, running, budget, free_pages, rows, page_size
):
    """Admission over every budget, free pool and row count, from empty to exact fits."""
    from minisgl.scheduler.cache import CacheManager, create_prefix_cache
    from minisgl.scheduler.prefill import PrefillManager
    from minisgl.scheduler.table import TableManager
    from minisgl.scheduler.utils import PendingReq

    def build() -> tuple:
        page_table = torch.zeros(8, 128, dtype=torch.int32)
        cache = CacheManager(
            free_pages, page_size, page_table, create_prefix_cache("naive", "cpu", page_size)
        )
        table = TableManager(8, page_table)
        for _ in range(8 - rows):
            table.allocate()
        decode = decode_manager_with(make_reqs(running), page_size)
        manager = PrefillManager(cache, table, decode)
        for i, (prompt_len, max_tokens) in enumerate(pending):
            ids = torch.arange(10, 10 + prompt_len, dtype=torch.int32)
            manager.add_one_req(PendingReq(100 + i, ids, greedy(max_tokens)))
        return manager, budget

    assert_same_call(PrefillManager.new_adder, build=build)
    assert_same_call(PrefillManager.schedule_next_batch, build=build)


@given(
    specs=REQ_SPECS.filter(bool),
    tokens=st.lists(st.integers(0, 20), max_size=5),
    ignore_eos=st.booleans(),
)
@settings(max_examples=40)
def test_finish_reason_and_append_tokens_match_the_reference(scheduler, specs, tokens, ignore_eos):
    """Token by token, with EOS ids among the tokens and requests one token from max_tokens."""
    scheduler.eos_token_ids = {3, 7}

    def build(count: int = len(tokens)) -> tuple:
        req = make_reqs(specs)[-1]
        req.sampling_params.ignore_eos = ignore_eos
        room = req.max_device_len - len(req.input_ids)
        return scheduler, req, tokens[: max(0, min(count, room))]

    assert_same_call(Scheduler.append_tokens, build=build)
    for token in tokens:
        assert_same_call(Scheduler.finish_reason, build=lambda: (*build(0)[:2], token))


@pytest.fixture(scope="module")
def scheduler() -> Scheduler:
    """One scheduler whose stats and EOS ids the per-call comparisons may change: their
    deep copies hold it, so each side's changes to it are compared."""
    return Scheduler(SchedulerConfig(str(QWEN3), **config()))


# Chapter 10's ChunkedReq runs the reference's two methods on both sides: a prompt longer than
# what is left of the prefill budget is chunked.
CHUNKS = {
    "scheduler/prefill.py:ChunkedReq.can_decode",
    "scheduler/prefill.py:ChunkedReq.complete_one",
}


WORKLOADS = [  # (seed, page size, KV pool tokens, table rows, prefill budget): tight to loose
    (0, 1, 96, 2, 512),
    (1, 4, 64, 8, 512),
    (2, 16, 1024, 3, 32),
    (3, 4, 160, 8, 48),
]


def random_requests(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Six requests of random prompt lengths and max_tokens; some stop at EOS."""
    rng = __import__("random").Random(seed)
    prompts = random_prompts(seed, 6, longest=30)
    return [
        (p, SamplingParams(max_tokens=rng.randint(1, 9), ignore_eos=rng.random() < 0.5))
        for p in prompts
    ]


@pytest.mark.parametrize("seed, page_size, pool_tokens, rows, budget", WORKLOADS)
def test_the_scheduler_runs_a_workload_as_the_reference_does(
    seed, page_size, pool_tokens, rows, budget
):
    """Scheduler.step, normal_loop, _schedule_next_batch, pick_batch, _prepare_batch,
    run_batch, settle_batch, add_request: the same batches (with their lengths, rows, input
    ids, positions and KV slots), tokens, running and waiting sets and free pages, step by
    step, as with the chapter's reference code."""
    overrides = dict(
        max_running_req=rows, num_pages=pool_tokens // page_size, max_extend_tokens=budget
    )

    def run() -> list[str]:
        built = Scheduler(SchedulerConfig(str(QWEN3), **config(page_size, **overrides)))
        built.eos_token_ids |= {11, 12, 13}  # ids the tiny model samples now and then
        with use_reference_stubs(10, only=CHUNKS):  # a budget shared by prompts chunks them
            return scheduler_trace(built, random_requests(seed))

    assert_same_trace(7, run, f"workload {seed}")


def test_generate_returns_what_the_reference_generate_returns(llms):
    """LLM.generate on a batch of prompts: text and token ids, with one prompt of ids."""
    llm = llms(QWEN3)
    prompts = [*PROMPTS[:3], encode(QWEN3, PROMPTS[3:])[0]]
    params = [SamplingParams(max_tokens=n, ignore_eos=False) for n in (3, 5, 2, 4)]

    def run() -> list[str]:
        try:
            return [repr(out) for out in llm.generate(prompts, params)]
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            return [f"raised {type(error).__name__}: {error}"]

    assert_same_trace(7, run, "LLM.generate")


# A step's phases one by one: what each stub leaves behind, not only what the step ends with.
# Prompts longer than the prefill budget are chunked (chapter 10's ChunkedReq runs the
# reference's two methods on both sides), and requests keep arriving while others run.
PHASED_WORKLOADS = [  # (seed, page size, KV pool tokens, table rows, prefill budget)
    (4, 2, 80, 4, 7),
    (5, 4, 128, 3, 12),
    (6, 1, 48, 8, 5),
]


def scheduler_state(scheduler: Scheduler, when: str) -> str:
    """Who runs (with their ledgers), who waits (and how far a chunked prompt got), free pages."""
    running = [
        f"{r.uid} (cached {r.cached_len}, device {r.device_len})"
        for r in scheduler.decode_manager.running_reqs.values()
    ]
    waiting = [
        f"{p.uid}" + (f" (chunked to {p.chunked_req.device_len})" if p.chunked_req else "")
        for p in scheduler.prefill_manager.pending_list
    ]
    free = scheduler.cache_manager.num_free_pages
    return f"{when}: running {running}; waiting {waiting}; {free} pages free"


def phased_trace(
    scheduler: Scheduler, requests: list[tuple[list[int], SamplingParams]]
) -> list[str]:
    """Two requests queued, then one more before each step; each step run phase by phase
    (`_schedule_next_batch`, `run_batch`, `settle_batch`) with the state after each."""
    events: list[str] = []
    arrivals = list(requests)
    step = 0
    try:
        while arrivals or scheduler.has_work:
            step += 1
            if step > SCHEDULER_MAX_STEPS:
                events.append(f"still busy after {SCHEDULER_MAX_STEPS} steps (a request is stuck)")
                break
            for ids, params in arrivals[: 2 if step == 1 else 1]:
                events.append(f"step {step}: queued request {scheduler.add_request(ids, params)}")
            arrivals = arrivals[2 if step == 1 else 1 :]
            forward_input = scheduler._schedule_next_batch()
            if forward_input is None:
                events.append(scheduler_state(scheduler, f"step {step}: no batch"))
                continue
            batch = forward_input.batch
            reqs = [
                f"{type(r).__name__} {r.uid} (cached {r.cached_len}, device {r.device_len}, "
                f"row {r.table_idx})"
                for r in batch.reqs
            ]
            events.append(f"step {step}: picked a {batch.phase} batch: {reqs}")
            events.append(f"  prompts {sorted(r.uid for r in forward_input.prompts)}")
            for name in ("input_ids", "positions", "out_loc"):
                events.append(f"  its {name}: {getattr(batch, name).tolist()}")
            events.append(scheduler_state(scheduler, f"step {step}, prepared"))
            output = scheduler.run_batch(forward_input)
            events.append(scheduler_state(scheduler, f"step {step}, after run_batch"))
            for out in scheduler.settle_batch((forward_input, output)):
                reason = f", finished ({out.finish_reason})" if out.finish_reason else ""
                events.append(f"step {step}: request {out.uid} got token {out.token}{reason}")
            events.append(scheduler_state(scheduler, f"step {step}, settled"))
            if not scheduler.has_work:
                scheduler.run_when_idle()
        events.append("idle; no page leaked")
    except Exception as error:  # noqa: BLE001 - the trace ends with what went wrong
        raise_if_a_later_chapters_stub(error)
        events.append(f"raised {type(error).__name__}: {error}")
    return events


@pytest.mark.parametrize("seed, page_size, pool_tokens, rows, budget", PHASED_WORKLOADS)
def test_each_phase_of_a_step_leaves_what_the_reference_leaves(
    seed, page_size, pool_tokens, rows, budget
):
    """_schedule_next_batch (pick_batch, both managers' schedule_next_batch, _prepare_batch),
    run_batch and settle_batch, each compared by the state it leaves: the running set with its
    ledgers after run_batch, the queue with its chunked prompts, the free pages; with prompts
    chunked by a small budget and requests arriving while others run."""
    overrides = dict(
        max_running_req=rows, num_pages=pool_tokens // page_size, max_extend_tokens=budget
    )

    def run() -> list[str]:
        built = Scheduler(SchedulerConfig(str(QWEN3), **config(page_size, **overrides)))
        built.eos_token_ids |= {11, 12, 13}
        with use_reference_stubs(10, only=CHUNKS):
            return phased_trace(built, random_requests(seed))

    assert_same_trace(7, run, f"phased workload {seed}")
