"""Tests of problem 101: Plan the prefill chunks."""

from submission import plan_prefill


def check(prompt_lens, max_extend_tokens, expected):
    got = plan_prefill(list(prompt_lens), max_extend_tokens)
    got = [[tuple(chunk) for chunk in step] for step in got]
    assert got == expected, (
        f"plan_prefill({prompt_lens}, max_extend_tokens={max_extend_tokens})"
        f"\nexpected {expected}\ngot      {got}"
    )


def test_example_one_long_prompt():
    check([300], 96, [[(0, 0, 96)], [(0, 96, 192)], [(0, 192, 288)], [(0, 288, 300)]])


def test_example_a_chunk_closes_the_batch():
    check([50, 100, 20], 96, [[(0, 0, 50), (1, 0, 46)], [(1, 46, 100), (2, 0, 20)]])


def test_everything_fits_in_one_step():
    check([10, 20, 30], 100, [[(0, 0, 10), (1, 0, 20), (2, 0, 30)]])


def test_a_prompt_of_exactly_the_budget():
    check([96, 5], 96, [[(0, 0, 96)], [(1, 0, 5)]])


def test_the_budget_ends_exactly_at_a_prompt_end():
    check([40, 56, 10], 96, [[(0, 0, 40), (1, 0, 56)], [(2, 0, 10)]])


def test_a_budget_of_one_token():
    check([3, 1], 1, [[(0, 0, 1)], [(0, 1, 2)], [(0, 2, 3)], [(1, 0, 1)]])


def test_the_chunked_request_comes_first_in_the_next_step():
    check([10, 30, 5, 5], 20, [[(0, 0, 10), (1, 0, 10)], [(1, 10, 30)], [(2, 0, 5), (3, 0, 5)]])


def test_several_long_prompts():
    check(
        [250, 130],
        100,
        [[(0, 0, 100)], [(0, 100, 200)], [(0, 200, 250), (1, 0, 50)], [(1, 50, 130)]],
    )


def test_no_prompts():
    check([], 8, [])
