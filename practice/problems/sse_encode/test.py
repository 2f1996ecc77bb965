"""Tests of problem 151: A streamed completion as Server-Sent Events."""

import json

from submission import sse_events


def payloads(events):
    for e in events:
        assert e.startswith("data: ") and e.endswith("\n\n"), f"not an SSE event: {e!r}"
    return [e[len("data: ") : -2] for e in events]


def test_example():
    got = sse_events({"id": "cmpl-1"}, [("Hi", None), ("", None), ("!", "length")], None)
    expected = [
        'data: {"id": "cmpl-1", "choices": [{"index": 0, "text": "Hi", '
        '"finish_reason": null}]}\n\n',
        'data: {"id": "cmpl-1", "choices": [{"index": 0, "text": "!", '
        '"finish_reason": "length"}]}\n\n',
        "data: [DONE]\n\n",
    ]
    assert got == expected, f"got {got}"


def test_an_empty_final_piece_still_carries_the_finish_reason():
    got = payloads(sse_events({"id": "x"}, [("a", None), ("", "stop")], None))
    assert json.loads(got[-2])["choices"][0] == {"index": 0, "text": "", "finish_reason": "stop"}
    assert got[-1] == "[DONE]" and len(got) == 3


def test_usage_comes_after_the_pieces_with_no_choices():
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    got = payloads(sse_events({"id": "y", "model": "m"}, [("a", None), ("b", "length")], usage))
    assert json.loads(got[2]) == {"id": "y", "model": "m", "choices": [], "usage": usage}
    assert got[3] == "[DONE]"


def test_every_chunk_carries_the_header_and_nothing_follows_the_finish():
    header = {"id": "z", "object": "text_completion", "created": 5, "model": "m"}
    got = payloads(sse_events(header, [("a", None), ("b", "stop"), ("late", None)], None))
    chunks = [json.loads(p) for p in got[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["a", "b"]
    assert all({k: c[k] for k in header} == header for c in chunks)
