"""Chapter 7 tests: the scheduler's loop, the prefill and decode managers, and LLM.generate.

Continuous batching is checked on the scheduler's own records: which requests are running
after each step (`decode_manager.running`), who is still waiting (`prefill_manager.pending`)
and the phase and size of every batch (`stats.steps`). Generated tokens are compared with
transformers' greedy `generate`, computed at test time.

This chapter's snapshot has neither the radix cache (chapter 9) nor overlap scheduling
(chapter 11): every engine here runs with cache_type="naive" and enable_overlap=False.
After every run the cache manager's integrity check must pass: no page leaked.
"""

from __future__ import annotations


import pytest
import torch
from conftest import (SCHEDULER_MAX_STEPS, TINY_MODELS, encode, greedy, hf_greedy_cached,
                     llm_fixture, load_tokenizer, run_until_idle)

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.scheduler import Scheduler, SchedulerConfig
from minisgl.utils import InvalidRequestError, RequestTooLongError

QWEN3 = TINY_MODELS["qwen3"]
PROMPTS = ["The capital of France is",
           "def fibonacci(n):",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who",
           "Hi"]
MAX_TOKENS = [9, 4, 12, 1]  # different lengths, so requests leave the batch at different steps
POOL_TOKENS = 1024  # KV slots of every engine here: plenty for these prompts


def config(page_size: int = 1, **overrides) -> dict:
    """What every engine of this chapter runs with: no radix cache, no overlap, on the CPU."""
    return dict(cache_type="naive", enable_overlap=False, device="cpu", show_progress=False,
                page_size=page_size, num_pages=POOL_TOKENS // page_size,
                max_running_req=8) | overrides




def generate(llm: LLM, prompts, params) -> list[dict]:
    """LLM.generate, after which the scheduler must be idle and every page free again."""
    outputs = llm.generate(prompts, params)
    assert not llm.scheduler.has_work, "generate returned with requests still in the scheduler"
    llm.scheduler.cache_manager.check_integrity()
    return outputs






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


@pytest.mark.slow  # SmolLM2 (30 layers) here and in transformers: ~3 s, 25 s on a busy machine
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
    assert [p.uid for p in scheduler.prefill_manager.pending] == uids, "queued in arrival order"

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
        running = set(scheduler.decode_manager.running)
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
    assert "decode" in phases[: phases.index("prefill", 1)], \
        f"steps {phases}: waiting requests must join between decode steps"
    decode_sizes = [size for phase, size, _ in steps if phase == "decode"]
    assert decode_sizes[0] == 3 and decode_sizes[-1] == 1, \
        f"decode batch sizes {decode_sizes}: a full batch at first, one request at the end"
    for phase, size, num_tokens in steps:
        if phase == "decode":
            assert num_tokens == size, "a decode step computes one token per request"


def test_each_step_reports_the_tokens_it_produced_and_flags_the_last():
    scheduler = Scheduler(SchedulerConfig(str(QWEN3), **config()))
    short, long = encode(QWEN3, PROMPTS[:2])
    uid_short = scheduler.add_request(short, greedy(1))
    uid_long = scheduler.add_request(long, greedy(3))
    steps = run_until_idle(scheduler)
    assert [[(o.uid, o.finished) for o in outs] for outs in steps] == [
        [(uid_short, True), (uid_long, False)],  # the prefill samples every request's first token
        [(uid_long, False)],
        [(uid_long, True)],
    ]
    assert [o.token for outs in steps for o in outs if o.uid == uid_long] == \
        hf_greedy_cached(QWEN3, long, 3)
    assert scheduler.stats.steps == [("prefill", 2, len(short) + len(long)),
                                     ("decode", 1, 1), ("decode", 1, 1)]
    assert scheduler.stats.prompt_tokens == len(short) + len(long)
    assert scheduler.stats.generated_tokens == 4


def test_finished_requests_give_back_their_rows_and_pages(llms):
    llm = llms(QWEN3, page_size=16)
    scheduler = llm.scheduler
    generate(llm, PROMPTS, [greedy(n) for n in MAX_TOKENS])
    assert not scheduler.decode_manager.running and not scheduler.prefill_manager.pending
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
    respects, ignores = generate(llm, [ids, ids], [SamplingParams(max_tokens=8),
                                                   SamplingParams(max_tokens=8, ignore_eos=True)])
    assert respects["token_ids"] == expected[: stop_at + 1], "stop at EOS, keeping the EOS token"
    assert respects["finish_reason"] == "stop"
    assert ignores["token_ids"] == expected
    assert ignores["finish_reason"] == "length"


def test_a_request_that_ignores_eos_finishes_by_length_even_if_its_last_token_is_eos(
        llms, monkeypatch):
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


def test_llm_is_a_context_manager_that_shuts_down_on_exit():
    with LLM(str(QWEN3), **config(num_pages=128)) as llm:
        ids = encode(QWEN3, PROMPTS[:1])[0]
        out = generate(llm, [ids], greedy(3))
        assert out[0]["token_ids"] == hf_greedy_cached(QWEN3, ids, 3)
    assert getattr(llm, "scheduler", None) is None, "shutdown() releases the engine"
    llm.shutdown()  # a second shutdown is harmless
