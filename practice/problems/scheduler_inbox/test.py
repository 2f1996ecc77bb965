"""Tests of problem 142: The scheduler's inbox."""

from submission import handle_all


def check(msgs, expected, max_seq_len=8192):
    got = handle_all(msgs, max_seq_len)
    assert got == expected, f"handle_all({msgs}):\n expected {expected}\n got      {got}"


def test_example():
    check(
        [
            ("user", 1, 4, 2),
            ("user", 2, 9000, 8),
            ("step",),
            ("status",),
            ("abort", 1),
            ("status",),
        ],
        [("error", 2), ("status", 1, 0), ("status", 0, 0)],
    )


def test_requests_finish_after_max_tokens_steps_in_start_order():
    check(
        [("user", 1, 3, 2), ("user", 2, 3, 1), ("step",), ("step",), ("step",)],
        [("done", 2), ("done", 1)],
    )


def test_abort_of_a_waiting_request_and_of_an_unknown_uid():
    check(
        [("user", 5, 3, 4), ("abort", 5), ("abort", 99), ("status",), ("step",)], [("status", 0, 0)]
    )


def test_empty_and_too_long_prompts_are_errors_and_nothing_is_queued():
    check(
        [("user", 1, 0, 4), ("user", 2, 10, 7), ("user", 3, 10, 6), ("status",)],
        [("error", 1), ("error", 2), ("status", 0, 1)],
        max_seq_len=16,
    )


def test_an_aborted_request_never_reports_done():
    check([("user", 1, 3, 3), ("step",), ("abort", 1), ("step",), ("step",), ("step",)], [])


def test_status_counts_waiting_and_running_separately():
    check([("user", 1, 3, 5), ("step",), ("user", 2, 3, 5), ("status",)], [("status", 1, 1)])
