def trace(arrivals: dict[int, list[int]], steps: dict[int, int]) -> list[str]:
    """The log of the scheduler loop: "block until T" when idle, "step T: [uids]" per step."""
    raise NotImplementedError("simulate receive (block only when idle), then step")
