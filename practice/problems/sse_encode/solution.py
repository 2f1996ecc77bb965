import json


def event(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def sse_events(
    header: dict, replies: list[tuple[str, str | None]], usage: dict | None
) -> list[str]:
    """The SSE events of a streamed completion: pieces, optional usage, then [DONE]."""
    events = []
    for text, reason in replies:
        if text or reason is not None:
            events.append(
                event({**header, "choices": [{"index": 0, "text": text, "finish_reason": reason}]})
            )
        if reason is not None:
            break
    if usage is not None:
        events.append(event({**header, "choices": [], "usage": usage}))
    return events + [event("[DONE]")]
