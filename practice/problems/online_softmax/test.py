"""Tests of problem 221 (online_attention)."""

import math
import random

import pytest

from submission import online_attention


def direct(scores, values):
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return sum(w * v for w, v in zip(weights, values)) / total, top + math.log(total)


def check(scores, values, block):
    got = online_attention(scores, values, block)
    want = direct(scores, values)
    assert len(got) == 2, f"expected (output, lse), got {got}"
    assert math.isclose(got[0], want[0], rel_tol=1e-9, abs_tol=1e-9) and math.isclose(
        got[1], want[1], rel_tol=1e-9, abs_tol=1e-9
    ), f"online_attention({scores}, {values}, block={block}): expected {want}, got {got}"


def test_example_two_equal_scores():
    check([0.0, 0.0], [1.0, 3.0], 1)


def test_example_large_scores_do_not_overflow():
    check([1000.0, 1000.0, 0.0], [2.0, 4.0, 9.0], 2)


def test_one_key():
    check([3.5], [7.0], 4)


def test_a_later_block_with_a_larger_maximum_rescales_the_earlier_ones():
    check([0.0, 1.0, 2.0, 50.0, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0], 2)
    check([-5.0, -5.0, 10.0, 20.0], [1.0, -1.0, 2.0, 0.5], 1)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64])
def test_any_block_size_gives_the_same_answer(block):
    rng = random.Random(block)
    scores = [rng.uniform(-30, 30) for _ in range(23)]
    values = [rng.uniform(-1, 1) for _ in range(23)]
    check(scores, values, block)


def test_very_negative_scores_do_not_underflow_to_nothing():
    check([-1000.0, -1001.0], [1.0, 2.0], 1)
