def plan_prefill(
    prompt_lens: list[int], max_extend_tokens: int
) -> list[list[tuple[int, int, int]]]:
    """The prefill batches that compute these prompts: for each step, (uid, start, end) of
    the prompt tokens each request computes in it."""
    waiting = [[uid, 0] for uid in range(len(prompt_lens))]  # uid, tokens computed so far
    steps: list[list[tuple[int, int, int]]] = []
    while waiting:
        budget = max_extend_tokens
        batch: list[tuple[int, int, int]] = []
        for entry in waiting:
            if budget <= 0:
                break
            uid, start = entry
            end = start + min(prompt_lens[uid] - start, budget)
            budget -= end - start
            batch.append((uid, start, end))
            if end < prompt_lens[uid]:  # a chunk: it stays at the head, the batch is full
                entry[1] = end
                break
        done = {uid for uid, _, end in batch if end == prompt_lens[uid]}
        waiting = [entry for entry in waiting if entry[0] not in done]
        steps.append(batch)
    return steps
