def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def admission_trace(
    requests: list[tuple[int, int]], num_pages: int, page_size: int, max_running_req: int
) -> list[tuple[str, list[int], int]]:
    """Simulate admission control; return (phase, uids, free pages after the step) per step.

    requests[uid] = (prompt_len, max_tokens), all waiting from the start.
    """
    waiting = list(range(len(requests)))
    running: list[int] = []  # admission order
    generated = [0] * len(requests)
    held = [0] * len(requests)  # pages each request owns
    free_pages, free_rows = num_pages, max_running_req
    last_phase = None
    steps: list[tuple[str, list[int], int]] = []

    def remain(uid: int) -> int:
        return requests[uid][1] - generated[uid]

    def prefill() -> list[int]:
        reserved = sum(remain(uid) + page_size for uid in running)
        admitted: list[int] = []
        for uid in waiting:
            prompt_len, max_tokens = requests[uid]
            need = prompt_len + max_tokens + page_size
            if len(admitted) == free_rows or reserved + need > free_pages * page_size:
                break
            reserved += need
            admitted.append(uid)
        del waiting[: len(admitted)]
        return admitted

    while waiting or running:
        if last_phase == "prefill" and running:
            phase, batch = "decode", list(running)
        else:
            phase, batch = "prefill", prefill()
            if not batch:
                phase, batch = "decode", list(running)
        last_phase = phase
        if phase == "prefill":
            free_rows -= len(batch)
            running.extend(batch)
        for uid in batch:
            # this forward writes positions up to prompt_len + generated - 1
            device_len = requests[uid][0] + generated[uid]
            new = div_ceil(device_len, page_size) - held[uid]
            held[uid] += new
            free_pages -= new
            generated[uid] += 1
        for uid in batch:
            if remain(uid) == 0:
                running.remove(uid)
                free_rows += 1
                free_pages += held[uid]
                held[uid] = 0
        steps.append((phase, batch, free_pages))
    return steps
