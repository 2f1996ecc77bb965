import re

ANY_OBJECT = {"type": "object"}


def constraint(response_format: object) -> dict | None:
    """The JSON Schema a response_format asks for (None: no constraint); ValueError naming the
    wrong field's path otherwise."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ValueError("response_format: must be an object")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(ANY_OBJECT)
    if kind != "json_schema":
        raise ValueError(
            f"response_format.type: must be text, json_object or json_schema, got {kind!r}"
        )
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("response_format.json_schema: required, an object, for json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError("response_format.json_schema.name: 1 to 64 of a-z A-Z 0-9 _ -")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema: must be an object")
    return schema
