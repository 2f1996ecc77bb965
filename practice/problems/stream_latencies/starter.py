import math


def stream_latencies(sent: float, chunks: list[tuple[float, dict]], done: float) -> dict:
    """TTFT, ITL gaps, latency, tokens and time per output token of one streamed completion."""
    raise NotImplementedError("find the pieces of text, the usage, then the five figures")
