"""Tests of problem 93: What does the radix cache save?"""

from submission import computed_prompt_tokens

S = list(range(100, 110))


def check(batches, page_size, expected):
    got = computed_prompt_tokens([[list(p) for p in b] for b in batches], page_size)
    got = [list(b) for b in got]
    assert got == expected, (
        f"computed_prompt_tokens({batches}, page_size={page_size}): expected {expected}, got {got}"
    )


def test_example_a_shared_system_prompt():
    check([[S + [1, 2, 3]], [S + [4, 5], S + [6], S + [7, 8, 9]]], 1, [[13], [2, 1, 3]])


def test_example_prompts_of_one_batch_do_not_share():
    check([[S + [1], S + [2]]], 1, [[11, 11]])


def test_nothing_in_common():
    check([[[1, 2, 3]], [[4, 5, 6]]], 1, [[3], [3]])


def test_the_same_prompt_again_recomputes_only_its_last_token():
    check([[[1, 2, 3, 4, 5]], [[1, 2, 3, 4, 5]]], 1, [[5], [1]])


def test_a_one_token_prompt_is_always_computed():
    check([[[7]], [[7]]], 1, [[1], [1]])


def test_a_shorter_prompt_that_is_a_prefix_of_a_cached_one():
    check([[[1, 2, 3, 4, 5, 6, 7, 8]], [[1, 2, 3, 4, 5]]], 1, [[8], [1]])


def test_partial_pages_are_neither_cached_nor_matched():
    # page 4: [1..6] caches only [1..4]; the second prompt matches 4 of its 6 - 1 tokens
    check([[[1, 2, 3, 4, 5, 6]], [[1, 2, 3, 4, 5, 6]]], 4, [[6], [2]])


def test_the_match_rounds_down_to_a_page():
    check([[S + [1, 2]], [S + [3, 4]]], 4, [[12], [4]])


def test_the_last_token_can_cost_a_whole_page():
    # [1..4] is cached; the same prompt can only match [1..3] -> 0 whole pages
    check([[[1, 2, 3, 4]], [[1, 2, 3, 4]]], 4, [[4], [4]])


def test_the_best_of_several_cached_prompts():
    check([[[1, 2, 3, 9], [1, 2, 8, 8, 8]], [[1, 2, 8, 8, 7, 7]]], 1, [[4, 5], [2]])


def test_a_later_batch_shares_with_every_earlier_batch():
    check([[[1, 2, 3]], [[4, 5, 6]], [[1, 2, 3, 4], [4, 5, 6, 7]]], 1, [[3], [3], [1, 1]])
