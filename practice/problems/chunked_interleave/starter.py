def chunked_schedule(
    requests: list[tuple[int, int]], max_extend_tokens: int
) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every step of the scheduler with chunked prefill: (phase, [(uid, tokens computed)]).

    requests[uid] = (prompt_len, max_tokens), all waiting from the start.
    """
    raise NotImplementedError("interleave chunked prefill steps with decode steps")
