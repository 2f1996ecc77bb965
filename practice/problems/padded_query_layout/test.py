"""Tests of problem 53 (padded_layout)."""

import pytest

from submission import padded_layout


def check(extend_lens, expected):
    got = padded_layout(list(extend_lens))
    got = (list(got[0]), list(got[1]), got[2])
    names = ("query_slots", "last_indices", "max_extend")
    wrong = [f"  {n}: expected {e}, got {g}" for n, e, g in zip(names, expected, got) if e != g]
    assert not wrong, f"padded_layout({extend_lens}):\n" + "\n".join(wrong)


def test_example_three_requests():
    check([3, 1, 2], ([0, 1, 2, 3, 6, 7], [2, 3, 5], 3))


def test_decode_batch_has_no_padding():
    check([1, 1, 1, 1], ([0, 1, 2, 3], [0, 1, 2, 3], 1))


def test_one_request():
    check([5], ([0, 1, 2, 3, 4], [4], 5))


def test_longest_request_last():
    check([1, 2, 4], ([0, 4, 5, 8, 9, 10, 11], [0, 2, 6], 4))


def test_slots_are_distinct_and_inside_the_block():
    lens = [7, 3, 9, 1, 9]
    slots, last, max_extend = padded_layout(lens)
    assert len(slots) == sum(lens) and len(set(slots)) == len(slots), (
        f"padded_layout({lens}): query_slots must give each of the {sum(lens)} tokens its own row"
    )
    assert max(slots) < len(lens) * max_extend, "a slot falls outside the padded block"
    assert last == [6, 9, 18, 19, 28], (
        f"padded_layout({lens}): last_indices expected [6, 9, 18, 19, 28], got {last}"
    )


@pytest.mark.parametrize("lens", [[], [2, 0], [-1]])
def test_invalid_batches_raise(lens):
    try:
        got = padded_layout(lens)
    except ValueError:
        return
    except Exception as error:  # noqa: BLE001
        raise AssertionError(
            f"padded_layout({lens}): expected ValueError, got {type(error).__name__}: {error}"
        ) from None
    raise AssertionError(f"padded_layout({lens}): expected ValueError, got {got}")
