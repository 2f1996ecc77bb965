"""Tests of problem 73: LLM.generate."""

import os
from pathlib import Path

import pytest

from minisgl.core import SamplingParams
from minisgl.llm import LLM
from minisgl.utils import InvalidRequestError, RequestTooLongError
from submission import generate

MODEL = Path(os.environ["PRACTICE_MODELS"]) / "tiny-qwen3"  # models/: the judge sets it

KEYS = ("text", "token_ids", "prompt_token_ids", "finish_reason")
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Hi",
    "Once upon a time, in a small village by the sea",
]


def greedy(n: int, ignore_eos: bool = True) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=ignore_eos)


@pytest.fixture
def llm():
    """A fresh engine per test: a failing generate may leave requests in the scheduler."""
    return LLM(
        str(MODEL),
        device="cpu",
        show_progress=False,
        cache_type="naive",
        enable_overlap=False,
        num_pages=64,
        max_running_req=2,
    )


def reference(llm: LLM, prompts, params=None) -> list[dict]:
    outs = LLM.generate(llm, prompts, params)
    return [{k: out[k] for k in KEYS} for out in outs]


def theirs(llm: LLM, prompts, params=None) -> list[dict]:
    outs = generate(llm, prompts, params)
    assert isinstance(outs, list), f"generate must return a list, got {type(outs).__name__}"
    for out in outs:
        missing = [k for k in KEYS if k not in out]
        assert not missing, f"an output dict lacks the keys {missing}: {out}"
    assert not llm.scheduler.has_work, "generate returned with requests still in the scheduler"
    llm.scheduler.cache_manager.check_integrity()
    return [{k: out[k] for k in KEYS} for out in outs]


def compare(llm: LLM, prompts, params=None) -> list[dict]:
    expected = reference(llm, prompts, params)
    got = theirs(llm, prompts, params)
    assert len(got) == len(expected), (
        f"generate({prompts!r}): expected {len(expected)} outputs, got {len(got)}"
    )
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"generate({prompts!r}, {params!r}), output {i}:\nexpected {e}\ngot      {g}"
    return got


# --- samples ---------------------------------------------------------------------------------


def test_example_one_string_prompt(llm):
    got = compare(llm, "The capital of France is", greedy(5))
    assert len(got[0]["token_ids"]) == 5 and got[0]["finish_reason"] == "length"


def test_example_several_prompts_come_back_in_order(llm):
    compare(llm, PROMPTS, [greedy(n) for n in (6, 2, 4, 3)])


# --- hidden ----------------------------------------------------------------------------------


def test_one_params_object_serves_every_prompt(llm):
    compare(llm, PROMPTS, greedy(3))


def test_token_id_prompts(llm):
    compare(llm, [[5, 99, 1024, 7], [300]], greedy(4))


def test_no_params_means_the_default_sampling_params(llm):
    # SamplingParams() has max_tokens=128: 1 + 128 + a page of slack never fits 64 slots
    with pytest.raises(RequestTooLongError):
        generate(llm, "Hi")
    assert not llm.scheduler.has_work, "the request raised, but it was queued"


def test_finish_reason_stop_at_an_eos_token(llm):
    first = reference(llm, PROMPTS[:2], greedy(8))
    eos_token = first[0]["token_ids"][2]
    llm.scheduler.eos_token_ids = {eos_token}
    got = compare(llm, PROMPTS[:2], greedy(8, ignore_eos=False))
    assert got[0]["finish_reason"] == "stop" and got[0]["token_ids"][-1] == eos_token, (
        f"EOS = {eos_token}: expected request 0 to stop at it, got {got[0]}"
    )


def test_an_eos_token_at_the_end_of_an_ignore_eos_request_is_a_length_finish(llm):
    first = reference(llm, PROMPTS[:2], greedy(4))
    last = first[1]["token_ids"][-1]
    llm.scheduler.eos_token_ids = {last}
    got = compare(llm, PROMPTS[:2], greedy(4))
    assert got[1]["finish_reason"] == "length", (
        f"ignore_eos=True: the request ran to max_tokens although its last token {last} is an "
        f"EOS token: expected finish_reason 'length', got {got[1]['finish_reason']!r}"
    )


def test_a_wrong_number_of_params_raises_and_queues_nothing(llm):
    with pytest.raises(InvalidRequestError):
        generate(llm, PROMPTS[:3], [greedy(2), greedy(2)])
    assert not llm.scheduler.has_work, "3 prompts, 2 params: nothing may be queued"


def test_a_bad_request_anywhere_raises_before_any_is_queued(llm):
    bad = [greedy(3), greedy(3), greedy(200), greedy(3)]  # 200 tokens never fit in 64 slots
    with pytest.raises(RequestTooLongError):
        generate(llm, PROMPTS, bad)
    assert not llm.scheduler.has_work, (
        "request 2 can never fit, so generate must raise before queueing requests 0 and 1: "
        "they are still in the scheduler"
    )
    compare(llm, PROMPTS[:2], greedy(3))  # and the engine is still usable


def test_an_empty_prompt_is_rejected(llm):
    with pytest.raises(InvalidRequestError):
        generate(llm, ["Hi", ""], greedy(2))
    assert not llm.scheduler.has_work, "the empty prompt raised, but 'Hi' was queued"


def test_more_prompts_than_rows(llm):
    compare(
        llm, PROMPTS + ["The sun is", "Water boils at"], [greedy(n) for n in (2, 5, 1, 3, 4, 2)]
    )
