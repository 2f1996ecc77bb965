"""Tests of problem 253: OpenAI's response_format, checked."""

import pytest

from submission import constraint

PERSON = {"type": "object", "properties": {"age": {"type": "integer"}}}


def test_example():
    assert constraint({"type": "json_object"}) == {"type": "object"}
    with pytest.raises(ValueError, match=r"^response_format\.type: .*'xml'"):
        constraint({"type": "xml"})


def test_text_and_missing_ask_for_nothing_and_a_schema_for_itself():
    assert constraint(None) is None and constraint({"type": "text"}) is None
    spec = {"name": "person", "schema": PERSON, "strict": True}
    assert constraint({"type": "json_schema", "json_schema": spec}) == PERSON
    assert constraint({"type": "json_schema", "json_schema": {"name": "any"}}) == {}


@pytest.mark.parametrize(
    "value, path",
    [
        ("json", "response_format"),
        ({}, "response_format.type"),
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": []}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"schema": {}}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a b"}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x" * 65}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": 3}},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_a_wrong_field_is_named_by_its_path(value, path):
    with pytest.raises(ValueError) as error:
        constraint(value)
    assert str(error.value).split(":")[0] == path, f"{value!r}: {error.value}"
