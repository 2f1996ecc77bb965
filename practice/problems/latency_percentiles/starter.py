import math


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between ranks; nan if empty."""
    raise NotImplementedError("sort, find rank (n-1)*q/100, interpolate")


def latency_report(requests: list[tuple[float, list[float]]]) -> dict[str, float]:
    """TTFT and ITL p50/p99 from (start, piece arrival times) per request."""
    raise NotImplementedError("collect TTFTs and gaps, then take percentiles")
