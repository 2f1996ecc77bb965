"""Tests of problem 12 (trace)."""

import pytest

from submission import trace


def check(prompt_len, max_tokens, cached_len, expected):
    got = trace(prompt_len, max_tokens, cached_len)
    assert [tuple(row) for row in got] == expected, (
        f"trace({prompt_len}, {max_tokens}, cached_len={cached_len}):\n"
        f"expected {expected}\ngot      {got}"
    )


def test_example_prefix_hit():
    check(5, 3, 2, [(2, 5, 3), (5, 6, 1), (6, 7, 1)])


def test_no_prefix_hit():
    check(4, 2, 0, [(0, 4, 4), (4, 5, 1)])


def test_one_token_is_one_prefill():
    check(7, 1, 0, [(0, 7, 7)])


def test_one_token_prompt():
    check(1, 3, 0, [(0, 1, 1), (1, 2, 1), (2, 3, 1)])


def test_longest_allowed_prefix_hit_leaves_one_token():
    check(6, 2, 5, [(5, 6, 1), (6, 7, 1)])


def test_long_request_counts():
    rows = trace(100, 40, 37)
    assert len(rows) == 40, f"trace(100, 40, 37): expected 40 forwards, got {len(rows)}"
    computed = sum(row[2] for row in rows)
    assert computed == 63 + 39, (
        f"trace(100, 40, 37) computes {computed} tokens in all; "
        "expected 63 (prefill) + 39 (decodes)"
    )
    assert tuple(rows[-1]) == (138, 139, 1), f"last row: expected (138, 139, 1), got {rows[-1]}"


@pytest.mark.parametrize(
    "prompt_len, max_tokens, cached_len",
    [
        (5, 3, 5),  # the whole prompt cached: nothing left to compute
        (5, 3, 6),
        (5, 3, -1),
        (5, 0, 0),  # max_tokens must be >= 1
        (0, 3, 0),  # an empty prompt
    ],
)
def test_broken_ledgers_raise(prompt_len, max_tokens, cached_len):
    try:
        got = trace(prompt_len, max_tokens, cached_len)
    except ValueError:
        return
    except Exception as error:  # noqa: BLE001
        raise AssertionError(
            f"trace({prompt_len}, {max_tokens}, cached_len={cached_len}): "
            f"expected ValueError, got {type(error).__name__}: {error}"
        ) from None
    raise AssertionError(
        f"trace({prompt_len}, {max_tokens}, cached_len={cached_len}): "
        f"expected ValueError, got {got}"
    )
