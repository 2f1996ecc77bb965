def run_prepare_inputs(
    rows: list[int],
    cached_lens: list[int],
    extend_lens: list[int],
    token_pool: list[list[int]],
    page_table: list[list[int]],
    block: int,
) -> tuple[list[int], list[int], list[int]]:
    """Positions, input ids and KV slots of a batch's new tokens, program by program."""
    raise NotImplementedError("loop over the grid's programs and their masked lanes")
