def decode(data: object, registry: dict[str, type]) -> object:
    """Rebuild messages ({"type": name, "fields": {...}}) from plain data, recursively.

    Lists are decoded item by item; other values are returned unchanged. ValueError for a
    name not in `registry` or fields that do not fit its class.
    """
    if isinstance(data, dict) and "type" in data:
        name = data["type"]
        if name not in registry:
            raise ValueError(f"unknown message type {name!r}")
        fields = {key: decode(value, registry) for key, value in data["fields"].items()}
        try:
            return registry[name](**fields)
        except TypeError as error:
            raise ValueError(f"bad fields for {name}: {error}") from error
    if isinstance(data, list):
        return [decode(item, registry) for item in data]
    return data
