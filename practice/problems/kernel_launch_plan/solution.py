def launch_plan(extend_lens: list[int], block: int) -> tuple[tuple[int, int], list[list[int]]]:
    """The grid (requests, blocks) and each program's number of active lanes."""
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    blocks = -(-max(extend_lens) // block)
    active = [[min(block, max(0, n - b * block)) for b in range(blocks)] for n in extend_lens]
    return (len(extend_lens), blocks), active
