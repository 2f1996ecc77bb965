"""Tests of problem 83: Admission control on a trace."""

from submission import admission_trace


def check(requests, num_pages, page_size, max_running_req, expected):
    got = admission_trace(list(requests), num_pages, page_size, max_running_req)
    got = [(phase, list(uids), free) for phase, uids, free in got]
    if got != expected:
        first = next(
            (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
            min(len(got), len(expected)),
        )
        raise AssertionError(
            f"admission_trace({requests}, num_pages={num_pages}, page_size={page_size}, "
            f"max_running_req={max_running_req})\n"
            f"first difference at step {first}: expected "
            f"{expected[first] if first < len(expected) else 'no step'}, "
            f"got {got[first] if first < len(got) else 'no step'}\n"
            f"expected {expected}\ngot      {got}"
        )


def test_example_the_64_token_pool():
    check(
        [(6, 8), (5, 8), (7, 8), (6, 8), (5, 8)],
        64,
        1,
        8,
        [("prefill", [0, 1, 2, 3], 40)]
        + [("decode", [0, 1, 2, 3], free) for free in (36, 32, 28, 24, 20, 16, 64)]
        + [("prefill", [4], 59)]
        + [("decode", [4], free) for free in (58, 57, 56, 55, 54, 53, 64)],
    )


def test_example_a_blocked_head_blocks_the_queue():
    check(
        [(3, 2), (20, 4), (2, 2), (2, 2)],
        30,
        1,
        8,
        [
            ("prefill", [0], 27),
            ("decode", [0], 30),
            ("prefill", [1, 2], 8),
            ("decode", [1, 2], 9),
            ("prefill", [3], 7),
            ("decode", [1, 3], 8),
            ("decode", [1], 30),
        ],
    )


def test_the_running_requests_reservation_blocks_admission():
    # after the prefill 16 pages are free, enough for request 1's prompt, but request 0 may
    # still need 9 tokens + a page: 10 + 9 > 16
    check(
        [(4, 10), (4, 4)],
        20,
        1,
        8,
        [("prefill", [0], 16)]
        + [("decode", [0], free) for free in (15, 14, 13, 12, 11, 10, 9, 8, 20)]
        + [("prefill", [1], 16), ("decode", [1], 15), ("decode", [1], 14), ("decode", [1], 20)],
    )


def test_rows_limit_admission_too():
    check(
        [(2, 2)] * 3,
        100,
        1,
        2,
        [
            ("prefill", [0, 1], 96),
            ("decode", [0, 1], 100),
            ("prefill", [2], 98),
            ("decode", [2], 100),
        ],
    )


def test_pages_of_4_decode_inside_owned_pages():
    check(
        [(5, 3), (6, 3), (5, 2)],
        8,
        4,
        8,
        [
            ("prefill", [0, 1], 4),
            ("decode", [0, 1], 4),
            ("decode", [0, 1], 8),
            ("prefill", [2], 6),
            ("decode", [2], 8),
        ],
    )


def test_the_slack_is_a_whole_page():
    # 16 + 4 + 16 = 36 and 3 + 2 + 16 = 21: 57 > 48 slots, although the tokens alone fit
    check(
        [(16, 4), (3, 2), (3, 2)],
        3,
        16,
        8,
        [
            ("prefill", [0], 2),
            ("decode", [0], 1),
            ("decode", [0], 1),
            ("decode", [0], 3),
            ("prefill", [1, 2], 1),
            ("decode", [1, 2], 3),
        ],
    )


def test_a_small_request_is_admitted_beside_running_ones():
    check(
        [(10, 5), (10, 5), (1, 1)],
        33,
        1,
        8,
        [
            ("prefill", [0, 1], 13),
            ("decode", [0, 1], 11),
            ("prefill", [2], 11),
            ("decode", [0, 1], 9),
            ("decode", [0, 1], 7),
            ("decode", [0, 1], 33),
        ],
    )


def test_max_tokens_1_requests_one_at_a_time():
    # each needs 3 + 1 + 1 = 5 of 8 slots: only one fits at a time; prefills follow each other
    check(
        [(3, 1), (3, 1), (3, 1)],
        8,
        1,
        4,
        [("prefill", [0], 8), ("prefill", [1], 8), ("prefill", [2], 8)],
    )


def test_a_request_that_exactly_fills_the_pool():
    check([(1, 1)], 3, 1, 1, [("prefill", [0], 3)])
