"""Tests of problem 61: Top-k and top-p filtering."""

from submission import filter_top_k_top_p


def check(probs, top_k, top_p, expected):
    got = filter_top_k_top_p(list(probs), top_k, top_p)
    assert got == expected, (
        f"filter_top_k_top_p({probs}, top_k={top_k}, top_p={top_p}): expected {expected}, got {got}"
    )


def test_example_top_p():
    check([0.125, 0.5, 0.25, 0.125], -1, 0.7, [1, 2])


def test_example_top_k_then_top_p():
    check([0.5, 0.25, 0.125, 0.125], 2, 0.6, [0])


def test_top_k_alone():
    check([0.125, 0.5, 0.25, 0.125], 3, 1.0, [1, 2, 0])


def test_no_limits_keeps_every_token_with_mass_in_rank_order():
    check([0.25, 0.0625, 0.5, 0.1875], -1, 1.0, [2, 0, 3, 1])


def test_top_k_1_is_greedy():
    check([0.25, 0.0625, 0.5, 0.1875], 1, 1.0, [2])


def test_tiny_top_p_keeps_the_top_token():
    check([0.25, 0.0625, 0.5, 0.1875], -1, 1e-9, [2])


def test_mass_before_equal_to_top_p_is_dropped():
    # before id 2 the mass is exactly 0.5: not < 0.5
    check([0.5, 0.125, 0.25, 0.125], -1, 0.5, [0])


def test_the_token_that_crosses_top_p_is_kept():
    # 0.5 < 0.6, so id 2 stays although 0.5 + 0.25 > 0.6
    check([0.5, 0.125, 0.25, 0.125], -1, 0.6, [0, 2])


def test_both_limits_apply_the_tighter_wins():
    probs = [0.0625, 0.25, 0.0625, 0.375, 0.25]
    check(probs, 2, 1.0, [3, 1])
    check(probs, 4, 0.5, [3, 1])  # top-p is tighter
    check(probs, 2, 0.9, [3, 1])  # top-k is tighter


def test_top_p_reads_the_renormalized_top_k_mass():
    probs = [0.0625, 0.375, 0.0625, 0.25, 0.25]
    # top-3 (ids 1, 3, 4) renormalized: 0.43, 0.29, 0.29; the mass before id 3 is 0.43
    check(probs, 3, 0.4, [1])
    # top-2 (ids 1, 3) renormalized: 0.6, 0.4; the mass before id 3 is 0.6
    check(probs, 2, 0.55, [1])
    check(probs, 2, 0.62, [1, 3])


def test_renormalization_can_only_shrink_the_top_p_set():
    check([0.25, 0.125, 0.5, 0.125], 2, 0.6, [2])  # 2/3 before id 0: dropped
    check([0.25, 0.125, 0.5, 0.125], 2, 0.7, [2, 0])
    check([0.25, 0.125, 0.5, 0.125], -1, 0.6, [2, 0])  # no top-k: 0.5 before id 0


def test_ties_rank_the_smaller_id_first():
    check([0.25, 0.25, 0.25, 0.25], 2, 1.0, [0, 1])
    check([0.1, 0.3, 0.3, 0.3], -1, 0.5, [1, 2])


def test_top_k_larger_than_the_vocabulary_keeps_everything():
    check([0.5, 0.5], 10, 1.0, [0, 1])


def test_zero_probability_tokens_after_all_the_mass_are_dropped():
    check([0.0, 0.5, 0.5, 0.0], -1, 1.0, [1, 2])


def test_a_single_token_vocabulary():
    check([1.0], -1, 0.3, [0])
    check([1.0], 5, 1.0, [0])


def test_input_list_is_not_reordered():
    probs = [0.125, 0.5, 0.25, 0.125]
    filter_top_k_top_p(probs, -1, 1.0)
    assert probs == [0.125, 0.5, 0.25, 0.125], f"the input list was changed to {probs}"
