"""Tests of problem 81: Which pages does a forward need?"""

from submission import pages_per_forward, pages_to_allocate


def check_range(cached_len, device_len, page_size, expected):
    got = tuple(pages_to_allocate(cached_len, device_len, page_size))
    assert got == expected, (
        f"pages_to_allocate(cached_len={cached_len}, device_len="
        f"{device_len}, page_size={page_size}): expected {expected}, "
        f"got {got}"
    )


def check_forwards(prompt_len, max_tokens, page_size, expected):
    got = list(pages_per_forward(prompt_len, max_tokens, page_size))
    assert got == expected, (
        f"pages_per_forward(prompt_len={prompt_len}, max_tokens="
        f"{max_tokens}, page_size={page_size}): expected {expected}, "
        f"got {got}"
    )


def test_example_a_forward_across_a_page_boundary():
    check_range(6, 9, 4, (2, 3))


def test_example_decode_takes_a_page_every_page_size_steps():
    check_forwards(6, 8, 4, [2, 0, 0, 1, 0, 0, 0, 1])


def test_prefill_from_nothing():
    check_range(0, 9, 4, (0, 3))
    check_range(0, 8, 4, (0, 2))
    check_range(0, 1, 16, (0, 1))


def test_inside_an_owned_page_nothing_is_new():
    check_range(5, 7, 4, (2, 2))
    check_range(6, 8, 4, (2, 2))


def test_page_aligned_cached_len():
    check_range(8, 9, 4, (2, 3))
    check_range(8, 16, 4, (2, 4))


def test_page_size_1_allocates_exactly_the_new_positions():
    check_range(3, 10, 1, (3, 10))
    check_forwards(3, 4, 1, [3, 1, 1, 1])


def test_a_prompt_of_exactly_one_page():
    check_forwards(4, 6, 4, [1, 1, 0, 0, 0, 1])


def test_one_token_only():
    check_forwards(10, 1, 16, [1])


def test_total_pages_is_the_last_token_position_rounded_up():
    for prompt_len, max_tokens, page_size in [(7, 20, 4), (1, 33, 8), (16, 16, 16), (5, 3, 2)]:
        got = sum(pages_per_forward(prompt_len, max_tokens, page_size))
        # the last forward writes position prompt_len + max_tokens - 2
        expected = -(-(prompt_len + max_tokens - 1) // page_size)
        assert got == expected, (
            f"pages_per_forward({prompt_len}, {max_tokens}, {page_size}) "
            f"sums to {got} pages; the request writes positions "
            f"0..{prompt_len + max_tokens - 2}, which need {expected}"
        )
