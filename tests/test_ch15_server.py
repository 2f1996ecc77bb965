"""Chapter 15 tests: a live `python -m minisgl` server on 127.0.0.1, driven by the real
`openai` client. Greedy outputs, streamed or not, equal LLM.generate's; usage counts the
tokens; stop strings end the output; /metrics reports the scheduler in Prometheus' format.
Errors, load, disconnects and shutdown are tested in test_server_api.py."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
import shutil
import tempfile
from contextlib import asynccontextmanager
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Literal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletionChunk
from conftest import SMOLLM2, assert_same_trace, load_tokenizer, require_model
from course.differential import assert_same_call, call_differences, reference_of
from server_fixture import LiveServer, start_server

from minisgl.core import SamplingParams
from minisgl.message import (
    BatchMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    ReplyMsg,
    StatusMsg,
    StatusRequestMsg,
    TokenizeMsg,
    ipc_address,
)
from minisgl.scheduler.utils import SchedulerStatus
from minisgl.server import api_server
from minisgl.server.api_server import metrics_text, stream_events
from minisgl.server.frontend import FrontendManager
from minisgl.server.protocol import DEFAULT_MAX_TOKENS, SamplingFields
from minisgl.utils import InvalidRequestError

PROMPTS = ["The capital of France is", "List three colors:"]
CHAT = [{"role": "user", "content": "What is the largest planet?"}]
MAX_TOKENS = 12
CHAT_MAX_TOKENS = 40


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    directory = Path(tempfile.mkdtemp(prefix="minisgl-ch15-"))
    live = start_server(require_model(SMOLLM2), directory / "server.log")
    yield live
    live.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def expected() -> dict[str, dict]:
    """What LLM.generate answers, greedily, for each prompt of this module (one batch)."""
    from minisgl.llm import LLM

    chat_ids = load_tokenizer(SMOLLM2).apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with LLM(str(SMOLLM2), show_progress=False) as llm:
        outputs = llm.generate(
            PROMPTS + [list(chat_ids)], [greedy()] * len(PROMPTS) + [greedy(CHAT_MAX_TOKENS)]
        )
    return dict(zip(PROMPTS + ["chat"], outputs))


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens)


def test_completion_equals_llm_generate(server, expected) -> None:  # noqa: ANN001
    client = server.openai()
    for prompt in PROMPTS:
        reply = client.completions.create(
            model=server.model, prompt=prompt, temperature=0, max_tokens=MAX_TOKENS
        )
        assert reply.choices[0].text == expected[prompt]["text"]
        assert reply.choices[0].finish_reason == expected[prompt]["finish_reason"]
        assert reply.usage.prompt_tokens == len(expected[prompt]["prompt_token_ids"])
        assert reply.usage.completion_tokens == len(expected[prompt]["token_ids"])


def test_streamed_completion_equals_llm_generate(server, expected) -> None:  # noqa: ANN001
    stream = server.openai().completions.create(
        model=server.model,
        prompt=PROMPTS[0],
        temperature=0,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len(pieces) > 1  # it really streamed
    assert "".join(pieces) == expected[PROMPTS[0]]["text"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_streamed_chat_equals_llm_generate_on_the_chat_template(server, expected) -> None:  # noqa: ANN001
    stream = server.openai().chat.completions.create(
        model=server.model, messages=CHAT, temperature=0, max_tokens=CHAT_MAX_TOKENS, stream=True
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == expected["chat"]["text"]


def test_chat_without_streaming_returns_one_message(server, expected) -> None:  # noqa: ANN001
    reply = server.openai().chat.completions.create(
        model=server.model, messages=CHAT, temperature=0, max_tokens=8
    )
    first_8 = load_tokenizer(SMOLLM2).decode(
        expected["chat"]["token_ids"][:8], skip_special_tokens=True
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == first_8  # greedy is prefix-stable
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_stop_string_ends_the_output_before_it(server, expected) -> None:  # noqa: ANN001
    full = expected[PROMPTS[0]]["text"]
    stop = full[3:6]
    reply = server.openai().completions.create(
        model=server.model, prompt=PROMPTS[0], temperature=0, max_tokens=MAX_TOKENS, stop=[stop]
    )
    assert reply.choices[0].text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"


def test_metrics_report_the_scheduler_in_prometheus_format(server) -> None:  # noqa: ANN001
    server.openai().completions.create(model=server.model, prompt="Hi", max_tokens=3, temperature=0)
    with server.client() as http:
        response = http.get("/metrics")
    assert response.status_code == 200
    values = {
        line.split()[0]: float(line.split()[1])
        for line in response.text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["minisgl_running_requests"] == 0
    assert values["minisgl_waiting_requests"] == 0
    assert values["minisgl_kv_pages_used"] == 0
    assert values["minisgl_kv_pages_free"] > 0
    assert values["minisgl_generated_tokens_total"] >= 3
    assert values["minisgl_integrity_ok"] == 1
    assert "# TYPE minisgl_kv_pages_free gauge" in response.text


# --- the stubs one by one, without a server: found by the mutation catalogue (mutations.toml) --


def test_request_fields_become_the_engines_sampling_params() -> None:
    fields = SamplingFields(
        model="m", temperature=0.5, top_p=0.9, top_k=7, max_tokens=9, ignore_eos=True, seed=3
    )
    assert fields.sampling_params() == SamplingParams(
        temperature=0.5, top_k=7, top_p=0.9, max_tokens=9, ignore_eos=True, seed=3
    )
    assert SamplingFields(model="m").sampling_params().max_tokens == DEFAULT_MAX_TOKENS


def test_max_tokens_of_zero_is_refused_not_replaced_by_the_default() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingFields(model="m", max_tokens=0).sampling_params()


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # IPC socket paths are limited to ~100 characters: pytest's tmp_path can be too long.
    directory = tempfile.mkdtemp(prefix="minisgl-ch15-ipc-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def frontend_and_api(socket_dir: str) -> AsyncIterator[tuple[FrontendManager, ZmqPushQueue]]:
    """A started FrontendManager, and the queue on which the tokenizer worker answers it."""
    frontend = FrontendManager(ipc_address(socket_dir, "tokenizer"), ipc_address(socket_dir, "api"))
    frontend.start()
    to_api = ZmqPushQueue(ipc_address(socket_dir, "api"))
    try:
        yield frontend, to_api
    finally:
        to_api.close()
        frontend.close()


async def all_replies(frontend: FrontendManager, uid: int) -> list[ReplyMsg]:
    async def collect() -> list[ReplyMsg]:
        return [reply async for reply in frontend.replies(uid)]

    return await asyncio.wait_for(collect(), timeout=5)


def test_the_listener_routes_batched_replies_and_drops_those_nobody_waits_for(socket_dir) -> None:  # noqa: ANN001
    async def scenario() -> None:
        async with frontend_and_api(socket_dir) as (frontend, to_api):
            uid = frontend.submit(SamplingParams(), prompt="Hi")
            mine = [ReplyMsg(uid, "Hel"), ReplyMsg(uid, "lo", "stop", 1, 2)]
            nobodys = [ReplyMsg(uid + 100, "late"), StatusMsg(uid + 100, 0, 0, 0, 9, 0, 0, None)]
            to_api.put(BatchMsg(nobodys + mine))  # an aborted request's reply, a timed-out status
            assert await all_replies(frontend, uid) == mine
            assert not frontend.listener.done()

    asyncio.run(scenario())


def test_replies_end_at_a_refusal_and_the_request_is_forgotten(socket_dir) -> None:  # noqa: ANN001
    tokenizer_inbox = ZmqPullQueue(ipc_address(socket_dir, "tokenizer"))

    async def scenario() -> None:
        async with frontend_and_api(socket_dir) as (frontend, to_api):
            uid = frontend.submit(SamplingParams(), prompt="Hi")
            refusal = ReplyMsg(uid, "", error="the prompt is too long")
            to_api.put(BatchMsg([refusal]))
            assert await all_replies(frontend, uid) == [refusal]
            frontend.abort(uid)  # the request is over: there is nothing to abort

    asyncio.run(scenario())
    assert isinstance(tokenizer_inbox.get(timeout_s=5), TokenizeMsg)
    assert tokenizer_inbox.get(timeout_s=0.3) is None  # no AbortBackendMsg
    tokenizer_inbox.close()


def stream(
    replies: list[ReplyMsg], chat: bool, include_usage: bool, header: dict | None = None
) -> list[str]:
    """The SSE events that stream_events makes of these replies."""

    async def rest() -> AsyncIterator[ReplyMsg]:
        for reply in replies[1:]:
            yield reply

    async def events() -> list[str]:
        return [
            event
            async for event in stream_events(
                replies[0], rest(), chat, header or {"id": "cmpl-1"}, include_usage
            )
        ]

    return asyncio.run(events())


def chunks_of(events: list[str]) -> list[dict]:
    assert all(event.startswith("data: ") and event.endswith("\n\n") for event in events)
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(event.removeprefix("data: ")) for event in events[:-1]]


def test_a_stream_has_a_chunk_per_piece_the_finish_reason_last_then_done() -> None:
    """The first reply's chunk goes out even empty (the first token came), later empty
    replies send nothing."""
    replies = [
        ReplyMsg(1, ""),
        ReplyMsg(1, "Hel"),
        ReplyMsg(1, ""),
        ReplyMsg(1, "lo"),
        ReplyMsg(1, "", "length", 3, 4),
    ]
    chunks = chunks_of(stream(replies, chat=False, include_usage=False))
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [
        ("", None),
        ("Hel", None),
        ("lo", None),
        ("", "length"),
    ]
    assert all(c["id"] == "cmpl-1" and "usage" not in c for c in chunks)


def test_a_chat_stream_sends_deltas_then_the_usage_it_was_asked_for() -> None:
    replies = [ReplyMsg(1, "Hi"), ReplyMsg(1, "!", "stop", 3, 2)]
    *deltas, last = chunks_of(stream(replies, chat=True, include_usage=True))
    assert [c["choices"][0]["delta"] for c in deltas] == [
        {"role": "assistant", "content": "Hi"},
        {"role": "assistant", "content": "!"},
    ]
    assert deltas[-1]["choices"][0]["finish_reason"] == "stop"
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_metrics_name_each_status_field_with_its_prometheus_type() -> None:
    status = StatusMsg(
        request_id=0,
        running=1,
        waiting=2,
        used_pages=3,
        free_pages=4,
        cached_pages=5,
        generated_tokens=6,
        integrity_ok=None,
    )
    text = metrics_text(status)
    assert text.endswith("\n")
    values = {
        line.split()[0]: int(line.split()[1])
        for line in text.splitlines()
        if not line.startswith("#")
    }
    assert values == {
        "minisgl_running_requests": 1,
        "minisgl_waiting_requests": 2,
        "minisgl_kv_pages_used": 3,
        "minisgl_kv_pages_free": 4,
        "minisgl_kv_pages_cached": 5,
        "minisgl_generated_tokens_total": 6,
        "minisgl_integrity_ok": -1,
    }  # -1: no integrity check has run yet
    types = {
        line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE")
    }
    assert types.pop("minisgl_generated_tokens_total") == "counter"
    assert set(types.values()) == {"gauge"}
    for ok in (False, True):
        assert f"minisgl_integrity_ok {int(ok)}\n" in metrics_text(
            dataclasses.replace(status, integrity_ok=ok)
        )


# --- the whole contract: every field, every chunk checked against OpenAI's own types ------------

QUICK = settings(derandomize=True, max_examples=60, deadline=None, database=None)
VALID_FIELDS = st.fixed_dictionaries(
    {
        "temperature": st.floats(0.0, 2.0),
        "top_p": st.floats(0.0, 1.0, exclude_min=True),
        "top_k": st.just(-1) | st.integers(1, 100_000),
        "max_tokens": st.none() | st.integers(1, 100_000),
        "ignore_eos": st.booleans(),
        "seed": st.none() | st.integers(0, 2**32),
    }
)


@QUICK
@given(VALID_FIELDS)
@example(  # each field at the edge of its range: zeros are values, not "unset"
    {"temperature": 0.0, "top_p": 1.0, "top_k": 1, "max_tokens": 1, "ignore_eos": True, "seed": 0}
)
def test_every_sampling_field_reaches_the_engine(fields: dict) -> None:
    params = SamplingFields(model="m", **fields).sampling_params()
    max_tokens = DEFAULT_MAX_TOKENS if fields["max_tokens"] is None else fields["max_tokens"]
    expected = SamplingParams(**{**fields, "max_tokens": max_tokens})
    for name in expected.__dataclass_fields__:
        assert getattr(params, name) == getattr(expected, name), (
            f"{name}: the request said {fields.get(name)!r}, the engine got "
            f"{getattr(params, name)!r}"
        )


@pytest.mark.parametrize(
    "field, value",
    [("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("top_k", 0), ("top_k", -2)]
    + [("max_tokens", -1), ("seed", -1)],
)
def test_a_field_out_of_range_is_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(InvalidRequestError, match=field):
        SamplingFields(model="m", **{field: value}).sampling_params()


class CompletionChunkChoice(CompletionChoice):
    """A choice of a streamed completion chunk: OpenAI sends finish_reason null until the
    last one (the client parses streams without validating; its `Completion` demands one)."""

    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class CompletionChunk(Completion):
    choices: list[CompletionChunkChoice]


HEADERS = {
    True: {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1700000000},
    False: {"id": "cmpl-7", "object": "text_completion", "created": 1700000000},
}


@QUICK
@given(
    pieces=st.lists(st.sampled_from(["", "Hel", "lo", " 🙂", "\n"]), max_size=5),
    last=st.sampled_from(["", "!"]),
    finish_reason=st.sampled_from(["stop", "length"]),
    counts=st.tuples(st.integers(0, 500), st.integers(1, 500)),
    chat=st.booleans(),
    include_usage=st.booleans(),
)
def test_every_chunk_of_a_stream_is_what_the_openai_schema_requires(
    pieces: list[str],
    last: str,
    finish_reason: str,
    counts: tuple[int, int],
    chat: bool,
    include_usage: bool,
) -> None:
    header = {**HEADERS[chat], "model": "SmolLM2"}
    replies = [ReplyMsg(1, text) for text in pieces] + [ReplyMsg(1, last, finish_reason, *counts)]
    chunks = chunks_of(stream(replies, chat, include_usage, header))
    schema = ChatCompletionChunk if chat else CompletionChunk
    for chunk in chunks:
        schema.model_validate(chunk)  # raises, naming the field, if the chunk is not OpenAI's
        assert {key: chunk[key] for key in header} == header, "every chunk carries the header"
    usage_chunks = [chunk for chunk in chunks if not chunk["choices"]]
    text_chunks = [chunk for chunk in chunks if chunk["choices"]]
    texts = [
        chunk["choices"][0]["delta"]["content"] if chat else chunk["choices"][0]["text"]
        for chunk in text_chunks
    ]
    expected = [pieces[0]] + [text for text in pieces[1:] if text] + [last] if pieces else [last]
    assert texts == expected, "the first reply's chunk, one per later piece, then the last"
    reasons = [chunk["choices"][0]["finish_reason"] for chunk in text_chunks]
    assert reasons == [None] * (len(reasons) - 1) + [finish_reason]
    if include_usage:
        assert chunks[-1] is usage_chunks[0] and len(usage_chunks) == 1, "usage: the last chunk"
        prompt_tokens, completion_tokens = counts
        assert chunks[-1]["usage"] == {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    else:
        assert usage_chunks == [] and all("usage" not in chunk for chunk in chunks)


def test_a_finished_requests_queue_is_dropped_even_if_the_consumer_stops_reading(
    socket_dir,  # noqa: ANN001
) -> None:
    tokenizer_inbox = ZmqPullQueue(ipc_address(socket_dir, "tokenizer"))

    async def read_until_finished(frontend: FrontendManager, uid: int) -> ReplyMsg:
        """A consumer that stops at the finishing reply and never asks for more."""
        async for reply in frontend.replies(uid):
            if reply.finish_reason is not None:
                return reply
        raise AssertionError("the replies ended without a finishing one")

    async def scenario() -> None:
        async with frontend_and_api(socket_dir) as (frontend, to_api):
            uid = frontend.submit(SamplingParams(), prompt="Hi")
            to_api.put(BatchMsg([ReplyMsg(uid, "Hi"), ReplyMsg(uid, "!", "stop", 1, 2)]))
            last = await asyncio.wait_for(read_until_finished(frontend, uid), timeout=5)
            assert last.finish_reason == "stop"
            assert uid not in frontend.streams, "the finished request's queue is still routed to"
            frontend.abort(uid)  # as the server does when a stream ends: nothing to abort

    asyncio.run(scenario())
    assert isinstance(tokenizer_inbox.get(timeout_s=5), TokenizeMsg)
    assert tokenizer_inbox.get(timeout_s=0.3) is None, "an AbortBackendMsg for a finished request"
    tokenizer_inbox.close()


def test_the_listener_routes_single_and_batched_messages_to_their_own_waiters(
    socket_dir,  # noqa: ANN001
) -> None:
    tokenizer_inbox = ZmqPullQueue(ipc_address(socket_dir, "tokenizer"))

    async def scenario() -> None:
        async with frontend_and_api(socket_dir) as (frontend, to_api):
            first = frontend.submit(SamplingParams(), prompt="A")
            second = frontend.submit(SamplingParams(), prompt="B")
            to_api.put(
                BatchMsg(
                    [
                        ReplyMsg(second, "x"),
                        ReplyMsg(first, "1"),
                        ReplyMsg(second, "y", "length", 1, 2),
                        ReplyMsg(first, "2", "stop", 3, 2),
                    ]
                )
            )
            assert [r.text for r in await all_replies(frontend, first)] == ["1", "2"]
            assert [r.text for r in await all_replies(frontend, second)] == ["x", "y"]
            status = asyncio.ensure_future(frontend.status())
            request = None
            while not isinstance(request, StatusRequestMsg):  # the tokenize messages come first
                request = await asyncio.to_thread(tokenizer_inbox.get, 5)
                assert request is not None, "status() sent no StatusRequestMsg"
            answer = StatusMsg(request.request_id, 1, 2, 3, 4, 5, 6, True)
            to_api.put(answer)  # the tokenizer worker passes a status on alone, not batched
            assert await asyncio.wait_for(status, timeout=5) == answer

    asyncio.run(scenario())
    tokenizer_inbox.close()


STATUS_MSGS = st.builds(
    StatusMsg,
    *[st.integers(0, 10**9)] * 7,
    integrity_ok=st.none() | st.booleans(),
)


@QUICK
@given(STATUS_MSGS)
def test_metrics_declare_each_metric_before_its_one_sample(status: StatusMsg) -> None:
    """Prometheus' text format: `# HELP name text`, `# TYPE name kind`, then `name value`."""
    lines = metrics_text(status).splitlines()
    assert len(lines) == 3 * 7, "HELP, TYPE and one sample for each of the 7 metrics"
    integrity = -1 if status.integrity_ok is None else int(status.integrity_ok)
    expected = [
        status.running,
        status.waiting,
        status.used_pages,
        status.free_pages,
        status.cached_pages,
        status.generated_tokens,
        integrity,
    ]
    for (help_line, type_line, sample), value in zip(zip(*[iter(lines)] * 3), expected):
        name = sample.split()[0]
        assert help_line.startswith(f"# HELP {name} "), f"{help_line!r} does not precede {name}"
        assert type_line in (f"# TYPE {name} gauge", f"# TYPE {name} counter"), type_line
        assert sample == f"{name} {value}", f"{sample!r}: expected the value {value}"


# --- every stub against the reference (tools/course/differential.py) ---------------------------
# The same generated inputs go to your stub and to the reference's body of it (compiled into
# your module, so it sees your other code): return values, changes to the arguments and to
# self, and exceptions must match. The listener, the replies generator and the SSE stream show
# only through what they do over time: events recorded with your code, then with the chapter's
# reference stubs (module functions are called through their module, where those are swapped).

IN_RANGE = {  # each range-checked field's values that SamplingParams accepts, edges included
    "temperature": st.sampled_from([0.0, 2.0]) | st.floats(0.0, 2.0),
    "top_p": st.just(1.0) | st.floats(0.0, 1.0, exclude_min=True),
    "top_k": st.sampled_from([-1, 1]) | st.integers(1, 100_000),
    "max_tokens": st.sampled_from([None, 1]) | st.integers(1, 100_000),
    "seed": st.sampled_from([None, 0]) | st.integers(0, 2**32),
}
OUT_OF_RANGE = {  # each range-checked field's values that SamplingParams refuses
    "temperature": st.floats(-5.0, -1e-6),
    "top_p": st.floats(-0.5, 0.0) | st.floats(1.0, 5.0, exclude_min=True),
    "top_k": st.integers(-5, 0).filter(lambda k: k != -1),
    "max_tokens": st.integers(-3, 0),
    "seed": st.integers(-3, -1),
}


@st.composite
def sampling_fields(draw: st.DrawFn) -> dict:
    """Any subset of the fields in range (the others as the API's defaults), the OpenAI
    fields minisgl keeps aside, and at most one field out of its range: with two, either
    could be the one an error names."""
    fields = draw(
        st.fixed_dictionaries(
            {},
            optional={
                **IN_RANGE,
                "ignore_eos": st.booleans(),
                "stop": st.sampled_from([None, "\n", ["a", "b"]]),
                "stream": st.booleans(),
                "logit_bias": st.just({"1": 2}),
            },
        )
    )
    wrong = draw(st.none() | st.sampled_from(sorted(OUT_OF_RANGE)))
    if wrong is not None:
        fields[wrong] = draw(OUT_OF_RANGE[wrong])
    return fields


@settings(max_examples=60)
@given(fields=sampling_fields())
def test_sampling_params_matches_the_reference(fields: dict) -> None:
    """The same SamplingParams, or the same InvalidRequestError naming the same field."""
    assert_same_call(SamplingFields.sampling_params, SamplingFields(model="m", **fields))


def prometheus_samples(text: str) -> str:
    """The metrics text with each HELP line's words left out: their wording is free."""
    return re.sub(r"^# HELP (\S+) .*$", r"# HELP \1 ...", text, flags=re.MULTILINE)


@settings(max_examples=40)
@given(status=STATUS_MSGS | st.builds(SchedulerStatus, *[st.integers(0, 10**9)] * 7))
def test_metrics_text_matches_the_reference(status: object) -> None:
    """The same lines, names, types and values, and newlines, as the reference's text (the
    HELP lines' wording aside), for a StatusMsg or any object with the same fields."""
    reference = reference_of(metrics_text)
    found = call_differences(
        lambda s: prometheus_samples(metrics_text(s)),
        status,
        reference=lambda s: prometheus_samples(reference(s)),
    )
    assert not found, "metrics_text differs from the reference:\n  " + "\n  ".join(found)


class ScriptOver(Exception):
    """The stand-in socket has no more messages (a real one would wait for the next)."""


class ScriptedApiInbox:
    """The API server's socket: each get() hands over the script's next message."""

    def __init__(self, script: list[object]) -> None:
        self.script = list(script)

    async def get(self) -> object:
        await asyncio.sleep(0)  # as a socket read does: other tasks may run
        if not self.script:
            raise ScriptOver
        return self.script.pop(0)


class SentToTokenizer:
    """The tokenizer worker's queue: what was put on it."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    def put(self, msg: object) -> None:
        self.sent.append(msg)


def bare_frontend(script: list[object] = ()) -> FrontendManager:  # type: ignore[assignment]
    """A FrontendManager whose sockets are stand-ins (no ZMQ): `__init__`'s fields, as is."""
    frontend = FrontendManager.__new__(FrontendManager)
    frontend.to_tokenizer = SentToTokenizer()  # type: ignore[assignment]
    frontend.inbox = ScriptedApiInbox(script)  # type: ignore[assignment]
    frontend.uids = itertools.count()
    frontend.streams, frontend.status_waiters, frontend.listener = {}, {}, None
    return frontend


async def outcome(awaitable: object, timeout_s: float = 5.0) -> str:
    try:
        await asyncio.wait_for(awaitable, timeout_s)  # type: ignore[arg-type]
        return "returned"
    except asyncio.TimeoutError:
        return f"still running after {timeout_s} s"
    except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
        return f"raised {type(error).__name__}"


ROUTED_ITEMS = st.one_of(
    st.builds(
        ReplyMsg,
        st.integers(0, 5),
        st.sampled_from(["", "a", "bc"]),
        st.sampled_from([None, "stop"]),
    ),
    st.builds(StatusMsg, st.integers(10, 14), *[st.just(1)] * 6, st.just(True)),
)
API_MESSAGES = ROUTED_ITEMS | st.builds(BatchMsg, st.lists(ROUTED_ITEMS, max_size=4))


@settings(max_examples=40)
@given(
    streams=st.sets(st.integers(0, 5)),
    waiters=st.sets(st.integers(10, 14)),
    script=st.lists(API_MESSAGES, max_size=5),
)
def test_listen_routes_as_the_reference_does(streams, waiters, script) -> None:  # noqa: ANN001
    """Replies and statuses, alone or batched, for requests and waiters that exist or are
    gone (twice for the same waiter, too): each queue's replies, each waiter's answer, what is
    still routed, and how the listener ended when the socket had nothing more."""

    def run() -> list[str]:
        async def scenario() -> list[str]:
            frontend = bare_frontend(script)
            loop = asyncio.get_running_loop()
            queues = {uid: asyncio.Queue() for uid in sorted(streams)}
            futures = {rid: loop.create_future() for rid in sorted(waiters)}
            frontend.streams, frontend.status_waiters = dict(queues), dict(futures)
            events = [f"listen {await outcome(frontend.listen())}"]
            for uid, queue in queues.items():
                replies = [queue.get_nowait() for _ in range(queue.qsize())]
                events.append(f"request {uid} got {replies}")
            for rid, future in futures.items():
                answer = future.result() if future.done() else "nothing"
                events.append(f"waiter {rid} got {answer}")
            events.append(f"routed {sorted(frontend.streams)}, {sorted(frontend.status_waiters)}")
            events.append(f"sent {frontend.to_tokenizer.sent}")
            return events

        return asyncio.run(scenario())

    assert_same_trace(15, run, "listen()")


class Drained(Exception):
    """A request's queue had no more replies (a real one would wait for the next)."""


class ReplyQueue(asyncio.Queue):
    """A request's queue holding the replies given; asking for more raises Drained."""

    async def get(self) -> ReplyMsg:
        if self.empty():
            raise Drained
        return self.get_nowait()


REPLIES = st.lists(
    st.builds(
        ReplyMsg,
        st.just(3),
        st.sampled_from(["", "Hi", "!"]),
        st.sampled_from([None, None, "stop", "length", "abort"]),
        st.integers(0, 9),
        st.integers(0, 9),
        st.sampled_from([None, None, "too long"]),
    ),
    max_size=5,
)


@settings(max_examples=40)
@given(replies=REPLIES, read=st.integers(0, 6), routed=st.sampled_from([True] * 4 + [False]))
def test_replies_yields_as_the_reference_does(replies, read, routed) -> None:  # noqa: ANN001
    """A request's queue holding any replies (finishing, refusing, or none of them), read by
    a consumer that stops after `read` of them or reads on: what it got, whether the request
    was still routed after each reply, and how the generator ended."""

    def run() -> list[str]:
        async def scenario() -> list[str]:
            frontend = bare_frontend()
            if routed:
                queue = ReplyQueue()
                for reply in replies:
                    queue.put_nowait(reply)
                frontend.streams[3] = queue
            events: list[str] = []
            generator = frontend.replies(3)
            try:
                for _ in range(read):
                    reply = await asyncio.wait_for(anext(generator), 5)
                    events.append(f"got {reply}; routed {3 in frontend.streams}")
                events.append("the consumer stopped reading")
            except StopAsyncIteration:
                events.append("the replies ended")
            except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
                events.append(f"raised {type(error).__name__}")
            events.append(f"routed {sorted(frontend.streams)}; sent {frontend.to_tokenizer.sent}")
            return events

        return asyncio.run(scenario())

    assert_same_trace(15, run, "replies()")


def sse_events(events: list[str]) -> list[object]:
    """Each event's data, JSON parsed (the order of a chunk's keys is free)."""
    parsed: list[object] = []
    for event in events:
        if not (event.startswith("data: ") and event.endswith("\n\n")):
            parsed.append(f"not an SSE data event: {event!r}")
            continue
        data = event.removeprefix("data: ").removesuffix("\n\n")
        parsed.append(data if data == "[DONE]" else json.loads(data))
    return parsed


@settings(max_examples=40)
@given(
    pieces=st.lists(st.sampled_from(["", "Hel", "lo", " 🙂"]), max_size=4),
    last=st.builds(
        ReplyMsg,
        st.just(1),
        st.sampled_from(["", "!"]),
        st.sampled_from(["stop", "length", "abort"]),
        st.integers(0, 500),
        st.integers(1, 500),
    ),
    chat=st.booleans(),
    include_usage=st.booleans(),
    header=st.fixed_dictionaries(
        {"id": st.sampled_from(["cmpl-1", "chatcmpl-9"]), "created": st.integers(0, 2**31)},
        optional={"object": st.just("text_completion"), "model": st.just("SmolLM2")},
    ),
)
def test_stream_events_match_the_reference(pieces, last, chat, include_usage, header) -> None:  # noqa: ANN001
    """A stream of any pieces (empty ones too) and a last reply with or without text, for a
    completion or a chat, with usage or without: the same events, and the same replies read
    (none past the finishing one)."""
    replies = [ReplyMsg(1, text) for text in pieces] + [last]

    def run() -> list[str]:
        read: list[ReplyMsg] = []

        async def rest() -> AsyncIterator[ReplyMsg]:
            for reply in replies[1:]:
                read.append(reply)
                yield reply

        async def collect() -> list[str]:
            events = api_server.stream_events(replies[0], rest(), chat, dict(header), include_usage)
            return [event async for event in events]

        try:
            events = [
                json.dumps(data, sort_keys=True) for data in sse_events(asyncio.run(collect()))
            ]
        except Exception as error:  # noqa: BLE001 - compared with the reference's outcome
            events = [f"raised {type(error).__name__}: {error}"]
        return [*events, f"read {len(read)} of the {len(replies) - 1} replies after the first"]

    assert_same_trace(15, run, "stream_events")
