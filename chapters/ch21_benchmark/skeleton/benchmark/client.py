"""The online client: concurrent streaming requests to an OpenAI-compatible server.

Each request streams /v1/completions and records when it was sent, when each piece of text
arrived and when the stream ended (`RequestResult`); `metrics.summarize` turns the records of a
run into latencies and throughput. Requests arrive as a Poisson process at `rate` per second
(`inf`: all at once), at most `concurrency` in flight.
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


async def one_request(
    http: httpx.AsyncClient, model: str, prompt: str, output_len: int, extra: dict[str, Any]
) -> RequestResult:
    """Stream one completion, noting the time of every piece of text."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    result = RequestResult(sent_s=time.perf_counter())
    try:
        async with http.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if chunk.get("usage"):
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0].get("text"):
                    result.piece_s.append(time.perf_counter())
    except (httpx.HTTPError, json.JSONDecodeError, KeyError) as error:
        result.error = f"{type(error).__name__}: {error}"
        return result
    result.done_s = time.perf_counter()
    result.ok = bool(result.piece_s)
    if not result.ok:
        result.error = "the stream ended without any text"
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
) -> tuple[list[RequestResult], float]:
    """Send the load; returns every request's result and the wall time of the run (from the
    first request sent to the last stream ended). New requests stop after `num_requests` or
    `duration_s`, whichever comes first. `extra` adds fields to every request body (default:
    `ignore_eos`, a minisgl extension, so each request generates exactly `output_len`)."""
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
                result = await one_request(http, model, prompt, output_len, extra)
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
