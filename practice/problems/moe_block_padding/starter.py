def block_layout(
    order: list[int], tokens_per_expert: list[int], block_m: int
) -> tuple[list[int], list[int]]:
    """(pair_ids padded with -1 to whole blocks per expert, the expert of each block)."""
    raise NotImplementedError("pad each expert's run of pairs to a multiple of block_m")
