def admission_trace(
    requests: list[tuple[int, int]], num_pages: int, page_size: int, max_running_req: int
) -> list[tuple[str, list[int], int]]:
    """Simulate admission control; return (phase, uids, free pages after the step) per step.

    requests[uid] = (prompt_len, max_tokens), all waiting from the start.
    """
    raise NotImplementedError("admit worst cases that fit, run prefill/decode steps, free pages")
