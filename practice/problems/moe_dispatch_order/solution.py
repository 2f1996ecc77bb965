def dispatch(
    expert_ids: list[list[int]], num_experts: int
) -> tuple[list[int], list[int], list[int]]:
    """(order, tokens_per_expert, token_of_row) of the (token, slot) pairs sorted by expert."""
    flat = [e for row in expert_ids for e in row]
    top_k = len(expert_ids[0]) if expert_ids else 1
    order = sorted(range(len(flat)), key=lambda pair: flat[pair])
    tokens_per_expert = [flat.count(e) for e in range(num_experts)]
    return order, tokens_per_expert, [pair // top_k for pair in order]
