def parse_sse(chunks: list[bytes]) -> list[str]:
    """The data payloads of an SSE byte stream cut into arbitrary chunks, up to [DONE]."""
    raise NotImplementedError("split lines, collect data: fields, emit at blank lines")
