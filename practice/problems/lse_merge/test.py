"""Tests of problem 222 (merge_partials)."""

import math
import random

import pytest

from submission import merge_partials


def chunk(scores, values):
    """(output, lse) of one chunk, as a decode kernel's program writes it."""
    if not scores:
        return 0.0, -math.inf
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    return sum(w * v for w, v in zip(weights, values)) / sum(weights), top + math.log(sum(weights))


def check(partials, expected):
    got = merge_partials(partials)
    assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-9), (
        f"merge_partials({partials}): expected {expected}, got {got}"
    )


def test_example_equal_mass():
    check([(1.0, 0.0), (3.0, 0.0)], 2.0)


def test_example_empty_chunk():
    check([(5.0, 2.0), (0.0, -math.inf)], 5.0)


@pytest.mark.parametrize("cuts", [[9], [4, 9], [3, 3, 9, 9], [1, 2, 3, 4, 5, 9]])
def test_partials_of_any_split_merge_to_one_softmax(cuts):
    rng = random.Random(len(cuts))
    scores = [rng.uniform(-8, 8) for _ in range(9)]
    values = [rng.uniform(-2, 2) for _ in range(9)]
    bounds = list(zip([0] + cuts[:-1], cuts))
    partials = [chunk(scores[a:b], values[a:b]) for a, b in bounds]
    check(partials, chunk(scores, values)[0])


def test_a_small_chunk_weighs_little_not_as_much_as_a_big_one():
    big = chunk([0.0] * 64, [1.0] * 64)
    small = chunk([0.0] * 8, [9.0] * 8)
    check([big, small], (64 * 1.0 + 8 * 9.0) / 72)


def test_large_lses_do_not_overflow():
    check([(1.0, 1000.0), (2.0, 1000.0 + math.log(3))], (1.0 + 3 * 2.0) / 4)


def test_a_row_without_keys_gives_zero():
    check([(0.0, -math.inf), (0.0, -math.inf)], 0.0)
