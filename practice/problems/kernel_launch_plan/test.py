"""Tests of problem 191: A kernel's grid and its masks."""

import pytest
from submission import launch_plan


def lanes_by_enumeration(extend_lens, block, blocks):
    """Count, token by token, which program each token of each request falls into."""
    active = [[0] * blocks for _ in extend_lens]
    for r, n in enumerate(extend_lens):
        for token in range(n):
            active[r][token // block] += 1
    return active


def check(extend_lens, block, grid):
    got_grid, got_active = launch_plan(list(extend_lens), block)
    assert tuple(got_grid) == grid, (
        f"launch_plan({extend_lens}, {block}): grid {got_grid} != {grid}"
    )
    expected = lanes_by_enumeration(extend_lens, block, grid[1])
    assert [list(a) for a in got_active] == expected, (
        f"launch_plan({extend_lens}, {block}): active lanes\n"
        f"expected {expected}\ngot      {got_active}"
    )


def test_example():
    check([131, 5, 1], 128, (3, 2))


def test_a_decode_batch_is_one_column_of_one_lane_each():
    check([1] * 6, 64, (6, 1))


def test_block_edges():
    check([127, 128, 129], 128, (3, 2))
    check([256], 128, (1, 2))


def test_block_of_one():
    check([3, 1], 1, (2, 3))


@pytest.mark.parametrize("block", [0, 3, 96, -4])
def test_block_must_be_a_power_of_two(block):
    with pytest.raises(ValueError):
        launch_plan([5], block)
