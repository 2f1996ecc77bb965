def throughputs(
    start: float, token_times: list[list[float]], warmup_s: float
) -> tuple[float, float]:
    """(overall, steady) output tokens/s: the whole run, and the run after its warm-up."""
    raise NotImplementedError("find the run's end, then count tokens in each window")
