def plan_mixed_step(
    running: list[int], waiting: list[tuple[int, int]], budget: int
) -> list[tuple[int, int]]:
    """The work of one mixed step: (uid, 1) per running request, then (uid, prompt tokens) of
    the waiting requests admitted, first come, first served, in the rest of the budget."""
    plan = [(uid, 1) for uid in running]
    left = budget - len(running)
    for uid, uncomputed in waiting:
        if left <= 0:
            break
        tokens = min(uncomputed, left)
        plan.append((uid, tokens))
        left -= tokens
        if tokens < uncomputed:
            break  # a chunk closes the step
    return plan
