"""Tests of problem 51 (attention_mask)."""

import pytest

from submission import attention_mask

T, F = True, False


def show(mask):
    return "\n".join(
        f"  request {b}: " + " | ".join("".join("1" if x else "." for x in row) for row in rows)
        for b, rows in enumerate(mask)
    )


def check(ledgers, expected):
    got = attention_mask(list(ledgers))
    assert got == expected, (
        f"attention_mask({ledgers}) (1 = may attend, rows separated by |):\n"
        f"expected\n{show(expected)}\ngot\n{show(got)}"
    )


def test_example_prefill_and_cached_prefix():
    check([(0, 2), (3, 4)], [[[T, F, F, F], [T, T, F, F]], [[T, T, T, T], [T, T, T, T]]])


def test_example_single_prefill_is_lower_triangular():
    check([(0, 3)], [[[T, F, F], [T, T, F], [T, T, T]]])


def test_cached_prefix_shifts_the_diagonal():
    check([(2, 5)], [[[T, T, T, F, F], [T, T, T, T, F], [T, T, T, T, T]]])


def test_decode_batch_has_one_row_each():
    check([(4, 5), (1, 2)], [[[T, T, T, T, T]], [[T, T, F, F, F]]])


def test_padding_rows_follow_the_same_rule():
    got = attention_mask([(0, 1), (0, 4)])
    expected_first = [[T, F, F, F], [T, T, F, F], [T, T, T, F], [T, T, T, T]]
    assert got[0] == expected_first, (
        f"attention_mask([(0, 1), (0, 4)]): request 0 has 1 real row and 3 padding rows; every "
        f"row follows j <= cached_len + i:\nexpected {expected_first}\ngot      {got[0]}"
    )


def test_no_row_is_fully_masked():
    mask = attention_mask([(7, 8), (0, 3), (2, 9)])
    empty = [(b, i) for b, rows in enumerate(mask) for i, row in enumerate(rows) if not any(row)]
    assert not empty, f"rows (request, row) {empty} attend to nothing: softmax would give NaN"
    shape = (len(mask), len(mask[0]), len(mask[0][0]))
    assert shape == (3, 7, 9), (
        f"shape [batch][max_extend][max_seq]: expected (3, 7, 9), got {shape}"
    )


@pytest.mark.parametrize("ledgers", [[], [(3, 3)], [(0, 2), (5, 4)], [(-1, 2)]])
def test_invalid_batches_raise(ledgers):
    try:
        got = attention_mask(ledgers)
    except ValueError:
        return
    except Exception as error:  # noqa: BLE001
        raise AssertionError(
            f"attention_mask({ledgers}): expected ValueError, got {type(error).__name__}: {error}"
        ) from None
    raise AssertionError(f"attention_mask({ledgers}): expected ValueError, got {got}")
