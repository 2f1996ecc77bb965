"""Tests of problem 164 (row_parallel)."""

from submission import row_parallel


def matvec(x, weight, bias):
    return [sum(a * w for a, w in zip(x, row)) + b for row, b in zip(weight, bias)]


def test_example_two_ranks():
    got = row_parallel([1.0, 2.0, 3.0], [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]], [10.0, 0.0], 2)
    assert got == [[16.0, 2.0], [16.0, 2.0]], f"expected [[16.0, 2.0], [16.0, 2.0]], got {got}"


def test_the_bias_is_added_once():
    got = row_parallel([0.0, 0.0, 0.0, 0.0], [[1.0] * 4], [5.0], 4)
    assert got == [[5.0]] * 4, f"a zero input must give the bias once on every rank: got {got}"


def test_every_rank_ends_with_the_whole_output():
    x = [float(i) for i in range(7)]
    weight = [[float((i * 7 + j) % 5) for j in range(7)] for i in range(3)]
    bias = [1.0, -2.0, 0.5]
    for size in (1, 2, 3, 7):
        got = row_parallel(x, weight, bias, size)
        assert len(got) == size, f"{size} ranks: got {len(got)} results"
        assert all(out == matvec(x, weight, bias) for out in got), f"{size} ranks: got {got}"
