"""Chapter 15 tests: a live `python -m minisgl` server on 127.0.0.1, driven by the real
`openai` client. Greedy outputs, streamed or not, equal LLM.generate's; usage counts the
tokens; stop strings end the output; /metrics reports the scheduler in Prometheus' format.
Errors, load, disconnects and shutdown are tested in test_server_api.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import SMOLLM2, load_tokenizer, require_model
from server_fixture import LiveServer, start_server

from minisgl.core import SamplingParams
from minisgl.message import (
    BatchMsg,
    ZmqPullQueue,
    ZmqPushQueue,
    ReplyMsg,
    StatusMsg,
    TokenizeMsg,
    ipc_address,
)
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


async def all_replies(frontend: FrontendManager, uid: int) -> list[ReplyMsg]:
    async def collect() -> list[ReplyMsg]:
        return [reply async for reply in frontend.replies(uid)]

    return await asyncio.wait_for(collect(), timeout=5)


def test_the_listener_routes_batched_replies_and_drops_those_nobody_waits_for(socket_dir) -> None:  # noqa: ANN001
    async def scenario() -> None:
        frontend = FrontendManager(
            ipc_address(socket_dir, "tokenizer"), ipc_address(socket_dir, "api")
        )
        frontend.start()
        to_api = ZmqPushQueue(ipc_address(socket_dir, "api"))
        uid = frontend.submit(SamplingParams(), prompt="Hi")
        mine = [ReplyMsg(uid, "Hel"), ReplyMsg(uid, "lo", "stop", 1, 2)]
        nobodys = [ReplyMsg(uid + 100, "late"), StatusMsg(uid + 100, 0, 0, 0, 9, 0, 0, None)]
        to_api.put(BatchMsg(nobodys + mine))  # an aborted request's reply, a timed-out status
        assert await all_replies(frontend, uid) == mine
        assert not frontend.listener.done()
        to_api.close()
        frontend.close()

    asyncio.run(scenario())


def test_replies_end_at_a_refusal_and_the_request_is_forgotten(socket_dir) -> None:  # noqa: ANN001
    tokenizer_inbox = ZmqPullQueue(ipc_address(socket_dir, "tokenizer"))

    async def scenario() -> None:
        frontend = FrontendManager(
            ipc_address(socket_dir, "tokenizer"), ipc_address(socket_dir, "api")
        )
        frontend.start()
        to_api = ZmqPushQueue(ipc_address(socket_dir, "api"))
        uid = frontend.submit(SamplingParams(), prompt="Hi")
        refusal = ReplyMsg(uid, "", error="the prompt is too long")
        to_api.put(BatchMsg([refusal]))
        assert await all_replies(frontend, uid) == [refusal]
        frontend.abort(uid)  # the request is over: there is nothing to abort
        to_api.close()
        frontend.close()

    asyncio.run(scenario())
    assert isinstance(tokenizer_inbox.get(timeout_s=5), TokenizeMsg)
    assert tokenizer_inbox.get(timeout_s=0.3) is None  # no AbortBackendMsg
    tokenizer_inbox.close()


def stream(replies: list[ReplyMsg], chat: bool, include_usage: bool) -> list[str]:
    """The SSE events that stream_events makes of these replies."""

    async def rest() -> AsyncIterator[ReplyMsg]:
        for reply in replies[1:]:
            yield reply

    async def events() -> list[str]:
        return [
            event
            async for event in stream_events(
                replies[0], rest(), chat, {"id": "cmpl-1"}, include_usage
            )
        ]

    return asyncio.run(events())


def chunks_of(events: list[str]) -> list[dict]:
    assert all(event.startswith("data: ") and event.endswith("\n\n") for event in events)
    assert events[-1] == "data: [DONE]\n\n"
    return [json.loads(event.removeprefix("data: ")) for event in events[:-1]]


def test_a_stream_has_a_chunk_per_piece_the_finish_reason_last_then_done() -> None:
    replies = [
        ReplyMsg(1, ""),
        ReplyMsg(1, "Hel"),
        ReplyMsg(1, ""),
        ReplyMsg(1, "lo"),
        ReplyMsg(1, "", "length", 3, 4),
    ]
    chunks = chunks_of(stream(replies, chat=False, include_usage=False))
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [
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
