"""The online benchmark's client against scripted servers on 127.0.0.1: real HTTP through the
client's own httpx connection pool, a server that sends exactly the bytes a test wrote. What the
client counts as a token, as an error and as a stream without text, for the stream shapes real
servers send: minisgl's (no chunk for a token without text, usage in a chunk of its own, then
[DONE]), one chunk per token with empty text, and transformers serve's (usage on a closing
chunk that carries only the finish_reason, no [DONE])."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from minisgl.benchmark import RequestResult, run_load, summarize

OUTPUT_LEN = 6
PAUSE_S = 0.2  # before a script's first token: the TTFT it must show

# A script is what the server writes after its headers: SSE events, and pauses (seconds).
Script = list[str | float]


def event(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def piece(text: str, finish_reason: str | None = None, **extra: Any) -> str:
    """A completion chunk with one choice (and e.g. `usage` in `extra`)."""
    choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    return event({"object": "text_completion", "choices": [choice], **extra})


def usage(completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": 4,
        "completion_tokens": completion_tokens,
        "total_tokens": 4 + completion_tokens,
    }


DONE = event("[DONE]")


@dataclass
class ScriptedServer:
    """An HTTP/1.1 server on a free port that answers every request with `script`, chunked;
    `complete=False` closes the connection mid-body instead of sending the last chunk."""

    script: Script
    status: int = 200
    complete: bool = True
    bodies: list[dict[str, Any]] = field(default_factory=list)  # the request bodies it got
    paths: list[str] = field(default_factory=list)  # and the paths they were posted to

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        self.paths.append(head.split()[1])
        length = int(head.split("content-length:")[1].split("\r\n")[0])
        self.bodies.append(json.loads(await reader.readexactly(length)))
        writer.write(
            f"HTTP/1.1 {self.status} Scripted\r\ncontent-type: text/event-stream\r\n"
            "transfer-encoding: chunked\r\nconnection: close\r\n\r\n".encode()
        )
        for step in self.script:
            if isinstance(step, float):
                await writer.drain()
                await asyncio.sleep(step)
                continue
            data = step.encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        if self.complete:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        """Serve while the block runs; yields the base URL."""
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            yield f"http://127.0.0.1:{port}"


def load(server: ScriptedServer, requests: int = 3, chat: bool = False) -> list[RequestResult]:
    """`requests` streams against the scripted server, all at once, as python -m benchmark online
    sends them."""

    async def run() -> list[RequestResult]:
        async with server.running() as url:
            results, _ = await run_load(
                url,
                "scripted",
                num_requests=requests,
                duration_s=None,
                rate=math.inf,
                concurrency=requests,
                input_words=4,
                output_len=OUTPUT_LEN,
                seed=0,
                progress=False,
                chat=chat,
            )
        return results

    return asyncio.run(run())


# --- tokens without text ----------------------------------------------------------------------

# minisgl sends no chunk for a token without text: only the closing one, then usage.
MINISGL_NO_TEXT = [PAUSE_S, piece("", "length"), event({"choices": [], "usage": usage(6)}), DONE]
# A server that sends one chunk per token whatever its text (vLLM's way).
CHUNK_PER_TOKEN_NO_TEXT = [
    PAUSE_S,
    *[piece("") for _ in range(OUTPUT_LEN - 1)],
    piece("", "length"),
    event({"choices": [], "usage": usage(OUTPUT_LEN)}),
    DONE,
]


@pytest.mark.parametrize(
    ("script", "pieces"),
    [(MINISGL_NO_TEXT, 0), (CHUNK_PER_TOKEN_NO_TEXT, OUTPUT_LEN - 1)],
    ids=["no-chunk-per-token", "chunk-per-token"],
)
def test_tokens_without_text_count_as_tokens_and_not_as_errors(script: Script, pieces: int) -> None:
    results = load(ScriptedServer(script))
    for r in results:
        assert r.ok and r.error == "", r.error
        assert r.output_tokens == OUTPUT_LEN and r.text_chars == 0
        assert len(r.piece_s) == pieces
        if pieces:  # an empty chunk that carries a token is the first token
            assert PAUSE_S <= r.ttft_s <= r.latency_s
        else:  # no chunk told when the first token came: no TTFT, and not the stream's end
            assert math.isnan(r.ttft_s)
    summary = summarize(results, seconds=2.0)
    assert summary["errors"] == 0 and summary["streams_without_text"] == len(results)
    assert summary["output_tokens"] == OUTPUT_LEN * len(results)
    assert summary["token_throughput"] == pytest.approx(OUTPUT_LEN * len(results) / 2.0)
    assert math.isnan(summary["ttft_p50_ms"]) == (pieces == 0)


# --- real errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            ScriptedServer([piece("Hel"), piece("lo")], complete=False),
            "RemoteProtocolError: peer closed connection",
        ),
        (ScriptedServer([piece("Hel"), piece("lo"), DONE]), "without a finish_reason, after 2"),
        (
            ScriptedServer([piece("Hel"), event({"error": {"message": "out of KV pages"}})]),
            "the server sent an error: out of KV pages",
        ),
        (ScriptedServer([event("overloaded")], status=503), "HTTP 503: "),
    ],
    ids=["cut-off", "no-finish-reason", "error-event", "http-error"],
)
def test_a_stream_that_breaks_is_an_error_with_its_message(
    server: ScriptedServer, message: str
) -> None:
    results = load(server)
    for r in results:
        assert not r.ok and message in r.error, r.error
    summary = summarize(results, seconds=1.0)
    assert summary["errors"] == len(results) and summary["streams_without_text"] == 0
    assert summary["output_tokens"] == 0


# --- who counts the tokens --------------------------------------------------------------------

PIECES = [piece("Hel"), 0.05, piece("lo, w"), 0.05]
# minisgl: usage in a chunk of its own after the closing one, then [DONE].
MINISGL_USAGE = [
    PAUSE_S,
    *PIECES,
    piece("orld", "length"),
    event({"choices": [], "usage": usage(7)}),
    DONE,
]
# transformers serve: the closing chunk has no text, only the finish_reason and usage; no [DONE].
TRANSFORMERS_USAGE = [PAUSE_S, *PIECES, piece("orld"), piece("", "length", usage=usage(7))]
NO_USAGE = [PAUSE_S, *PIECES, piece("orld", "length"), DONE]


@pytest.mark.parametrize(
    ("script", "tokens"),
    [(MINISGL_USAGE, 7), (TRANSFORMERS_USAGE, 7), (NO_USAGE, 3)],
    ids=["usage-chunk", "usage-on-closing-chunk", "no-usage"],
)
def test_the_servers_usage_wins_over_counting_pieces(script: Script, tokens: int) -> None:
    server = ScriptedServer(script)
    results = load(server)
    assert all(body["stream_options"] == {"include_usage": True} for body in server.bodies)
    for r in results:
        assert r.ok, r.error
        assert r.output_tokens == tokens and r.text_chars == len("Hello, world")
        assert len(r.piece_s) == 3, "the closing chunk without text carries no token"
        assert PAUSE_S <= r.ttft_s and len(r.itl_s) == 2
        assert r.ttft_s + sum(r.itl_s) >= PAUSE_S + 0.1, "the last piece came after two pauses"
    summary = summarize(results, seconds=1.0)
    assert summary["errors"] == 0 and summary["streams_without_text"] == 0
    assert summary["output_tokens"] == tokens * len(results)


# --- chat completions, as upstream mini-sglang streams them ----------------------------------


def chat_piece(delta: dict[str, str], finish_reason: str | None = None) -> str:
    choice = {"delta": delta, "index": 0, "finish_reason": finish_reason}
    return event({"object": "text_completion.chunk", "choices": [choice]})


# Upstream mini-sglang @20fcd7f (python/minisgl/server/api_server.py:161-189): a chunk per
# detokenized piece, the role in the first delta, a closing chunk with an empty delta and
# "stop", then [DONE]; no usage.
UPSTREAM_CHAT = [
    PAUSE_S,
    chat_piece({"role": "assistant", "content": "Hel"}),
    *[chat_piece({"content": "lo"}) for _ in range(OUTPUT_LEN - 1)],
    chat_piece({}, "stop"),
    DONE,
]


def test_chat_requests_carry_the_prompt_as_a_message_and_count_each_delta_as_a_token() -> None:
    server = ScriptedServer(UPSTREAM_CHAT)
    results = load(server, chat=True)
    assert set(server.paths) == {"/v1/chat/completions"}
    for body in server.bodies:
        assert "prompt" not in body and body["messages"][0]["role"] == "user"
        assert len(body["messages"][0]["content"].split()) == 4  # input_words
    for result in results:
        assert result.ok, result.error
        assert result.output_tokens == OUTPUT_LEN  # no usage: one token per piece
        assert result.text_chars == len("Hel") + 2 * (OUTPUT_LEN - 1)
        assert result.ttft_s >= PAUSE_S
