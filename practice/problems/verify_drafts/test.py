"""Tests of problem 242: What a verify step emits."""

from submission import verify


def check(drafts, choices, eos, remaining, expected):
    got = verify(list(drafts), list(choices), set(eos), remaining)
    got = (list(got[0]), got[1], got[2])
    assert got == expected, (
        f"verify({drafts}, {choices}, eos={eos}, remaining={remaining})"
        f"\nexpected {expected}\ngot      {got}"
    )


def test_example_a_prefix_is_accepted():
    check([5, 6, 7], [5, 6, 9, 4], set(), 10, ([5, 6, 9], 2, None))


def test_example_all_accepted_and_a_bonus_token():
    check([5, 6, 7], [5, 6, 7, 8], set(), 10, ([5, 6, 7, 8], 3, None))


def test_example_eos_as_a_rejected_draft_does_not_stop():
    check([5, 6, 7], [5, 2, 7, 8], {6}, 10, ([5, 2], 1, None))


def test_example_eos_inside_the_accepted_run():
    check([5, 6, 7], [5, 6, 7, 8], {6}, 10, ([5, 6], 3, "stop"))


def test_example_length_inside_the_run():
    check([5, 6, 7], [5, 6, 7, 8], set(), 2, ([5, 6], 3, "length"))


def test_nothing_accepted_emits_the_models_token():
    check([5, 6, 7], [4, 6, 7, 8], set(), 10, ([4], 0, None))


def test_a_later_agreement_after_a_miss_does_not_count():
    check([5, 6, 7], [5, 1, 7, 8], set(), 10, ([5, 1], 1, None))


def test_eos_is_checked_before_length():
    check([5, 6], [5, 6, 3], {6}, 2, ([5, 6], 2, "stop"))


def test_the_bonus_token_can_end_the_request():
    check([5], [5, 9], {9}, 10, ([5, 9], 1, "stop"))
    check([5], [5, 9], set(), 2, ([5, 9], 1, "length"))


def test_no_drafts_is_a_plain_decode_step():
    check([], [3], set(), 5, ([3], 0, None))
