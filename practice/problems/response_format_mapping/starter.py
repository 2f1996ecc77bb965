import re

ANY_OBJECT = {"type": "object"}


def constraint(response_format: object) -> dict | None:
    """The JSON Schema a response_format asks for (None: no constraint); ValueError naming the
    wrong field's path otherwise."""
    raise NotImplementedError("constraint: the schema a response_format asks for")
