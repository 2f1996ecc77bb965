def dispatch(
    expert_ids: list[list[int]], num_experts: int
) -> tuple[list[int], list[int], list[int]]:
    """(order, tokens_per_expert, token_of_row) of the (token, slot) pairs sorted by expert."""
    raise NotImplementedError("sort the pairs by expert, count them, and find each row's token")
