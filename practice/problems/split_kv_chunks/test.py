"""Tests of problem 223 (chunk_bounds, busiest_program)."""

import pytest

from submission import busiest_program, chunk_bounds


def check_bounds(seq_len, num_splits, block_n, expected):
    got = chunk_bounds(seq_len, num_splits, block_n)
    assert [tuple(b) for b in got] == expected, (
        f"chunk_bounds({seq_len}, {num_splits}, {block_n}): expected {expected}, got {got}"
    )


def test_example_200_keys_in_4():
    check_bounds(200, 4, 64, [(0, 64), (64, 128), (128, 192), (192, 200)])


def test_example_more_chunks_than_keys():
    check_bounds(5, 3, 64, [(0, 5), (5, 5), (5, 5)])


def test_example_busiest():
    assert busiest_program([200, 37], 4, 64) == 64


def test_one_split_is_the_whole_context():
    check_bounds(2048, 1, 64, [(0, 2048)])


def test_chunks_are_whole_blocks_even_when_the_share_is_not():
    check_bounds(130, 2, 32, [(0, 96), (96, 130)])  # ceil(130 / 2) = 65 -> 96


@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 512, 2047])
@pytest.mark.parametrize("num_splits", [1, 3, 8, 32])
def test_chunks_cover_every_key_once_in_order(seq_len, num_splits):
    bounds = chunk_bounds(seq_len, num_splits, 64)
    assert len(bounds) == num_splits
    assert bounds[0][0] == 0 and bounds[-1][1] == seq_len
    for (a, b), (c, _) in zip(bounds, bounds[1:]):
        assert a <= b == c, f"chunks must meet: {bounds}"
    assert all((a % 64 == 0 or a == seq_len) for a, _ in bounds), f"starts on blocks: {bounds}"


def test_splitting_shortens_the_busiest_program():
    assert busiest_program([2048], 1, 64) == 2048
    assert busiest_program([2048], 8, 64) == 256
    assert busiest_program([2048, 10, 300], 32, 64) == 64
