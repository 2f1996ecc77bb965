"""Tests of problem 243: Rolling a verify step back."""

from submission import verify_pages


def check(device_len, drafts, emitted, page, expected):
    got = verify_pages(device_len, drafts, emitted, page)
    got = (tuple(got[0]), list(got[1]), list(got[2]))
    assert got == expected, (
        f"verify_pages(device_len={device_len}, drafts={drafts}, emitted={emitted}, "
        f"page={page})\nexpected {expected}\ngot      {got}"
    )


def test_example_everything_kept():
    check(10, 4, 5, 4, ((14, 15), [3], []))


def test_example_nothing_accepted():
    check(10, 4, 1, 4, ((10, 11), [3], [3]))


def test_example_pages_of_one_token():
    check(10, 4, 1, 1, ((10, 11), [9, 10, 11, 12, 13], [10, 11, 12, 13]))


def test_a_partial_acceptance_keeps_the_page_it_reaches():
    check(9, 6, 3, 4, ((11, 12), [2, 3], [3]))


def test_no_page_allocated_when_the_drafts_fit_in_the_last_one():
    check(5, 2, 1, 4, ((5, 6), [1], []))
    check(6, 2, 3, 8, ((8, 9), [], []))


def test_the_newest_tokens_page_is_not_kept():
    # cached_len 12 fills pages 0-2 exactly: page 3 (position 12) is the next step's to take
    check(10, 4, 3, 4, ((12, 13), [3], [3]))


def test_no_drafts_is_a_plain_decode_step():
    check(9, 0, 1, 4, ((9, 10), [2], []))
