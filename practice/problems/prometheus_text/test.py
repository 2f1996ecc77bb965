"""Tests of problem 154: Metrics in Prometheus' text format."""

import math

import pytest

from submission import metrics_text

EXAMPLE = [
    ("running_requests", "gauge", "requests decoding", 3),
    ("generated_tokens_total", "counter", "tokens so far", 120),
    ("integrity_ok", "gauge", "last idle check", True),
]


def sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def check(metrics, expected, **kw):
    got = metrics_text(list(metrics), **kw)
    assert got == expected, (
        f"metrics_text({metrics}, {kw}):\nexpected {expected!r}\ngot      {got!r}"
    )


def test_example_three_metrics():
    check(
        EXAMPLE,
        "# HELP minisgl_running_requests requests decoding\n"
        "# TYPE minisgl_running_requests gauge\n"
        "minisgl_running_requests 3\n"
        "# HELP minisgl_generated_tokens_total tokens so far\n"
        "# TYPE minisgl_generated_tokens_total counter\n"
        "minisgl_generated_tokens_total 120\n"
        "# HELP minisgl_integrity_ok last idle check\n"
        "# TYPE minisgl_integrity_ok gauge\n"
        "minisgl_integrity_ok 1\n",
    )


def test_no_metrics_is_empty_text():
    check([], "")


def test_the_prefix_is_configurable():
    check(
        [("up", "gauge", "alive", 1)],
        "# HELP app_up alive\n# TYPE app_up gauge\napp_up 1\n",
        prefix="app_",
    )


def test_booleans_and_not_measured_values():
    text = metrics_text(
        [("a", "gauge", "h", False), ("b", "gauge", "h", None), ("c", "gauge", "h", True)]
    )
    assert sample_lines(text) == ["minisgl_a 0", "minisgl_b -1", "minisgl_c 1"], text


def test_floats_and_special_values():
    text = metrics_text(
        [
            ("a", "gauge", "h", 0.25),
            ("b", "gauge", "h", 3.0),
            ("c", "gauge", "h", math.nan),
            ("d", "gauge", "h", math.inf),
            ("e", "gauge", "h", -math.inf),
        ]
    )
    assert sample_lines(text) == [
        "minisgl_a 0.25",
        "minisgl_b 3.0",
        "minisgl_c NaN",
        "minisgl_d +Inf",
        "minisgl_e -Inf",
    ], text


def test_help_text_is_escaped_onto_one_line():
    text = metrics_text([("a", "gauge", "first line\nsecond \\ line", 1)])
    assert text.splitlines()[0] == "# HELP minisgl_a first line\\nsecond \\\\ line", text
    assert len(text.splitlines()) == 3, text


@pytest.mark.parametrize(
    "metrics",
    [
        [("a", "histogram", "h", 1)],  # unknown kind
        [("bad-name", "gauge", "h", 1)],  # '-' is not allowed
        [("a", "gauge", "h", 1), ("a", "gauge", "h", 2)],  # twice
        [("generated_tokens", "counter", "h", 5)],  # a counter without _total
        [("errors_total", "counter", "h", -1)],  # a counter going negative
    ],
    ids=["kind", "name", "duplicate", "counter-name", "counter-negative"],
)
def test_invalid_metrics_are_refused(metrics):
    with pytest.raises(ValueError):
        metrics_text(metrics)


def test_a_name_that_is_valid_only_with_the_prefix():
    # "9lives" cannot start a name, but "minisgl_9lives" is fine.
    assert sample_lines(metrics_text([("9lives", "gauge", "h", 9)])) == ["minisgl_9lives 9"]
    with pytest.raises(ValueError):
        metrics_text([("lives", "gauge", "h", 9)], prefix="9")


def test_a_negative_gauge_is_fine():
    assert sample_lines(metrics_text([("delta", "gauge", "h", -4)])) == ["minisgl_delta -4"]
