def continuous_batching(
    requests: list[tuple[int, int]], max_running_req: int
) -> list[tuple[str, list[int]]]:
    """Simulate the scheduler's loop; return (phase, uids) for every step.

    requests[uid] = (arrival_step, max_tokens). phase is "prefill", "decode" or "idle".
    """
    arrival_order = sorted(range(len(requests)), key=lambda uid: (requests[uid][0], uid))
    waiting: list[int] = []
    running: list[int] = []  # admission order
    generated = [0] * len(requests)
    free_rows = max_running_req
    last_phase = None
    steps: list[tuple[str, list[int]]] = []
    finished = 0
    while finished < len(requests):
        step = len(steps)
        while arrival_order and requests[arrival_order[0]][0] <= step:
            waiting.append(arrival_order.pop(0))

        def prefill() -> list[int]:
            admitted = waiting[:free_rows]
            del waiting[:free_rows]
            return admitted

        if last_phase == "prefill" and running:
            phase, batch = "decode", list(running)
        else:
            phase, batch = "prefill", prefill()
            if not batch:
                phase, batch = "decode", list(running)
        if not batch:
            steps.append(("idle", []))
            continue
        last_phase = phase
        if phase == "prefill":
            free_rows -= len(batch)
            running.extend(batch)
        for uid in batch:
            generated[uid] += 1
            if generated[uid] == requests[uid][1]:
                running.remove(uid)
                free_rows += 1
                finished += 1
        steps.append((phase, batch))
    return steps
