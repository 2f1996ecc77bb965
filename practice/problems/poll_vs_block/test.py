"""Tests of problem 143: Why the idle scheduler blocks instead of polling."""

import pytest
from submission import compare


def check(arrivals, interval, horizon, expected):
    got = compare(arrivals, interval, horizon)
    assert got.keys() == expected.keys(), f"keys: got {sorted(got)}"
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), (
            f"compare({arrivals}, {interval}, {horizon})[{key!r}]: expected {value}, got {got[key]}"
        )


def test_example():
    check(
        [0.25, 2.5],
        1.0,
        4.0,
        {"poll_wakeups": 4, "poll_mean_delay": 0.625, "block_wakeups": 2, "block_mean_delay": 0.0},
    )


def test_a_quiet_second_polled_every_millisecond():
    check(
        [],
        0.001,
        1.0,
        {"poll_wakeups": 1000, "poll_mean_delay": 0.0, "block_wakeups": 0, "block_mean_delay": 0.0},
    )


def test_an_arrival_on_a_look_waits_nothing_and_at_zero_waits_a_full_interval():
    check(
        [2.0, 0.0],
        0.5,
        3.0,
        {"poll_wakeups": 6, "poll_mean_delay": 0.25, "block_wakeups": 2, "block_mean_delay": 0.0},
    )


def test_a_long_interval_delays_every_request():
    got = compare([0.1, 1.1, 2.1], 2.0, 4.0)
    assert got["poll_mean_delay"] == pytest.approx((1.9 + 0.9 + 1.9) / 3)
    assert got["poll_wakeups"] == 2 and got["block_wakeups"] == 3
