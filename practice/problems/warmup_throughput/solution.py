def throughputs(
    start: float, token_times: list[list[float]], warmup_s: float
) -> tuple[float, float]:
    """(overall, steady) output tokens/s: the whole run, and the run after its warm-up."""
    end = max(t for times in token_times for t in times)
    edge = start + warmup_s
    if edge >= end:
        raise ValueError("the warm-up covers the whole run")
    tokens = sum(map(len, token_times))
    steady = sum(1 for times in token_times for t in times if t > edge)
    return tokens / (end - start), steady / (end - edge)
