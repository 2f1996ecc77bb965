"""The online client: concurrent streaming requests to an OpenAI-compatible server.

Each request streams /v1/completions (or /v1/chat/completions, with the prompt as one user
message, for a server without the first) and records when it was sent, when each piece of its
stream arrived (a chunk that carries tokens, `token_piece`) and when the stream ended
(`RequestResult`); `metrics.summarize` turns the records of a run into latencies and throughput.
Requests arrive as a Poisson process at `rate` per second (`inf`: all at once), at most
`concurrency` in flight.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any

import httpx
from tqdm import tqdm

from .metrics import RequestResult

WORDS = (
    "river stone cloud paper garden window silver engine music winter candle forest "
    "market bridge letter island orange planet rocket shadow"
).split()


def make_prompt(rng: random.Random, words: int) -> str:
    """A prompt of `words` random English words (real text for the server's tokenizer)."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


def token_piece(choice: dict[str, Any]) -> bool:
    """Whether a streamed completion choice carries tokens.

    In the OpenAI protocol a streamed completion sends a choice for generated output (a chat
    completion: a `delta`); the usage chunk has no choice at all. A choice's text may be empty
    and still carry a token: the token
    decodes to nothing (an id beyond the tokenizer's vocabulary) or its bytes wait for the rest
    of a character. The one empty choice that carries none is the closing one some servers send
    with only a finish_reason (transformers serve; OpenAI's chat API): it marks the end.
    """
    return bool(choice_text(choice)) or choice.get("finish_reason") is None


def choice_text(choice: dict[str, Any]) -> str:
    """A streamed choice's text: a completion's `text`, or a chat delta's `content`."""
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def server_error(error: Any) -> str:
    """The message of an error event sent mid-stream: OpenAI's {"message": ...} or a string."""
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


async def one_request(
    http: httpx.AsyncClient,
    model: str,
    prompt: str,
    output_len: int,
    extra: dict[str, Any],
    chat: bool = False,
) -> RequestResult:
    """Stream one completion, noting when each piece (a chunk that carries tokens) arrived.

    The token count is the server's `usage` (asked for with stream_options.include_usage);
    from a server that sends none, one token per piece. The request succeeds when its stream
    ends after a finish_reason, with or without text; an HTTP error, a broken stream, an error
    event or a stream that ends before its finish_reason is an error.
    """
    body = {
        "model": model,
        **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
        "max_tokens": output_len,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    result = RequestResult(sent_s=time.perf_counter())
    finish_reason: str | None = None
    usage_tokens: int | None = None
    try:
        endpoint = "/v1/chat/completions" if chat else "/v1/completions"
        async with http.stream("POST", endpoint, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                arrived_s = time.perf_counter()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    result.error = f"the server sent an error: {server_error(chunk['error'])}"
                    return result
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    if token_piece(choice):
                        result.piece_s.append(arrived_s)
                    result.text_chars += len(choice_text(choice))
                    finish_reason = choice.get("finish_reason") or finish_reason
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as error:
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.done_s = time.perf_counter()
    if finish_reason is None:
        result.error = (
            f"the stream ended without a finish_reason, after {len(result.piece_s)} pieces"
        )
        return result
    result.output_tokens = len(result.piece_s) if usage_tokens is None else usage_tokens
    result.ok = True
    return result


async def run_load(
    url: str,
    model: str,
    num_requests: int | None,
    duration_s: float | None,
    rate: float,
    concurrency: int,
    input_words: int,
    output_len: int,
    seed: int,
    headers: dict[str, str] | None = None,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
    chat: bool = False,
) -> tuple[list[RequestResult], float]:
    """Send the load; returns every request's result and the wall time of the run (from the
    first request sent to the last stream ended). New requests stop after `num_requests` or
    `duration_s`, whichever comes first. `extra` adds fields to every request body (default:
    `ignore_eos`, a minisgl extension, so each request generates exactly `output_len`);
    `chat` sends chat completions."""
    extra = {"ignore_eos": True} if extra is None else extra
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency)
    results: list[RequestResult] = []
    tasks: list[asyncio.Task] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as http:
        bar = tqdm(total=num_requests, desc="requests", unit="req", disable=not progress)

        async def limited(prompt: str) -> None:
            try:
                result = await one_request(http, model, prompt, output_len, extra, chat)
            finally:
                limit.release()
            results.append(result)
            bar.update()

        start = time.perf_counter()
        sent = 0
        while (num_requests is None or sent < num_requests) and (
            duration_s is None or time.perf_counter() - start < duration_s
        ):
            await limit.acquire()  # at most `concurrency` in flight
            tasks.append(asyncio.create_task(limited(make_prompt(rng, input_words))))
            sent += 1
            if rate != math.inf:
                await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        seconds = time.perf_counter() - start
        bar.close()
    return results, seconds
