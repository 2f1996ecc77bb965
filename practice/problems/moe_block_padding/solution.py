def block_layout(
    order: list[int], tokens_per_expert: list[int], block_m: int
) -> tuple[list[int], list[int]]:
    """(pair_ids padded with -1 to whole blocks per expert, the expert of each block)."""
    pair_ids, block_expert = [], []
    start = 0
    for expert, count in enumerate(tokens_per_expert):
        blocks = -(-count // block_m)
        pair_ids += order[start : start + count] + [-1] * (blocks * block_m - count)
        block_expert += [expert] * blocks
        start += count
    return pair_ids, block_expert
