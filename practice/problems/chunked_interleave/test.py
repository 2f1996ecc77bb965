"""Tests of problem 102: Chunks and decodes, interleaved."""

from submission import chunked_schedule


def check(requests, max_extend_tokens, expected):
    got = chunked_schedule(list(requests), max_extend_tokens)
    got = [(phase, [tuple(x) for x in batch]) for phase, batch in got]
    if got != expected:
        first = next(
            (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
            min(len(got), len(expected)),
        )
        raise AssertionError(
            f"chunked_schedule({requests}, max_extend_tokens={max_extend_tokens})\n"
            f"first difference at step {first}: expected "
            f"{expected[first] if first < len(expected) else 'no step'}, "
            f"got {got[first] if first < len(got) else 'no step'}\n"
            f"expected {expected}\ngot      {got}"
        )


def test_example_a_short_and_a_long_request():
    check(
        [(20, 4), (200, 2)],
        96,
        [
            ("prefill", [(0, 20), (1, 76)]),
            ("decode", [(0, 1)]),
            ("prefill", [(1, 96)]),
            ("decode", [(0, 1)]),
            ("prefill", [(1, 28)]),
            ("decode", [(0, 1), (1, 1)]),
        ],
    )


def test_example_a_long_prompt_alone():
    check(
        [(300, 3)],
        96,
        [
            ("prefill", [(0, 96)]),
            ("prefill", [(0, 96)]),
            ("prefill", [(0, 96)]),
            ("prefill", [(0, 12)]),
            ("decode", [(0, 1)]),
            ("decode", [(0, 1)]),
        ],
    )


def test_no_chunking_needed():
    check(
        [(10, 2), (10, 3)],
        100,
        [("prefill", [(0, 10), (1, 10)]), ("decode", [(0, 1), (1, 1)]), ("decode", [(1, 1)])],
    )


def test_max_tokens_1_never_decodes():
    check([(30, 1), (30, 1)], 40, [("prefill", [(0, 30), (1, 10)]), ("prefill", [(1, 20)])])


def test_a_chunk_then_the_next_request_in_the_same_step():
    check(
        [(30, 2), (10, 2)],
        20,
        [("prefill", [(0, 20)]), ("prefill", [(0, 10), (1, 10)]), ("decode", [(0, 1), (1, 1)])],
    )


def test_decode_between_every_chunk():
    check(
        [(5, 6), (50, 1)],
        16,
        [
            ("prefill", [(0, 5), (1, 11)]),
            ("decode", [(0, 1)]),
            ("prefill", [(1, 16)]),
            ("decode", [(0, 1)]),
            ("prefill", [(1, 16)]),
            ("decode", [(0, 1)]),
            ("prefill", [(1, 7)]),
            ("decode", [(0, 1)]),
            ("decode", [(0, 1)]),
        ],
    )


def test_running_order_is_the_order_prompts_completed():
    check(
        [(40, 3), (4, 3)],
        16,
        [
            ("prefill", [(0, 16)]),
            ("prefill", [(0, 16)]),
            ("prefill", [(0, 8), (1, 4)]),
            ("decode", [(0, 1), (1, 1)]),
            ("decode", [(0, 1), (1, 1)]),
        ],
    )
