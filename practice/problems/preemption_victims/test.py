"""Tests of problem 232: Who is preempted."""

from submission import make_room


def check(running, chunk, protected, free_pages, expected):
    got = list(make_room(list(running), chunk, set(protected), free_pages))
    assert got == expected, (
        f"make_room({running}, chunk={chunk}, protected={protected}, free_pages={free_pages})"
        f"\nexpected {expected}\ngot      {got}"
    )


def test_example_newest_first_until_the_step_fits():
    check([(0, 9, 1), (1, 1, 1), (2, 1, 1)], None, set(), 0, [2, 1])


def test_example_the_chunk_goes_first():
    check([(0, 5, 1), (1, 4, 1)], (7, 6), set(), 0, [7])


def test_example_a_protected_request_is_skipped():
    check([(0, 3, 1), (1, 3, 1)], None, {1}, 0, [0])


def test_a_step_that_fits_preempts_nobody():
    check([(0, 3, 1), (1, 3, 0), (2, 3, 1)], (5, 2), set(), 2, [])


def test_a_victim_leaves_the_step_so_its_own_page_is_no_longer_needed():
    check([(0, 4, 1), (1, 0, 1)], None, set(), 1, [1])


def test_a_protected_chunk_stays_and_the_newest_running_goes():
    check([(0, 2, 1), (1, 2, 1)], (9, 8), {9}, 1, [1])


def test_the_chunk_then_running_requests_when_the_chunk_is_not_enough():
    check([(0, 1, 1), (1, 1, 1), (2, 1, 1)], (9, 1), set(), 0, [9, 2])


def test_nobody_left_to_preempt_raises():
    running = [(0, 1, 1), (1, 1, 1)]
    try:
        got = make_room(running, None, {0, 1}, 0)
    except NotImplementedError:
        raise AssertionError("make_room is not written yet") from None
    except RuntimeError:
        return
    raise AssertionError(
        f"make_room({running}, protected={{0, 1}}): expected RuntimeError, got {got}"
    )
