def launch_plan(extend_lens: list[int], block: int) -> tuple[tuple[int, int], list[list[int]]]:
    """The grid (requests, blocks) and each program's number of active lanes."""
    raise NotImplementedError("compute the grid and the active lanes of each program")
