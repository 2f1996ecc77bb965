"""Tests of problem 181 (ladder, graph_for), against the rule's properties: every size is 1,
2, 4, a multiple of 8 or the maximum; nothing above the maximum; no batch pads by 8 or more."""

from submission import graph_for, ladder


def test_example_max_20():
    assert ladder(20) == [1, 2, 4, 8, 16, 20]
    assert graph_for([1, 2, 4, 8, 16, 20], 5) == 8


def test_ladders_follow_the_rule():
    for max_bs in (1, 2, 3, 4, 7, 8, 9, 16, 17, 100, 256):
        sizes = ladder(max_bs)
        wanted = sorted(
            {n for n in range(1, max_bs + 1) if n in (1, 2, 4) or n % 8 == 0} | {max_bs}
        )
        assert sizes == wanted, f"ladder({max_bs}): expected {wanted}, got {sizes}"


def test_each_batch_gets_the_smallest_graph_that_holds_it():
    sizes = ladder(64)
    for n in range(1, 65):
        got = graph_for(sizes, n)
        assert got in sizes and got >= n, f"graph_for(ladder(64), {n}) = {got}"
        assert all(s < n for s in sizes if s < got), f"graph_for(ladder(64), {n}) = {got}"
        assert got - n < 8, f"graph_for(ladder(64), {n}) = {got}: {got - n} padding rows"


def test_a_batch_larger_than_every_graph_raises():
    try:
        got = graph_for(ladder(8), 9)
    except ValueError:
        return
    raise AssertionError(f"graph_for(ladder(8), 9): expected ValueError, got {got}")
