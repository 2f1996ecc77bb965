def continuous_batching(
    requests: list[tuple[int, int]], max_running_req: int
) -> list[tuple[str, list[int]]]:
    """Simulate the scheduler's loop; return (phase, uids) for every step.

    requests[uid] = (arrival_step, max_tokens). phase is "prefill", "decode" or "idle".
    """
    raise NotImplementedError("simulate prefill/decode steps with max_running_req rows")
