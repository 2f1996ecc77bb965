def run_prepare_inputs(
    rows: list[int],
    cached_lens: list[int],
    extend_lens: list[int],
    token_pool: list[list[int]],
    page_table: list[list[int]],
    block: int,
) -> tuple[list[int], list[int], list[int]]:
    """Positions, input ids and KV slots of a batch's new tokens, program by program."""
    starts = [sum(extend_lens[:r]) for r in range(len(extend_lens))]
    total = sum(extend_lens)
    positions, input_ids, out_loc = [0] * total, [0] * total, [0] * total
    blocks = -(-max(extend_lens) // block)
    for r, row in enumerate(rows):
        for b in range(blocks):
            for lane in range(block):
                offset = b * block + lane
                if offset >= extend_lens[r]:  # the mask
                    continue
                position = cached_lens[r] + offset
                out = starts[r] + offset
                positions[out] = position
                input_ids[out] = token_pool[row][position]
                out_loc[out] = page_table[row][position]
    return positions, input_ids, out_loc
