import json


def sse_events(
    header: dict, replies: list[tuple[str, str | None]], usage: dict | None
) -> list[str]:
    """The SSE events of a streamed completion: pieces, optional usage, then [DONE]."""
    raise NotImplementedError("one data: event per piece, then usage, then [DONE]")
