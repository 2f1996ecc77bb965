"""Chapter 1 tests: the engine's vocabulary (minisgl.core).

What the student writes here: SamplingParams validation and `is_greedy`; the Req ledger
(`__post_init__`, `extend_len`, `remain_len`, `can_decode`, `complete_one`, `append_host`); and
`Context.forward_batch` / `get_global_ctx`, which make one context the active one for a forward.
Expected ledgers are derived from the prompt length and max_tokens in each test, never typed in.
"""

from __future__ import annotations

import pytest
import torch

from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx
from minisgl.utils import InvalidRequestError

# Req.__post_init__ may enforce its invariant with `assert` (as the reference does) or a ValueError.
LEDGER_ERRORS = (AssertionError, ValueError)


def make_req(prompt_len: int, max_tokens: int, cached_len: int = 0, uid: int = 0) -> Req:
    prompt = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
    return Req(
        prompt,
        table_idx=uid,
        cached_len=cached_len,
        output_len=max_tokens,
        uid=uid,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


def make_ctx() -> Context:
    """A context with no real KV pool or backend: forward_batch only needs the object."""
    return Context(
        page_size=1,
        kv_cache=None,
        page_table=torch.zeros(1, 8, dtype=torch.int32),
        attn_backend=None,
    )


def assert_no_active_ctx() -> None:
    with pytest.raises(RuntimeError) as err:
        get_global_ctx()
    assert not isinstance(err.value, NotImplementedError), "get_global_ctx is still a stub"


# --- SamplingParams ------------------------------------------------------------------------------


def test_sampling_params_accept_the_edges_of_every_valid_range():
    SamplingParams()
    SamplingParams(temperature=0.0, top_k=-1, top_p=1.0, max_tokens=1)
    params = SamplingParams(temperature=1.5, top_k=1, top_p=1e-3, max_tokens=4096, ignore_eos=True)
    assert (params.temperature, params.top_k, params.top_p, params.max_tokens) == (
        1.5,
        1,
        1e-3,
        4096,
    )


@pytest.mark.parametrize("max_tokens", [0, -1])
def test_sampling_params_reject_non_positive_max_tokens(max_tokens):
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams(max_tokens=max_tokens)


def test_sampling_params_reject_negative_temperature():
    with pytest.raises(InvalidRequestError, match="temperature"):
        SamplingParams(temperature=-0.1)


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01])
def test_sampling_params_reject_top_p_outside_zero_one(top_p):
    with pytest.raises(InvalidRequestError, match="top_p"):
        SamplingParams(top_p=top_p)


@pytest.mark.parametrize("top_k", [0, -2])
def test_sampling_params_reject_top_k_other_than_minus_one_or_positive(top_k):
    with pytest.raises(InvalidRequestError, match="top_k"):
        SamplingParams(top_k=top_k)


def test_sampling_params_take_an_optional_non_negative_seed():
    assert SamplingParams().seed is None
    assert SamplingParams(temperature=1.0, seed=0).seed == 0
    with pytest.raises(InvalidRequestError, match="seed"):
        SamplingParams(seed=-1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "greedy"),
    [
        (0.0, -1, True),  # temperature 0 is argmax
        (0.0, 50, True),
        (0.8, 1, True),  # keeping only the top token is argmax too, whatever the temperature
        (0.8, -1, False),
        (0.8, 2, False),
    ],
)
def test_is_greedy_means_temperature_zero_or_top_k_one(temperature, top_k, greedy):
    assert SamplingParams(temperature=temperature, top_k=top_k).is_greedy is greedy


# --- Req: the ledger -----------------------------------------------------------------------------


def test_new_req_ledger_derives_lengths_from_prompt_and_max_tokens():
    prompt_len, max_tokens = 5, 3
    req = make_req(prompt_len, max_tokens)
    assert (req.cached_len, req.device_len) == (0, prompt_len)
    assert req.max_device_len == prompt_len + max_tokens
    assert req.extend_len == prompt_len  # the first forward computes the whole prompt
    assert req.remain_len == max_tokens
    assert req.can_decode


def test_prefix_cached_req_extends_only_the_uncached_tail():
    prompt_len, cached = 7, 4
    req = make_req(prompt_len, 2, cached_len=cached)
    assert req.cached_len == cached and req.device_len == prompt_len
    assert req.extend_len == prompt_len - cached


def test_ledger_through_one_prefill_and_decodes_until_max_tokens():
    prompt_len, max_tokens = 6, 4
    req = make_req(prompt_len, max_tokens)
    generated = []
    for step in range(max_tokens):
        # Before the forward: K/V of [cached_len, device_len) get computed, one token is sampled.
        assert req.extend_len == (prompt_len if step == 0 else 1)
        assert req.can_decode
        req.complete_one()
        token = 1000 + step
        req.append_host(token)
        generated.append(token)
        # After it: everything computed is cached, and the sampled token is the next input.
        assert req.cached_len == prompt_len + step
        assert req.device_len == prompt_len + step + 1
        assert req.extend_len == 1
        assert req.max_device_len == prompt_len + max_tokens  # never moves
        assert req.remain_len == max_tokens - step - 1
        assert len(req.input_ids) == req.device_len  # the CPU copy holds every known token
        assert 0 <= req.cached_len < req.device_len <= req.max_device_len
    assert req.remain_len == 0 and not req.can_decode
    assert req.input_ids[prompt_len:].tolist() == generated


def test_append_host_keeps_the_prompt_and_its_dtype():
    req = make_req(3, 2)
    prompt = req.input_ids.clone()
    req.append_host(42)
    assert req.input_ids.dtype == prompt.dtype == torch.int32
    assert req.input_ids.device.type == "cpu"
    assert req.input_ids.tolist() == prompt.tolist() + [42]
    req.append_host(7)
    assert req.input_ids.tolist() == prompt.tolist() + [42, 7]


def test_append_host_leaves_the_callers_prompt_and_earlier_views_alone():
    prompt = torch.arange(100, 104, dtype=torch.int32)
    req = Req(prompt, 0, 0, 3, 0, SamplingParams(max_tokens=3))
    before = req.input_ids
    req.append_host(5)
    req.append_host(6)
    # The caller's tensor is not the request's storage, and a slice taken earlier (the prefix
    # cache keeps some) still reads the tokens it read then.
    assert prompt.tolist() == [100, 101, 102, 103]
    assert before.tolist() == [100, 101, 102, 103]
    assert req.input_ids.tolist() == [100, 101, 102, 103, 5, 6]


def test_append_host_fills_the_sequence_up_to_max_device_len_then_refuses():
    req = make_req(2, 3)
    for token in (7, 8, 9):
        req.append_host(token)
    assert req.input_ids.tolist() == [100, 101, 7, 8, 9]
    assert len(req.input_ids) == req.max_device_len
    with pytest.raises(ValueError, match="no room"):
        req.append_host(10)  # past max_tokens: a bug of the caller, not a longer sequence
    assert req.input_ids.tolist() == [100, 101, 7, 8, 9]


@pytest.mark.parametrize(
    ("prompt_len", "max_tokens", "cached_len"),
    [
        pytest.param(4, 2, 4, id="whole_prompt_cached"),  # a forward needs one uncached token
        pytest.param(4, 2, 5, id="more_cached_than_prompt"),
        pytest.param(4, 2, -1, id="negative_cached_len"),
        pytest.param(0, 2, 0, id="empty_prompt"),
        pytest.param(4, -1, 0, id="device_len_past_max_device_len"),
    ],
)
def test_req_rejects_a_ledger_that_breaks_the_invariant(prompt_len, max_tokens, cached_len):
    # Invariant: 0 <= cached_len < device_len <= max_device_len.
    with pytest.raises(LEDGER_ERRORS):
        make_req(prompt_len, max_tokens, cached_len=cached_len)


# --- Context.forward_batch and get_global_ctx ----------------------------------------------------


def test_forward_batch_activates_the_context_and_its_batch():
    ctx, batch = make_ctx(), Batch([make_req(3, 1)], "prefill")
    with ctx.forward_batch(batch) as running:
        assert running is batch
        assert get_global_ctx() is ctx
        assert ctx.batch is batch
    with pytest.raises(RuntimeError):
        ctx.batch  # noqa: B018 - the property raises once the forward is over
    assert_no_active_ctx()


def test_get_global_ctx_raises_outside_forward_batch():
    assert_no_active_ctx()
    ctx = make_ctx()
    with ctx.forward_batch(Batch([make_req(2, 1)], "decode")):
        assert get_global_ctx() is ctx
    assert_no_active_ctx()


def test_forward_batch_switches_between_two_contexts_one_at_a_time():
    first, second = make_ctx(), make_ctx()
    batch_a, batch_b = Batch([make_req(2, 1)], "prefill"), Batch([make_req(3, 1, uid=1)], "decode")
    with first.forward_batch(batch_a):
        assert get_global_ctx() is first and get_global_ctx().batch is batch_a
    with second.forward_batch(batch_b):
        assert get_global_ctx() is second and get_global_ctx().batch is batch_b
    assert_no_active_ctx()


@pytest.mark.parametrize("same_context", [True, False], ids=["same_ctx", "other_ctx"])
def test_forward_batch_cannot_be_nested(same_context):
    outer = make_ctx()
    inner = outer if same_context else make_ctx()
    batch = Batch([make_req(2, 1)], "prefill")
    with outer.forward_batch(batch):
        with pytest.raises((RuntimeError, AssertionError)):
            with inner.forward_batch(Batch([make_req(2, 1, uid=1)], "prefill")):
                pass
        # The failed attempt leaves the outer forward running untouched.
        assert get_global_ctx() is outer and outer.batch is batch
    assert_no_active_ctx()


def test_forward_batch_clears_the_context_after_an_exception():
    ctx, batch = make_ctx(), Batch([make_req(2, 1)], "prefill")
    with pytest.raises(ZeroDivisionError):
        with ctx.forward_batch(batch):
            assert get_global_ctx() is ctx
            1 / 0  # noqa: B018 - a layer failing mid-forward
    assert_no_active_ctx()
    # ...so the next forward can start.
    with ctx.forward_batch(batch):
        assert get_global_ctx() is ctx
