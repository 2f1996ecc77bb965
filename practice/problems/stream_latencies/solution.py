import math


def stream_latencies(sent: float, chunks: list[tuple[float, dict]], done: float) -> dict:
    """TTFT, ITL gaps, latency, tokens and time per output token of one streamed completion."""
    pieces = [t for t, chunk in chunks if chunk["choices"] and chunk["choices"][0].get("text")]
    if not pieces:
        raise ValueError("the stream carried no text")
    tokens = 0
    for _, chunk in chunks:
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    ttft, latency = pieces[0] - sent, done - sent
    return {
        "ttft": ttft,
        "itl": [b - a for a, b in zip(pieces, pieces[1:])],
        "latency": latency,
        "tokens": tokens,
        "tpot": (latency - ttft) / (tokens - 1) if tokens > 1 else math.nan,
    }
