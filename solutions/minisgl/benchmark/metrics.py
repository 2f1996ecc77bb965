"""Latency and throughput from the timestamps a streaming client records.

For each request the client notes when it sent it, when each piece of its stream arrived (a
chunk that carries tokens, whatever its text) and when the stream ended. Everything a user feels
comes from those times: the time to first token (TTFT), the inter-token latency (ITL, the gaps
between pieces) and the end-to-end latency; a server's capacity is the throughput of the whole
run. Tails matter more than means, so each is reported as percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, interpolating linearly between ranks.

    Sort the values; the percentile sits at rank `k = (n - 1) * q / 100` counted from 0, between
    the values at ranks `floor(k)` and `ceil(k)`, in proportion to `k`'s fraction. So q=0 is the
    minimum, q=100 the maximum, q=50 of an even count the mean of the two middle values. No
    values: nan (a run where every request failed has no latency, not a latency of 0).
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low, high = math.floor(k), math.ceil(k)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


@dataclass
class RequestResult:
    """One streamed request as its client saw it (times in seconds of time.perf_counter).

    `ok`: the stream ended normally, after a finish_reason; otherwise `error` says what broke.
    A stream can end normally without any text, when its tokens decode to nothing (ids beyond
    the tokenizer's vocabulary): that is `text_chars == 0`, not an error.
    """

    ok: bool = False
    error: str = ""
    sent_s: float = 0.0  # the request left the client
    piece_s: list[float] = field(default_factory=list)  # each chunk that carries tokens arrived
    done_s: float = 0.0  # the stream ended
    output_tokens: int = 0  # the server's count (`usage`): a piece may hold several tokens
    text_chars: int = 0  # characters of text in the whole stream

    @property
    def ttft_s(self) -> float:
        """Time to first token: from sending the request to its first piece.

        Measured from `sent_s`, not from when the response's headers came back: the user waits
        from the click. The first piece, not the first chunk: a chunk may carry no token. A
        stream without pieces (its server sent no chunk for tokens without text) gives nan: the
        client cannot tell when its first token came, and the end of the stream is not it.
        """
        if not self.piece_s:
            return math.nan
        return self.piece_s[0] - self.sent_s

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: the gap between each piece and the one before it.

        n pieces give n - 1 gaps; the first piece's wait is the TTFT, not a gap.
        """
        return [later - earlier for earlier, later in zip(self.piece_s, self.piece_s[1:])]

    @property
    def latency_s(self) -> float:
        """End-to-end latency: from sending the request to the end of its stream."""
        return self.done_s - self.sent_s


PERCENTILES = (50, 90, 99)


def summarize(results: Sequence[RequestResult], seconds: float) -> dict[str, float]:
    """The run's figures: counts, throughput over its wall time, latency percentiles in ms.

    Only requests that succeeded count toward tokens and latencies; the others are `errors`.
    A stream that succeeded without any text is no error: its tokens and latency count, and
    `streams_without_text` counts it apart. Output tokens are the server's counts
    (`output_tokens`), not the number of pieces. The throughputs divide by `seconds`, the wall
    time of the whole run (first request sent to last stream ended), not by the sum of request
    latencies (concurrent requests overlap). TTFT comes only from the streams that have a
    piece. ITL pools the gaps of every request, so a long request weighs as much as its
    gaps. Keys: requests, errors, streams_without_text, seconds, output_tokens,
    request_throughput, token_throughput, and for q in PERCENTILES ttft_p{q}_ms, itl_p{q}_ms,
    latency_p{q}_ms.
    """
    good = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in good)
    summary = {
        "requests": len(results),
        "errors": len(results) - len(good),
        "streams_without_text": sum(1 for r in good if r.text_chars == 0),
        "seconds": seconds,
        "output_tokens": tokens,
        "request_throughput": len(good) / seconds,
        "token_throughput": tokens / seconds,
    }
    samples = {
        "ttft": [r.ttft_s for r in good if r.piece_s],
        "itl": [gap for r in good for gap in r.itl_s],
        "latency": [r.latency_s for r in good],
    }
    for name, values in samples.items():
        for q in PERCENTILES:
            summary[f"{name}_p{q}_ms"] = percentile(values, q) * 1e3
    return summary
