"""Tests of problem 231: Plan a mixed step."""

from submission import plan_mixed_step


def check(running, waiting, budget, expected):
    got = [tuple(item) for item in plan_mixed_step(list(running), list(waiting), budget)]
    assert got == expected, (
        f"plan_mixed_step({running}, {waiting}, budget={budget})"
        f"\nexpected {expected}\ngot      {got}"
    )


def test_example_two_decodes_and_a_chunk():
    check([0, 1], [(2, 300)], 96, [(0, 1), (1, 1), (2, 94)])


def test_example_prompts_first_come_first_served_until_a_chunk():
    check([4], [(5, 10), (6, 50), (7, 9)], 40, [(4, 1), (5, 10), (6, 29)])


def test_nothing_running_is_a_plain_prefill():
    check([], [(0, 30), (1, 30)], 50, [(0, 30), (1, 20)])


def test_nothing_waiting_is_a_plain_decode_in_admission_order():
    check([3, 1, 2], [], 8, [(3, 1), (1, 1), (2, 1)])


def test_no_budget_left_after_the_decode_tokens_admits_no_prompt():
    check([0, 1, 2, 3], [(4, 5)], 4, [(0, 1), (1, 1), (2, 1), (3, 1)])


def test_a_prompt_that_ends_exactly_at_the_budget_does_not_close_the_step_early():
    check([0], [(1, 7), (2, 2)], 10, [(0, 1), (1, 7), (2, 2)])


def test_the_budget_is_spent_exactly_then_the_walk_stops():
    check([0], [(1, 9), (2, 5)], 10, [(0, 1), (1, 9)])


def test_one_token_left_gives_a_one_token_chunk():
    check([0, 1], [(2, 40), (3, 1)], 3, [(0, 1), (1, 1), (2, 1)])
