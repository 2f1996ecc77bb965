"""Tests of problem 241: Drafts from the prompt."""

import random

from submission import propose_drafts


def check(tokens, k, max_n, min_n, expected):
    got = list(propose_drafts(list(tokens), k, max_n, min_n))
    assert got == expected, (
        f"propose_drafts({tokens}, k={k}, max_n={max_n}, min_n={min_n})"
        f"\nexpected {expected}\ngot      {got}"
    )


def test_example_the_tokens_after_the_match():
    check([1, 2, 3, 4, 5, 1, 2, 3], 4, 3, 1, [4, 5, 1, 2])


def test_example_the_most_recent_match():
    check([4, 5, 1, 4, 5, 2, 9, 4, 5], 3, 2, 2, [2, 9, 4])


def test_example_padded_near_the_end():
    check([6, 1, 2, 6, 1], 5, 2, 1, [2, 6, 1, 1, 1])


def test_example_nothing_matches():
    check([5, 6, 7], 3, 3, 1, [7, 7, 7])


def test_the_longest_n_wins_over_a_more_recent_shorter_match():
    check([1, 2, 3, 7, 8, 9, 3, 5, 6, 1, 2, 3], 4, 3, 1, [7, 8, 9, 3])


def test_min_n_is_respected():
    check([1, 2, 3, 4, 9, 4], 3, 3, 2, [4, 4, 4])
    check([1, 2, 3, 4, 9, 4], 3, 3, 1, [9, 4, 4])


def test_an_occurrence_may_overlap_the_suffix():
    check([3, 3, 3], 4, 2, 1, [3, 3, 3, 3])
    check([7, 7, 8, 7, 7], 2, 2, 2, [8, 7])


def test_one_token_and_k_zero():
    check([8], 2, 3, 1, [8, 8])
    check([8, 9, 8], 0, 3, 1, [])


def reference(tokens, k, max_n, min_n):
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tokens[-n:]:
                follow = tokens[start + n : start + n + k]
                return follow + [tokens[-1]] * (k - len(follow))
    return [tokens[-1]] * k


def test_random_sequences_against_the_rule():
    rng = random.Random(0)
    for _ in range(300):
        tokens = [rng.randrange(3) for _ in range(rng.randint(1, 16))]
        k, min_n = rng.randint(1, 5), rng.randint(1, 3)
        max_n = rng.randint(min_n, 4)
        check(tokens, k, max_n, min_n, reference(tokens, k, max_n, min_n))
