"""Tests of problem 162 (rank_rows)."""

from submission import rank_rows


def check(args, expected):
    got = rank_rows(*args)
    assert list(got) == expected, f"rank_rows{args}: expected {expected}, got {got}"


def test_example_rank1_of_2():
    check((4, 2, 2, range(2, 4), range(1, 2)), [4, 5, 6, 7, 10, 11, 14, 15])


def test_rank0_of_2():
    check((4, 2, 2, range(0, 2), range(0, 1)), [0, 1, 2, 3, 8, 9, 12, 13])


def test_smollm2_rank1_keeps_its_three_heads_and_one_kv_head():
    got = list(rank_rows(9, 3, 64, range(6, 9), range(2, 3)))
    expected = list(range(384, 576)) + list(range(704, 768)) + list(range(896, 960))
    assert got == expected, f"rank_rows(9, 3, 64, range(6, 9), range(2, 3)): got {got[:5]}..."


def test_all_ranks_together_keep_every_row_once():
    shards = [(range(0, 6), range(0, 2)), (range(6, 9), range(2, 3))]
    rows = sorted(r for q, kv in shards for r in rank_rows(9, 3, 4, q, kv))
    assert rows == list(range(9 * 4 + 2 * 3 * 4)), "the two ranks' rows do not tile the matrix"


def test_a_replicated_kv_head_is_kept_by_both_ranks():
    a = rank_rows(4, 1, 2, range(0, 2), range(0, 1))
    b = rank_rows(4, 1, 2, range(2, 4), range(0, 1))
    assert a[-4:] == b[-4:] == [8, 9, 10, 11], f"k and v rows: {a[-4:]} and {b[-4:]}"
