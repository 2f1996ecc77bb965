def make_room(
    running: list[tuple[int, int, int]],
    chunk: tuple[int, int] | None,
    protected: set[int],
    free_pages: int,
) -> list[int]:
    """The uids preempted, in order, until the staying requests' next pages fit."""
    raise NotImplementedError("preempt the chunk, then the newest unprotected, until it fits")
