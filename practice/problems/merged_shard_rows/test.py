"""Tests of problem 24 (qkv_output_sizes, shard_rows)."""

import pytest

from submission import qkv_output_sizes, shard_rows


def check_sizes(args, expected):
    got = qkv_output_sizes(*args)
    assert list(got) == expected, f"qkv_output_sizes{args}: expected {expected}, got {got}"


def check_rows(sizes, shard, expected):
    got = shard_rows(sizes, shard)
    assert tuple(got) == expected, f"shard_rows({sizes}, {shard}): expected {expected}, got {got}"


def test_example_smollm2_sizes():
    check_sizes((9, 3, 64), [576, 192, 192])


def test_example_v_rows():
    check_rows([576, 192, 192], 2, (768, 960))


def test_head_dim_is_not_hidden_over_heads():
    check_sizes((16, 8, 128), [2048, 1024, 1024])  # Qwen3-0.6B: hidden size 1024


def test_multi_head_attention():
    check_sizes((4, 4, 16), [64, 64, 64])


def test_every_shard_of_qkv():
    sizes = [576, 192, 192]
    check_rows(sizes, 0, (0, 576))
    check_rows(sizes, 1, (576, 768))


def test_gate_up_and_a_single_shard():
    check_rows([1536, 1536], 1, (1536, 3072))
    check_rows([576], 0, (0, 576))


def test_shards_tile_the_matrix():
    sizes = [7, 3, 3, 11]
    rows = [tuple(shard_rows(sizes, s)) for s in range(4)]
    assert rows == [(0, 7), (7, 10), (10, 13), (13, 24)], f"shard_rows({sizes}, 0..3): got {rows}"


@pytest.mark.parametrize("shard", [3, 4, -1])
def test_missing_shards_raise(shard):
    sizes = [576, 192, 192]
    try:
        got = shard_rows(sizes, shard)
    except ValueError:
        return
    except Exception as error:  # noqa: BLE001
        raise AssertionError(
            f"shard_rows({sizes}, {shard}): expected ValueError, got "
            f"{type(error).__name__}: {error}"
        ) from None
    raise AssertionError(f"shard_rows({sizes}, {shard}): expected ValueError, got {got}")
