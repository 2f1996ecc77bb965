"""Tests of problem 212: latencies of one stream, from its chunks."""

import math
import random

import pytest
from submission import stream_latencies


def piece(text):
    return {"choices": [{"text": text, "index": 0}]}


def usage(tokens):
    return {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens}}


def test_example():
    chunks = [
        (0.25, piece("Hel")),
        (0.25, piece("")),
        (0.5, piece("lo, w")),
        (0.75, piece("orld")),
        (0.75, usage(5)),
    ]
    got = stream_latencies(0.0, chunks, 1.0)
    expected = {"ttft": 0.25, "itl": [0.25, 0.25], "latency": 1.0, "tokens": 5, "tpot": 0.1875}
    assert got.keys() == expected.keys(), f"keys: {sorted(got)}"
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), f"{key}: expected {value}, got {got[key]}"


def test_a_stream_built_from_known_parts():
    rng = random.Random(0)
    sent = rng.uniform(10, 20)
    ttft = rng.uniform(0.1, 1.0)
    gaps = [rng.uniform(0.01, 0.1) for _ in range(7)]
    times = [sent + ttft]
    for gap in gaps:
        times.append(times[-1] + gap)
    chunks = [(t, piece("ab")) for t in times] + [(times[-1], usage(16))]
    done = times[-1] + 0.02
    got = stream_latencies(sent, chunks, done)
    assert got["ttft"] == pytest.approx(ttft)
    assert got["itl"] == pytest.approx(gaps), "ITL: the gaps between consecutive pieces"
    assert got["latency"] == pytest.approx(done - sent)
    assert got["tokens"] == 16, "tokens come from usage, not from counting pieces"
    assert got["tpot"] == pytest.approx((done - sent - ttft) / 15)


def test_empty_and_usage_chunks_are_not_pieces():
    chunks = [(1.0, piece("")), (2.0, piece("x")), (2.5, usage(1)), (3.0, piece(""))]
    got = stream_latencies(0.5, chunks, 3.5)
    assert got["ttft"] == pytest.approx(1.5) and got["itl"] == []
    assert math.isnan(got["tpot"]), "one token: no time per output token"


def test_no_usage_means_zero_tokens_and_no_text_is_an_error():
    got = stream_latencies(0.0, [(1.0, piece("a")), (2.0, piece("b"))], 2.0)
    assert got["tokens"] == 0 and math.isnan(got["tpot"])
    with pytest.raises(ValueError):
        stream_latencies(0.0, [(1.0, piece("")), (1.0, usage(0))], 1.0)
