import math


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between ranks; nan if empty."""
    # reference body: benchmark/metrics.py:percentile


def latency_report(requests: list[tuple[float, list[float]]]) -> dict[str, float]:
    """TTFT and ITL p50/p99 from (start, piece arrival times) per request."""
    ttfts = [times[0] - start for start, times in requests if times]
    gaps = [b - a for _, times in requests for a, b in zip(times, times[1:])]
    return {
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p99": percentile(ttfts, 99),
        "itl_p50": percentile(gaps, 50),
        "itl_p99": percentile(gaps, 99),
    }
