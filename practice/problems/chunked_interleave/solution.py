def chunked_schedule(
    requests: list[tuple[int, int]], max_extend_tokens: int
) -> list[tuple[str, list[tuple[int, int]]]]:
    """Every step of the scheduler with chunked prefill: (phase, [(uid, tokens computed)]).

    requests[uid] = (prompt_len, max_tokens), all waiting from the start.
    """
    waiting = [[uid, 0] for uid in range(len(requests))]  # uid, prompt tokens computed
    running: list[int] = []  # admission order
    generated = [0] * len(requests)
    last_phase = None
    steps: list[tuple[str, list[tuple[int, int]]]] = []

    def prefill() -> list[tuple[int, int]]:
        nonlocal waiting
        budget = max_extend_tokens
        batch: list[tuple[int, int]] = []
        done: list[int] = []
        for entry in waiting:
            if budget <= 0:
                break
            uid, start = entry
            take = min(requests[uid][0] - start, budget)
            budget -= take
            batch.append((uid, take))
            if start + take < requests[uid][0]:
                entry[1] = start + take
                break
            done.append(uid)
        waiting = [entry for entry in waiting if entry[0] not in done]
        running.extend(done)  # their first token is sampled in this step
        return batch

    while waiting or running:
        if last_phase == "prefill" and running:
            phase, batch = "decode", [(uid, 1) for uid in running]
        else:
            phase, batch = "prefill", prefill()
            if not batch:
                phase, batch = "decode", [(uid, 1) for uid in running]
        last_phase = phase
        for uid in list(running):
            if uid in dict(batch):
                generated[uid] += 1
                if generated[uid] == requests[uid][1]:
                    running.remove(uid)
        steps.append((phase, batch))
    return steps
