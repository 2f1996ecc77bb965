def plan_mixed_step(
    running: list[int], waiting: list[tuple[int, int]], budget: int
) -> list[tuple[int, int]]:
    """The work of one mixed step: (uid, 1) per running request, then (uid, prompt tokens) of
    the waiting requests admitted, first come, first served, in the rest of the budget."""
    raise NotImplementedError("decode tokens first, then prompt chunks in the rest of the budget")
