"""Tests of problem 4 (kv_head_for_query_heads)."""

import pytest

from submission import kv_head_for_query_heads


def check(num_heads, num_kv_heads, expected):
    got = kv_head_for_query_heads(num_heads, num_kv_heads)
    assert list(got) == expected, (
        f"kv_head_for_query_heads({num_heads}, {num_kv_heads}): expected {expected}, got {got}"
    )


def test_example_smollm2():
    check(9, 3, [0, 0, 0, 1, 1, 1, 2, 2, 2])


def test_example_multi_head():
    check(4, 4, [0, 1, 2, 3])


def test_multi_query_attention_has_one_kv_head():
    check(8, 1, [0] * 8)


def test_groups_are_consecutive_not_tiled():
    check(4, 2, [0, 0, 1, 1])
    check(16, 8, [j // 2 for j in range(16)])


def test_qwen3_shape():
    check(16, 8, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7])


@pytest.mark.parametrize("num_heads, num_kv_heads", [(6, 4), (9, 2), (4, 8), (4, 0), (4, -2)])
def test_heads_that_do_not_group_raise(num_heads, num_kv_heads):
    try:
        got = kv_head_for_query_heads(num_heads, num_kv_heads)
    except ValueError:
        return
    except Exception as error:  # noqa: BLE001 - the message names what was raised instead
        raise AssertionError(
            f"kv_head_for_query_heads({num_heads}, {num_kv_heads}): expected "
            f"ValueError, got {type(error).__name__}: {error}"
        ) from None
    raise AssertionError(
        f"kv_head_for_query_heads({num_heads}, {num_kv_heads}): expected ValueError, got {got}"
    )
