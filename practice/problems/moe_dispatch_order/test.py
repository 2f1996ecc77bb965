"""Tests of problem 202: Sorting tokens by expert."""

import random

from submission import dispatch


def reference(expert_ids, num_experts):
    """Expert by expert, scan the tokens and slots in order: the obvious, slow way."""
    top_k = len(expert_ids[0])
    order, counts = [], []
    for e in range(num_experts):
        mine = [
            t * top_k + s for t, row in enumerate(expert_ids) for s, x in enumerate(row) if x == e
        ]
        order += mine
        counts.append(len(mine))
    return order, counts, [p // top_k for p in order]


def check(expert_ids, num_experts):
    got = tuple(dispatch(expert_ids, num_experts))
    want = reference(expert_ids, num_experts)
    for name, g, w in zip(("order", "tokens_per_expert", "token_of_row"), got, want):
        assert list(g) == w, (
            f"dispatch({expert_ids}, {num_experts}): {name} expected {w}, got {list(g)}"
        )


def test_example():
    assert dispatch([[1, 3], [0, 1], [3, 0]], 4) == (
        [2, 5, 0, 3, 1, 4],
        [2, 2, 0, 2],
        [1, 2, 0, 1, 0, 2],
    )


def test_unused_experts_are_counted_as_zero_even_the_last_ones():
    check([[0, 1], [1, 0]], 8)


def test_one_token_decoding_with_eight_experts():
    check([[5, 2, 7, 0, 3, 1, 6, 4]], 16)


def test_random_routings_of_many_tokens():
    rng = random.Random(1)
    for top_k in (1, 2, 4):
        experts = 8
        ids = [rng.sample(range(experts), top_k) for _ in range(25)]
        check(ids, experts)
