"""Tests of problem 71: Continuous batching, step by step."""

from submission import continuous_batching


def check(requests, max_running_req, expected):
    got = continuous_batching(list(requests), max_running_req)
    got = [(phase, list(uids)) for phase, uids in got]
    if got != expected:
        first = next(
            (i for i, (g, e) in enumerate(zip(got, expected)) if g != e),
            min(len(got), len(expected)),
        )
        raise AssertionError(
            f"continuous_batching({requests}, max_running_req={max_running_req})\n"
            f"expected {expected}\ngot      {got}\n"
            f"first difference at step {first}: expected "
            f"{expected[first] if first < len(expected) else 'no step'}, "
            f"got {got[first] if first < len(got) else 'no step'}"
        )


def test_example_rows_free_up():
    check(
        [(0, 3), (0, 1), (0, 2)],
        2,
        [("prefill", [0, 1]), ("decode", [0]), ("prefill", [2]), ("decode", [0, 2])],
    )


def test_example_a_request_arrives_later():
    check(
        [(0, 4), (2, 3)],
        4,
        [
            ("prefill", [0]),
            ("decode", [0]),
            ("prefill", [1]),
            ("decode", [0, 1]),
            ("decode", [0, 1]),
        ],
    )


def test_waves_when_rows_are_short():
    check(
        [(0, 2)] * 5,
        2,
        [
            ("prefill", [0, 1]),
            ("decode", [0, 1]),
            ("prefill", [2, 3]),
            ("decode", [2, 3]),
            ("prefill", [4]),
            ("decode", [4]),
        ],
    )


def test_max_tokens_1_finishes_in_prefill_and_prefills_may_follow_each_other():
    check([(0, 1), (0, 1), (0, 1)], 2, [("prefill", [0, 1]), ("prefill", [2])])


def test_idle_steps_while_waiting_for_an_arrival():
    check(
        [(0, 1), (3, 2)],
        4,
        [("prefill", [0]), ("idle", []), ("idle", []), ("prefill", [1]), ("decode", [1])],
    )


def test_nothing_arrives_at_first():
    check([(2, 2)], 1, [("idle", []), ("idle", []), ("prefill", [0]), ("decode", [0])])


def test_one_row_serves_requests_one_after_another():
    check(
        [(0, 2), (0, 3)],
        1,
        [("prefill", [0]), ("decode", [0]), ("prefill", [1]), ("decode", [1]), ("decode", [1])],
    )


def test_first_come_first_served_and_decode_after_each_prefill():
    check(
        [(0, 5), (0, 1), (1, 2), (1, 1)],
        2,
        [
            ("prefill", [0, 1]),
            ("decode", [0]),
            ("prefill", [2]),
            ("decode", [0, 2]),
            ("prefill", [3]),
            ("decode", [0]),
            ("decode", [0]),
        ],
    )


def test_arrivals_during_a_run_are_admitted_together():
    check(
        [(0, 3), (1, 3), (2, 3)],
        8,
        [
            ("prefill", [0]),
            ("decode", [0]),
            ("prefill", [1, 2]),
            ("decode", [0, 1, 2]),
            ("decode", [1, 2]),
        ],
    )


def test_requests_are_not_listed_in_arrival_order():
    check(
        [(2, 2), (0, 2), (1, 1)],
        4,
        [("prefill", [1]), ("decode", [1]), ("prefill", [2, 0]), ("decode", [0])],
    )


def test_decode_order_is_admission_order():
    check(
        [(0, 4), (0, 2), (1, 3)],
        2,
        [
            ("prefill", [0, 1]),
            ("decode", [0, 1]),
            ("prefill", [2]),
            ("decode", [0, 2]),
            ("decode", [0, 2]),
        ],
    )
