def overlap_outputs(
    tokens: list[list[int]], max_tokens: list[int], eos: set[int]
) -> tuple[list[list[tuple[int, int, bool]]], list[int]]:
    """Simulate overlap scheduling of requests prefilled together at step 0.

    tokens[uid][k] is what the request's k-th forward samples (k = 0: the prefill).
    Returns the outputs (uid, token, finished) reported at each step, and how many forwards
    each request ran.
    """
    n = len(tokens)
    forwards = [0] * n  # the ledger: forwards launched (tokens the device has sampled)
    reported = [0] * n  # tokens the host has seen
    running: list[int] = []
    last_batch: list[int] | None = None
    finished_last_round: set[int] = set()
    steps: list[list[tuple[int, int, bool]]] = []
    first = True
    while first or running or last_batch is not None:
        # 1. schedule and launch batch N+1 from the ledgers alone
        batch = list(range(n)) if first else list(running)
        first = False
        for uid in batch:
            forwards[uid] += 1
            if forwards[uid] < max_tokens[uid]:
                if uid not in running:
                    running.append(uid)
            elif uid in running:
                running.remove(uid)
        # 2. process batch N
        outputs: list[tuple[int, int, bool]] = []
        finished_now: set[int] = set()
        for uid in last_batch or []:
            if uid in finished_last_round:
                continue  # finished at EOS last round, but was already in this batch
            token = tokens[uid][reported[uid]]
            reported[uid] += 1
            finished = reported[uid] >= max_tokens[uid] or token in eos
            outputs.append((uid, token, finished))
            if finished:
                if uid in running:
                    running.remove(uid)
                finished_now.add(uid)
        finished_last_round = finished_now
        steps.append(outputs)
        last_batch = batch or None
    return steps, forwards
