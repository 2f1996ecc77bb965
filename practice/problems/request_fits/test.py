"""Tests of problem 63: Can the engine ever serve this request?"""

from submission import check_request_fits, max_tokens_allowed


def check(args, expected):
    got = check_request_fits(*args)
    names = "prompt_len, max_tokens, max_seq_len, num_pages, page_size"
    assert got == expected, (
        f"check_request_fits({names} = {args}): expected {expected!r}, got {got!r}"
    )


def check_max(args, expected):
    got = max_tokens_allowed(*args)
    names = "prompt_len, max_seq_len, num_pages, page_size"
    assert got == expected, f"max_tokens_allowed({names} = {args}): expected {expected}, got {got}"


def test_example_a_64_token_pool():
    check((6, 8, 2048, 64, 1), "ok")
    check((50, 14, 2048, 64, 1), "pool")
    check_max((50, 2048, 64, 1), 13)


def test_empty_prompt_is_checked_first():
    check((0, 8, 2048, 64, 1), "empty")
    check((0, 5000, 16, 1, 16), "empty")


def test_the_row_limit_is_checked_before_the_pool():
    check((2000, 100, 2048, 8, 1), "max_seq_len")


def test_boundaries_are_inclusive():
    check((10, 6, 16, 1000, 1), "ok")  # exactly max_seq_len
    check((10, 7, 16, 1000, 1), "max_seq_len")
    check((50, 13, 2048, 64, 1), "ok")  # 50 + 13 + 1 == 64
    check((10, 26, 2048, 10, 4), "ok")  # 36 + 4 slack == 40 slots
    check((10, 27, 2048, 10, 4), "pool")


def test_the_slack_is_a_whole_page():
    check((20, 10, 2048, 2, 16), "pool")  # 30 + 16 = 46 > 32 slots
    check((20, 10, 2048, 3, 16), "ok")  # 46 <= 48 slots
    check((20, 10, 2048, 30, 1), "pool")  # 30 + 1 = 31 > 30
    check((20, 10, 2048, 31, 1), "ok")  # 30 + 1 = 31 <= 31


def test_max_tokens_allowed_takes_the_tighter_limit():
    check_max((10, 16, 1000, 1), 6)  # the row limits
    check_max((10, 2048, 10, 4), 26)  # the pool limits: 40 - 4 - 10
    check_max((6, 2048, 64, 1), 57)


def test_max_tokens_allowed_is_zero_when_nothing_fits():
    check_max((64, 2048, 64, 1), 0)
    check_max((70, 2048, 64, 1), 0)
    check_max((16, 16, 100, 1), 0)


def test_max_tokens_allowed_agrees_with_check_request_fits():
    for args in [(7, 40, 12, 4), (1, 9, 3, 2), (33, 2048, 20, 2), (5, 5, 100, 1)]:
        prompt_len, max_seq_len, num_pages, page_size = args
        best = max_tokens_allowed(*args)
        if best > 0:
            check((prompt_len, best, max_seq_len, num_pages, page_size), "ok")
        got = check_request_fits(prompt_len, best + 1, max_seq_len, num_pages, page_size)
        assert got != "ok", (
            f"max_tokens_allowed{args} = {best}, but max_tokens={best + 1} is still accepted"
        )
