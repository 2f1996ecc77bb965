"""Tests of problem 211: a seeded benchmark workload."""

import random

from submission import make_workload


def drawn_in_order(n, input_lens, output_lens, token_ids, seed):
    """The documented draw order, one draw at a time."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = rng.randint(*input_lens)
        prompts.append([rng.randint(*token_ids) for _ in range(length)])
    return prompts, [rng.randint(*output_lens) for _ in range(n)]


def test_example():
    got = make_workload(3, (1, 2), (4, 8), (0, 9), seed=0)
    assert got == ([[6, 0], [8, 7], [4, 7]], [6, 8, 5]), f"got {got}"


def test_draws_in_the_documented_order():
    for seed in range(5):
        args = (20, (3, 30), (1, 50), (0, 10000), seed)
        got = make_workload(*args)
        assert got == drawn_in_order(*args), f"seed {seed}: the draws are not in the order given"


def test_same_seed_same_workload_whatever_the_global_generator_does():
    first = make_workload(10, (1, 9), (1, 9), (0, 99), seed=7)
    random.seed(12345)
    random.random()
    assert make_workload(10, (1, 9), (1, 9), (0, 99), seed=7) == first
    assert make_workload(10, (1, 9), (1, 9), (0, 99), seed=8) != first


def test_bounds_are_inclusive_at_both_ends():
    prompts, outs = make_workload(400, (1, 3), (5, 7), (10, 12), seed=1)
    assert {len(p) for p in prompts} == {1, 2, 3}, "prompt lengths"
    assert set(outs) == {5, 6, 7}, "output lengths"
    assert {i for p in prompts for i in p} == {10, 11, 12}, "token ids"
