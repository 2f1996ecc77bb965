"""Tests of problem 122: Decode only the message types you know."""

from dataclasses import dataclass, field

import pytest
from submission import decode


@dataclass
class Abort:
    uid: int


@dataclass
class Params:
    max_tokens: int = 16
    stop: list = field(default_factory=list)


@dataclass
class User:
    uid: int
    ids: list
    params: Params


@dataclass
class Batch:
    data: list


REGISTRY = {"Abort": Abort, "Params": Params, "User": User, "Batch": Batch}


def msg(name, **fields):
    return {"type": name, "fields": fields}


def test_example_a_known_type():
    got = decode(msg("Abort", uid=3), {"Abort": Abort})
    assert got == Abort(3), f"expected Abort(uid=3), got {got!r}"


def test_example_an_unknown_type_is_refused():
    with pytest.raises(ValueError, match="os.system"):
        decode(msg("os.system"), {"Abort": Abort})


def test_nested_messages_and_lists_are_decoded():
    data = msg(
        "Batch",
        data=[
            msg("User", uid=1, ids=[5, 6], params=msg("Params", max_tokens=4)),
            msg("Abort", uid=2),
        ],
    )
    got = decode(data, REGISTRY)
    assert got == Batch([User(1, [5, 6], Params(4)), Abort(2)]), f"got {got!r}"


def test_plain_values_pass_through():
    for value in (3, "text", None, 2.5, [1, 2], {"role": "user", "content": "hi"}):
        assert decode(value, REGISTRY) == value


def test_an_unknown_type_deep_inside_is_refused():
    with pytest.raises(ValueError):
        decode(msg("Batch", data=[msg("Abort", uid=1), msg("Popen", args="rm")]), REGISTRY)


def test_wrong_fields_are_a_value_error():
    with pytest.raises(ValueError):
        decode(msg("Abort"), REGISTRY)
    with pytest.raises(ValueError):
        decode(msg("Abort", uid=1, command="x"), REGISTRY)
