def make_room(
    running: list[tuple[int, int, int]],
    chunk: tuple[int, int] | None,
    protected: set[int],
    free_pages: int,
) -> list[int]:
    """The uids preempted, in order, until the staying requests' next pages fit."""
    staying = list(running)
    preempted: list[int] = []
    while sum(need for _, _, need in staying) > free_pages:
        if chunk is not None and chunk[0] not in protected:
            uid, held = chunk
            chunk = None
        else:
            candidates = [r for r in staying if r[0] not in protected]
            if not candidates:
                raise RuntimeError("out of KV pages with nothing left to preempt")
            victim = candidates[-1]
            staying.remove(victim)
            uid, held = victim[0], victim[1]
        free_pages += held
        preempted.append(uid)
    return preempted
