"""Tests of problem 213: tokens per second, with and without the warm-up."""

import random

import pytest
from submission import throughputs


def test_example():
    got = throughputs(0.0, [[0.5, 1.0, 1.5, 2.0], [1.0, 2.0, 3.0, 4.0]], warmup_s=1.0)
    assert got == pytest.approx((2.0, 5 / 3)), f"got {got}"


def test_a_run_with_a_slow_start():
    """Tokens come slowly for the first `warm` seconds, then at a steady rate."""
    rng = random.Random(0)
    start, warm, rate, steady_s = 5.0, 2.0, 100.0, 3.0
    slow = [start + rng.uniform(0.1, warm) for _ in range(20)]
    fast = [start + warm + (i + 1) / rate for i in range(int(rate * steady_s))]
    requests = [slow[:10] + fast[::2], slow[10:] + fast[1::2]]
    overall, steady = throughputs(start, requests, warm)
    end = fast[-1]
    assert overall == pytest.approx((len(slow) + len(fast)) / (end - start))
    assert steady == pytest.approx(len(fast) / (end - start - warm)), "steady rate"


def test_a_token_on_the_boundary_belongs_to_the_warm_up():
    _, steady = throughputs(0.0, [[1.0, 2.0, 3.0]], warmup_s=1.0)
    assert steady == pytest.approx(1.0), "2 tokens in (1, 3]: 1 token/s"


def test_no_warm_up_gives_the_overall_rate_and_a_too_long_one_is_an_error():
    times = [[0.2, 0.4], [0.3, 0.9, 1.2]]
    overall, steady = throughputs(0.0, times, 0.0)
    assert overall == pytest.approx(5 / 1.2), "overall"
    assert steady == pytest.approx(5 / 1.2), "no warm-up: steady is the overall rate"
    with pytest.raises(ValueError):
        throughputs(0.0, times, 1.2)
