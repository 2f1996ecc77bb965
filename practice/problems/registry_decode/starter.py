def decode(data: object, registry: dict[str, type]) -> object:
    """Rebuild messages ({"type": name, "fields": {...}}) from plain data, recursively.

    Lists are decoded item by item; other values are returned unchanged. ValueError for a
    name not in `registry` or fields that do not fit its class.
    """
    raise NotImplementedError("decode messages through the registry, recursively")
