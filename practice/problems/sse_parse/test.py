"""Tests of problem 152: Reading an SSE stream from arbitrary chunks."""

import json
import random

from submission import parse_sse


def test_example():
    got = parse_sse([b'data: {"a"', b": 1}\n", b"\ndata: x\r\n\r\ndata: [DONE]\n\n"])
    assert got == ['{"a": 1}', "x"], f"got {got}"


def test_any_chunking_gives_the_same_events():
    events = [{"choices": [{"text": t}]} for t in ["Hello", " 東京", " 👍🏽", "!"]]
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events)
    body += "data: [DONE]\n\n"
    data = body.encode()
    rng = random.Random(2)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(data)), k=rng.randint(0, 12)))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        got = [json.loads(p) for p in parse_sse(chunks)]
        assert got == events, f"chunks {chunks} gave {got}"


def test_comments_other_fields_and_multiline_data():
    body = (
        b": keep-alive\n\nevent: message\nid: 7\ndata: line one\ndata:line two\n\ndata: [DONE]\n\n"
    )
    assert parse_sse([body]) == ["line one\nline two"]


def test_nothing_after_done_and_no_done_at_all():
    assert parse_sse([b"data: a\n\ndata: [DONE]\n\ndata: b\n\n"]) == ["a"]
    assert parse_sse([b"data: a\n\ndata: b\n\n"]) == ["a", "b"]


def test_an_event_without_data_yields_nothing():
    assert parse_sse([b"event: ping\n\ndata: z\n\n"]) == ["z"]
