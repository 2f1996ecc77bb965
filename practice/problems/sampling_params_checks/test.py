"""Tests of problem 13 (check_sampling_params, is_greedy)."""

import pytest

from submission import check_sampling_params, is_greedy


def test_example_valid_values_pass():
    got = check_sampling_params(0.7, 40, 0.9, 128)
    assert got is None, f"check_sampling_params(0.7, 40, 0.9, 128): expected None, got {got!r}"


def test_example_greedy():
    got = (is_greedy(0.0, -1), is_greedy(0.8, 1), is_greedy(0.8, 2))
    assert got == (True, True, False), (
        f"(is_greedy(0.0, -1), is_greedy(0.8, 1), is_greedy(0.8, 2)): expected "
        f"(True, True, False), got {got}"
    )


@pytest.mark.parametrize(
    "values",
    [
        (0.0, -1, 1.0, 1),  # the defaults, with the smallest max_tokens
        (2.0, 1, 1e-9, 5),  # tiny but positive top_p
        (0.0, 50000, 1.0, 10),
    ],
)
def test_boundary_values_are_valid(values):
    try:
        got = check_sampling_params(*values)
    except ValueError as error:
        raise AssertionError(
            f"check_sampling_params{values} must accept these values, raised ValueError: {error}"
        ) from None
    assert got is None, f"check_sampling_params{values}: expected None, got {got!r}"


@pytest.mark.parametrize(
    "values, field",
    [
        ((0.0, -1, 1.0, 0), "max_tokens"),
        ((0.0, -1, 1.0, -3), "max_tokens"),
        ((-0.1, -1, 1.0, 8), "temperature"),
        ((0.5, -1, 0.0, 8), "top_p"),
        ((0.5, -1, 1.0000001, 8), "top_p"),
        ((0.5, -1, -0.5, 8), "top_p"),
        ((0.5, 0, 1.0, 8), "top_k"),
        ((0.5, -2, 1.0, 8), "top_k"),
    ],
)
def test_invalid_values_raise_naming_the_field(values, field):
    try:
        check_sampling_params(*values)
    except ValueError as error:
        assert field in str(error), (
            f"check_sampling_params{values}: the ValueError must name {field!r}, got {str(error)!r}"
        )
        return
    except Exception as error:  # noqa: BLE001
        raise AssertionError(
            f"check_sampling_params{values}: expected ValueError naming "
            f"{field!r}, got {type(error).__name__}: {error}"
        ) from None
    raise AssertionError(
        f"check_sampling_params{values}: expected ValueError naming {field!r}, nothing was raised"
    )


@pytest.mark.parametrize(
    "temperature, top_k, expected",
    [
        (0.0, 1, True),
        (0.0, 40, True),
        (1.0, -1, False),
        (1e-6, -1, False),
        (1.0, 2, False),
    ],
)
def test_is_greedy(temperature, top_k, expected):
    got = is_greedy(temperature, top_k)
    assert got == expected, f"is_greedy({temperature}, {top_k}): expected {expected}, got {got}"
