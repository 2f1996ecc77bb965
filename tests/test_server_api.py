"""The server's behaviour beyond the chapter-15 stubs, on one live server with --api-key:
authentication, errors in OpenAI's shape for every kind of bad request (and the server keeps
serving), 32 concurrent streams, clients that disconnect mid-stream (no page is left behind),
and SIGTERM or Ctrl-C (no child process and no socket file survive). The SIGTERM test runs
last; the Ctrl-C test has a server of its own."""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import SMOLLM2, TINY_MODELS, require_model
from server_fixture import LiveServer, children_of, start_server

API_KEY = "test-key"
CONCURRENT_STREAMS = 32
DISCONNECTING_CLIENTS = 8
IDLE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def socket_tmpdir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="minisgl-api-"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def server(socket_tmpdir: Path) -> Iterator[LiveServer]:
    live = start_server(
        require_model(SMOLLM2),
        socket_tmpdir / "server.log",
        api_key=API_KEY,
        env={"TMPDIR": str(socket_tmpdir)},
    )
    yield live
    live.stop()


def metrics(server: LiveServer) -> dict[str, float]:
    with server.client() as http:
        text = http.get("/metrics").text
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def wait_until_idle(server: LiveServer) -> dict[str, float]:
    """/metrics once nothing runs or waits (aborts take a scheduler step to land)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        values = metrics(server)
        if (
            values["minisgl_running_requests"] == values["minisgl_waiting_requests"] == 0
            and values["minisgl_kv_pages_used"] == 0
        ):
            return values
        assert time.monotonic() < deadline, f"still busy after {IDLE_TIMEOUT_S} s: {values}"
        time.sleep(0.2)


def completion(server: LiveServer, **fields: object) -> dict:
    return {"model": server.model, "prompt": "Hello", "max_tokens": 4, **fields}


# --- authentication and small endpoints ----------------------------------------------------


def test_every_endpoint_but_health_needs_the_api_key(server: LiveServer) -> None:
    anonymous = httpx.Client(base_url=server.base_url, timeout=30)
    assert anonymous.get("/health").status_code == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
    ]:
        response = anonymous.request(method, path, json=completion(server))
        assert response.status_code == 401, path
        assert "API key" in response.json()["error"]["message"]
    wrong = anonymous.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_models_lists_the_served_model(server: LiveServer) -> None:
    models = server.openai().models.list()
    assert [m.id for m in models.data] == [server.model]


# --- bad requests: 4xx in OpenAI's shape, and the server goes on ---------------------------


BAD_REQUESTS = {
    "malformed JSON": ('{"model": "x", "prompt": ', 400, "JSON"),
    "wrong type": (dict(max_tokens="many"), 400, "max_tokens"),
    "unknown model": (dict(model="gpt-17"), 404, "gpt-17"),
    "negative max_tokens": (dict(max_tokens=-5), 400, "max_tokens"),
    "temperature < 0": (dict(temperature=-0.5), 400, "temperature"),
    "top_p > 1": (dict(top_p=1.5), 400, "top_p"),
    "prompt longer than the context": (dict(prompt="hello " * 9000), 400, "max_seq_len"),
    "empty prompt": (dict(prompt=""), 400, "prompt"),
    "10 MB body": (dict(prompt="x" * 10_000_000), 413, "larger than"),
    # chapter 25: response_format
    "unknown response_format": (dict(response_format={"type": "xml"}), 400, "response_format"),
    "a schema the grammar cannot follow": (
        dict(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "bogus"}},
            }
        ),
        400,
        "bogus",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_request_gets_a_clear_4xx(server: LiveServer, case: str) -> None:
    body, status, words = BAD_REQUESTS[case]
    with server.client() as http:
        if isinstance(body, str):
            response = http.post(
                "/v1/completions", content=body, headers={"content-type": "application/json"}
            )
        else:
            response = http.post("/v1/completions", json=completion(server, **body))
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error["message"] and error["type"]
    ok = server.openai().completions.create(**completion(server))  # still serving
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_a_bad_chat_request_gets_a_clear_4xx(server: LiveServer) -> None:
    with server.client() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"model": server.model, "messages": [{"role": "wizard", "content": "hi"}]},
        )
    assert response.status_code == 400
    assert "role" in response.json()["error"]["message"]


def test_response_format_gives_valid_json_on_chat_and_completions(server: LiveServer) -> None:
    import json

    import jsonschema

    def json_schema(schema: dict) -> dict:
        return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}

    age = {
        "type": "object",
        "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["age"],
    }
    flag = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    client = server.openai()
    chat = client.chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "How old is the moon?"}],
        max_tokens=16,
        temperature=0,
        response_format=json_schema(age),
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content), age)
    # A schema this small ends within a few tokens: the grammar, not max_tokens, stops it.
    completion = client.completions.create(
        model=server.model,
        prompt="Is water wet? JSON:",
        max_tokens=32,
        temperature=0,
        extra_body={"response_format": json_schema(flag)},
    )
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].text), flag)
    # json_object allows any object, so it may run out of tokens: this prompt's object ends.
    completion = client.completions.create(
        model=server.model,
        prompt="Reply with a JSON object with one key.",
        max_tokens=48,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert completion.choices[0].finish_reason == "stop", completion.choices[0].text
    assert isinstance(json.loads(completion.choices[0].text), dict)


# --- load: concurrent streams, disconnects --------------------------------------------------


def test_concurrent_streaming_clients_all_complete(server: LiveServer) -> None:
    import openai

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None]:
        stream = await client.completions.create(
            model=server.model,
            prompt=f"Story number {i}:",
            max_tokens=8,
            temperature=0.8,
            seed=i,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        text, reason = [], None
        async for chunk in stream:
            text.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        return "".join(text), reason

    async def run() -> list[tuple[str, str | None]]:
        client = openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, timeout=120, max_retries=0
        )
        return await asyncio.gather(*(one(client, i) for i in range(CONCURRENT_STREAMS)))

    results = asyncio.run(run())
    assert len(results) == CONCURRENT_STREAMS
    assert all(reason == "length" and text for text, reason in results)
    wait_until_idle(server)


def test_clients_that_disconnect_mid_stream_leave_no_pages_behind(server: LiveServer) -> None:
    async def leave_early(http: httpx.AsyncClient, i: int) -> int:
        body = completion(
            server,
            prompt=f"Tell me a long tale, part {i}.",
            max_tokens=500,
            ignore_eos=True,
            stream=True,
        )
        events = 0
        async with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                events += line.startswith("data: ")
                if events == 3:
                    break  # leaving the block closes the connection mid-stream
        return events

    async def run() -> list[int]:
        async with httpx.AsyncClient(
            base_url=server.base_url, headers=server.headers, timeout=120
        ) as http:
            return await asyncio.gather(
                *(leave_early(http, i) for i in range(DISCONNECTING_CLIENTS))
            )

    assert asyncio.run(run()) == [3] * DISCONNECTING_CLIENTS
    values = wait_until_idle(server)  # without aborts they would run 500 tokens each
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while values["minisgl_integrity_ok"] != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
        values = metrics(server)
    assert values["minisgl_integrity_ok"] == 1
    assert values["minisgl_kv_pages_used"] == 0


def test_a_non_streaming_client_that_leaves_is_aborted_too(server: LiveServer) -> None:
    with pytest.raises(httpx.TimeoutException):
        with server.client() as http:
            http.post(
                "/v1/completions",
                timeout=1.5,
                json=completion(
                    server, prompt="Write a long essay.", max_tokens=2000, ignore_eos=True
                ),
            )
    wait_until_idle(server)


# --- shutdown (last: it stops the module's server) -----------------------------------------


def stops_cleanly(server: LiveServer, socket_tmpdir: Path, sig: signal.Signals) -> None:
    """Signal the server: it exits with status 0, no child survives and no socket is left."""
    children = children_of(server.process.pid)
    assert len(children) >= 2  # the scheduler and the tokenizer worker at least
    assert list(socket_tmpdir.glob("minisgl-*/*.sock"))
    assert server.stop(sig) == 0
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [
        pid
        for pid in children
        if Path(f"/proc/{pid}").exists()
        and "Z" not in (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:1])
    ]
    assert alive == []
    assert list(socket_tmpdir.glob("minisgl-*")) == []


def test_ctrl_c_stops_every_process_and_removes_the_sockets(tmp_path: Path) -> None:
    model = require_model(TINY_MODELS["qwen3"])
    server = start_server(model, tmp_path / "server.log", env={"TMPDIR": str(tmp_path)})
    try:
        stops_cleanly(server, tmp_path, signal.SIGINT)
    finally:
        if server.process.poll() is None:
            server.process.kill()


def test_sigterm_stops_every_process_and_removes_the_sockets(
    server: LiveServer, socket_tmpdir: Path
) -> None:
    stops_cleanly(server, socket_tmpdir, signal.SIGTERM)
