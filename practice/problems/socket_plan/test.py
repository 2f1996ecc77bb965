"""Tests of problem 123: Who binds, who connects."""

import pytest
from submission import plan_sockets

SERVER = [
    ("api", "tokenizer"),
    ("tokenizer", "scheduler"),
    ("scheduler", "tokenizer"),
    ("tokenizer", "api"),
]


def test_example_the_server():
    got = plan_sockets(SERVER, "/tmp/s")
    expected = {
        "ipc:///tmp/s/api.sock": {"bind": "api", "connect": ["tokenizer"]},
        "ipc:///tmp/s/scheduler.sock": {"bind": "scheduler", "connect": ["tokenizer"]},
        "ipc:///tmp/s/tokenizer.sock": {"bind": "tokenizer", "connect": ["api", "scheduler"]},
    }
    assert got == expected, f"got {got}"


def test_a_process_that_only_sends_binds_nothing():
    got = plan_sockets([("launcher", "scheduler"), ("launcher", "tokenizer")], "/d")
    assert set(got) == {"ipc:///d/scheduler.sock", "ipc:///d/tokenizer.sock"}
    assert all(entry["connect"] == ["launcher"] for entry in got.values())


def test_repeated_routes_connect_once():
    got = plan_sockets([("a", "b"), ("a", "b"), ("c", "b")], "/d")
    assert got == {"ipc:///d/b.sock": {"bind": "b", "connect": ["a", "c"]}}


def test_sending_to_yourself_is_an_error():
    with pytest.raises(ValueError):
        plan_sockets([("a", "b"), ("b", "b")], "/d")


def test_no_routes_no_sockets():
    assert plan_sockets([], "/d") == {}
