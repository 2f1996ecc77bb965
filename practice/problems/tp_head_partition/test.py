"""Tests of problem 161 (partition_heads)."""

import pytest

from submission import partition_heads


def check(args, expected):
    got = partition_heads(*args)
    assert list(got) == expected, f"partition_heads{args}: expected {expected}, got {got}"


def test_example_smollm2():
    check((9, 3, 2), [(range(0, 6), range(0, 2)), (range(6, 9), range(2, 3))])


def test_example_one_kv_head():
    check((4, 1, 2), [(range(0, 2), range(0, 1)), (range(2, 4), range(0, 1))])


def test_divisible_heads_split_evenly():
    check((32, 8, 2), [(range(0, 16), range(0, 4)), (range(16, 32), range(4, 8))])
    check((4, 2, 2), [(range(0, 2), range(0, 1)), (range(2, 4), range(1, 2))])


def test_longer_blocks_come_first():
    got = partition_heads(10, 5, 3)
    kv = [list(k) for _, k in got]
    assert kv == [[0, 1], [2, 3], [4]], f"partition_heads(10, 5, 3): KV heads {kv}"


def test_replicated_kv_heads_split_their_query_heads():
    check(
        (6, 3, 4),
        [
            (range(0, 1), range(0, 1)),
            (range(1, 2), range(0, 1)),
            (range(2, 4), range(1, 2)),
            (range(4, 6), range(2, 3)),
        ],
    )


@pytest.mark.parametrize("heads, kv_heads, size", [(9, 3, 2), (12, 4, 3), (8, 2, 8), (6, 3, 4)])
def test_every_query_head_once_and_with_its_kv_head(heads, kv_heads, size):
    got = partition_heads(heads, kv_heads, size)
    owners = [h for q, _ in got for h in q]
    assert owners == list(range(heads)), f"partition_heads{(heads, kv_heads, size)}: {got}"
    group = heads // kv_heads
    for q, kv in got:
        assert all(h // group in kv for h in q), f"a query head misses its KV head in {(q, kv)}"


def test_more_ranks_than_query_heads_raise():
    try:
        got = partition_heads(2, 1, 4)
    except ValueError:
        return
    raise AssertionError(f"partition_heads(2, 1, 4): expected ValueError, got {got}")
