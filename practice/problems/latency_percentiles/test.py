"""Tests of problem 153: TTFT and inter-token latency."""

import math

import pytest
from submission import latency_report, percentile


def test_example_percentile():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)


def test_example_report():
    got = latency_report([(0.0, [0.5, 0.6, 0.8]), (1.0, [1.2, 1.3])])
    expected = {"ttft_p50": 0.35, "ttft_p99": 0.497, "itl_p50": 0.1, "itl_p99": 0.198}
    assert got.keys() == expected.keys(), f"keys: {sorted(got)}"
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), f"{key}: expected {value}, got {got[key]}"


def test_percentile_ends_and_unsorted_input():
    values = [5.0, 1.0, 3.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile(values, 50) == 3.0
    assert percentile([7.0], 99) == 7.0


def test_no_values_is_nan():
    assert math.isnan(percentile([], 50))
    got = latency_report([(0.0, [])])
    assert all(math.isnan(v) for v in got.values()), got


def test_requests_without_pieces_are_skipped_and_gaps_are_pooled():
    got = latency_report([(0.0, []), (0.0, [1.0, 3.0]), (2.0, [2.5, 2.6, 2.7, 2.8])])
    assert got["ttft_p50"] == pytest.approx(0.75)
    assert got["itl_p50"] == pytest.approx(0.1)  # gaps 2.0, 0.1, 0.1, 0.1
    assert got["itl_p99"] == pytest.approx(0.1 + (2.0 - 0.1) * 0.97)
