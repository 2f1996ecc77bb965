"""Chapter 1 tests: the engine's vocabulary (minisgl.core).

What the student writes here: SamplingParams validation and `is_greedy`; the Req ledger
(`__post_init__`, `extend_len`, `remain_len`, `can_decode`, `complete_one`, `append_host`); and
`Context.forward_batch` / `get_global_ctx`, which make one context the active one for a forward.
Expected ledgers are derived from the prompt length and max_tokens in each test, never typed in.
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same_trace
from course.differential import assert_same_call
from hypothesis import given, settings
from hypothesis import strategies as st

import minisgl.core
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


# --- every stub against the reference (tools/course/differential.py) ---
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. Req's buffer and the active context live in private state
# of your own design, so append_host, __post_init__ and forward_batch/get_global_ctx are
# compared as traces: what a caller sees, step by step, yours against the chapter's reference.

VALID_FIELDS = {
    "temperature": st.sampled_from([0.0, 1e-6, 0.7, 1.0, 2.5]) | st.floats(0.0, 5.0),
    "top_k": st.sampled_from([-1, 1, 2, 50]) | st.integers(1, 10**6),
    "top_p": st.sampled_from([1.0, 1e-3, 0.5]) | st.floats(1e-9, 1.0, exclude_min=False),
    "max_tokens": st.sampled_from([1, 2, 128, 4096]) | st.integers(1, 10**6),
    "seed": st.none() | st.sampled_from([0, 1]) | st.integers(0, 2**63),
}
INVALID_FIELDS = {  # the edges just outside each range, and far outside it
    "temperature": st.sampled_from([-1e-9, -0.1, -2.0]),
    "top_k": st.sampled_from([0, -2, -100]),
    "top_p": st.sampled_from([0.0, -0.5, 1.0000001, 1.01, 2.0]),
    "max_tokens": st.sampled_from([0, -1, -100]),
    "seed": st.sampled_from([-1, -5]),
}


def unchecked_params(**fields) -> SamplingParams:  # noqa: ANN003
    """SamplingParams with the given fields, __post_init__ not run."""
    params = SamplingParams.__new__(SamplingParams)
    for name, value in fields.items():
        setattr(params, name, value)
    return params


@given(data=st.data(), invalid=st.sampled_from([None, *INVALID_FIELDS]), ignore_eos=st.booleans())
@settings(max_examples=60)
def test_sampling_params_post_init_matches_the_reference(data, invalid, ignore_eos):
    """Every field over its valid range and just outside it, one field out of range at a time
    (with two out of range, which one an error names is a free choice): the same acceptance,
    and an InvalidRequestError naming the same field."""
    fields = {
        name: data.draw((INVALID_FIELDS if name == invalid else VALID_FIELDS)[name], label=name)
        for name in VALID_FIELDS
    }
    params = unchecked_params(**fields, ignore_eos=ignore_eos)
    assert_same_call(SamplingParams.__post_init__, params)


@given(
    temperature=st.sampled_from([0.0, 1e-6, 0.5, 1.0]) | st.floats(0.0, 3.0),
    top_k=st.sampled_from([-1, 1, 2, 50]),
    top_p=st.sampled_from([1.0, 0.9]),
)
@settings(max_examples=40)
def test_is_greedy_matches_the_reference(temperature, top_k, top_p):
    params = unchecked_params(temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=4)
    assert_same_call(SamplingParams.is_greedy.fget, params)


def ledger(device_len: int, cached_len: int, max_device_len: int) -> Req:
    """A Req holding the given ledger, __post_init__ not run: the derived properties and
    complete_one read and write the three lengths only."""
    req = Req.__new__(Req)
    req.input_ids = torch.arange(100, 100 + device_len, dtype=torch.int32)
    req.table_idx, req.uid, req.cache_handle = 0, 0, None
    req.output_len = max_device_len - device_len
    req.sampling_params = unchecked_params(max_tokens=max(1, req.output_len))
    req.cached_len, req.device_len, req.max_device_len = cached_len, device_len, max_device_len
    return req


# (device_len, cached_len, max_device_len): 0 <= cached < device <= max, each edge included.
LEDGERS = st.tuples(st.integers(1, 12), st.integers(0, 11), st.integers(0, 4)).map(
    lambda t: (t[0], min(t[1], t[0] - 1), t[0] + t[2])
)


@given(lengths=LEDGERS)
@settings(max_examples=40)
def test_ledger_properties_match_the_reference(lengths):
    """extend_len, remain_len and can_decode of fresh, cached, decoding and finished ledgers."""
    for stub in (Req.extend_len, Req.remain_len, Req.can_decode):
        assert_same_call(stub.fget, ledger(*lengths))


@given(lengths=LEDGERS.filter(lambda t: t[1] < t[2]))  # a forward runs while tokens remain
@settings(max_examples=40)
def test_complete_one_matches_the_reference(lengths):
    """After a prefill (all of the prompt uncached), a chunk, or a decode step."""
    assert_same_call(Req.complete_one, ledger(*lengths))


def ledger_events(req: Req, created: torch.UntypedStorage, view: torch.Tensor) -> str:
    """What a caller sees of a request: the lengths, the sequence, and whether its memory is
    the buffer made at creation (appending writes in place), with a view taken then intact."""
    ids = req.input_ids
    return (
        f"cached {req.cached_len}, device {req.device_len}, max {req.max_device_len}, "
        f"extend {req.extend_len}, remain {req.remain_len}, can decode {req.can_decode}; "
        f"input_ids {ids.tolist()} ({ids.dtype}, {ids.device.type}, {ids.dim()}-D); "
        f"same memory as at creation: {ids.untyped_storage().data_ptr() == created.data_ptr()}; "
        f"a view taken at creation reads {view.tolist()}"
    )


@given(
    prompt_len=st.integers(0, 6),
    cached_len=st.integers(-1, 7),
    output_len=st.integers(-1, 4),
    steps=st.lists(st.sampled_from(["complete_one", "append_host", "both"]), max_size=7),
)
@settings(max_examples=60)
def test_a_request_ledger_evolves_as_the_reference_does(prompt_len, cached_len, output_len, steps):
    """Req.__post_init__, append_host (with complete_one and the properties): ledgers that
    keep or break the invariant, then forwards recorded (complete_one) and tokens appended
    (append_host), together as the scheduler does or apart as the overlap scheduler does, up
    to max_device_len and one token past it. A broken ledger may be refused with ValueError
    or AssertionError; appending past max_device_len must raise ValueError."""

    def run() -> list[str]:
        prompt = torch.arange(100, 100 + prompt_len, dtype=torch.int32)
        try:
            req = Req(prompt, 3, cached_len, output_len, 7, SamplingParams())
        except (ValueError, AssertionError):
            return ["the ledger is refused"]
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            return [f"creating it raised {type(error).__name__}"]
        created, view = req.input_ids.untyped_storage(), req.input_ids
        prompt.fill_(-1)  # the caller reuses its tensor: the request must hold its own copy
        events = [ledger_events(req, created, view)]
        for i, step in enumerate(steps):
            if step != "append_host" and req.device_len < req.max_device_len:
                req.complete_one()
                events.append(f"complete_one: {ledger_events(req, created, view)}")
            if step != "complete_one":
                try:
                    req.append_host(1000 + i)
                    events.append(f"append_host: {ledger_events(req, created, view)}")
                except Exception as error:  # noqa: BLE001 - compared with the reference's
                    events.append(f"append_host raised {type(error).__name__}")
                    events.append(ledger_events(req, created, view))
        return events

    assert_same_trace(1, run, "a request's ledger")


CONTEXT_STEPS = st.lists(
    st.sampled_from(["enter A", "enter B", "exit", "fail", "get", "A.batch", "B.batch"]),
    max_size=10,
)


@given(steps=CONTEXT_STEPS)
@settings(max_examples=60)
def test_forward_batch_and_get_global_ctx_behave_as_the_reference_does(steps):
    """Context.forward_batch and get_global_ctx: two contexts entered, nested (refused, with
    RuntimeError or AssertionError, leaving the outer forward running), left normally or by an
    exception (which must go on up), and the active context and batch asked for between."""

    def run() -> list[str]:
        contexts = {"A": make_ctx(), "B": make_ctx()}
        names = {id(ctx): name for name, ctx in contexts.items()}
        batches = {"A": Batch([], "prefill"), "B": Batch([], "decode")}  # no Req needed
        batch_names = {id(batch): f"batch {name}" for name, batch in batches.items()}
        events, open_blocks = [], []
        for step in steps:
            try:
                if step.startswith("enter"):
                    name = step[-1]
                    block = contexts[name].forward_batch(batches[name])
                    entered = block.__enter__()
                    open_blocks.append(block)
                    events.append(f"{step}: gave {batch_names.get(id(entered), entered)}")
                elif step in ("exit", "fail") and open_blocks:
                    block = open_blocks.pop()
                    if step == "exit":
                        block.__exit__(None, None, None)
                        events.append("exit: left")
                    else:
                        error = ZeroDivisionError("a layer failed")
                        swallowed = block.__exit__(ZeroDivisionError, error, None)
                        events.append(f"fail: the exception {'stops' if swallowed else 'goes on'}")
                elif step == "get":  # looked up in minisgl.core: the trace swaps it there
                    active = minisgl.core.get_global_ctx()
                    events.append(f"get_global_ctx: {names.get(id(active), active)}")
                elif step.endswith(".batch"):
                    batch = contexts[step[0]].batch
                    events.append(f"{step}: {batch_names.get(id(batch), batch)}")
            except (RuntimeError, AssertionError) as error:
                refused = isinstance(error, AssertionError) or step.startswith("enter")
                events.append(f"{step}: {'refused' if refused else type(error).__name__}")
            except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
                events.append(f"{step}: raised {type(error).__name__}: {error}")
        while open_blocks:  # leave no context active for the next example
            try:
                open_blocks.pop().__exit__(None, None, None)
            except Exception:  # noqa: BLE001, S110 - cleanup of a broken stub
                pass
        return events

    assert_same_trace(1, run, "forward_batch and get_global_ctx")
