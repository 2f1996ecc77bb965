"""Tests of problem 163 (rank_lookup, vocab_parallel_lookup)."""

from submission import rank_lookup, vocab_parallel_lookup

SHARDS = [[[1.0, 0.0], [2.0, 0.0]], [[3.0, 3.0]]]


def table(vocab, width):
    return [[float(10 * i + j) for j in range(width)] for i in range(vocab)]


def shards_of(rows, block):
    return [rows[s : s + block] for s in range(0, len(rows), block)]


def test_example_rank_lookup():
    got = rank_lookup([0, 2], SHARDS[1], 2)
    assert got == [[0.0, 0.0], [3.0, 3.0]], f"rank_lookup([0, 2], {SHARDS[1]}, 2): got {got}"


def test_example_whole_lookup():
    got = vocab_parallel_lookup([2, 0, 1], SHARDS, 2)
    expected = [[3.0, 3.0], [1.0, 0.0], [2.0, 0.0]]
    assert got == expected, f"vocab_parallel_lookup([2, 0, 1], ...): expected {expected}, got {got}"


def test_a_rank_never_reads_a_row_it_does_not_hold():
    got = rank_lookup([1, 2, 3], [[5.0], [6.0]], 0)  # holds ids 0 and 1 only
    assert got == [[6.0], [0.0], [0.0]], f"ids 2 and 3 belong to other ranks: got {got}"


def test_equals_the_whole_table_for_several_rank_counts():
    rows = table(11, 3)
    ids = [10, 0, 5, 4, 7, 1, 10]
    for size in (1, 2, 3, 4):
        block = -(-11 // size)
        got = vocab_parallel_lookup(ids, shards_of(rows, block), block)
        assert got == [rows[i] for i in ids], f"{size} ranks, block {block}: got {got}"


def test_each_rank_contributes_only_its_own_ids():
    rows = table(6, 2)
    pieces = [rank_lookup([0, 3, 5], shard, r * 3) for r, shard in enumerate(shards_of(rows, 3))]
    nonzero = [[any(row) for row in piece] for piece in pieces]
    assert nonzero == [[True, False, False], [False, True, True]], f"got {pieces}"
