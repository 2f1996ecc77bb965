import math


def compare(arrivals: list[float], interval: float, horizon: float) -> dict:
    """Wake-ups and mean delay of polling every `interval` vs blocking on the socket."""
    looks = int(horizon / interval + 1e-9)  # 1.0 // 0.001 is 999.0 in floating point
    delays = [max(1, math.ceil(a / interval)) * interval - a for a in arrivals]
    return {
        "poll_wakeups": looks,
        "poll_mean_delay": sum(delays) / len(delays) if delays else 0.0,
        "block_wakeups": len(arrivals),
        "block_mean_delay": 0.0,
    }
