def trace(arrivals: dict[int, list[int]], steps: dict[int, int]) -> list[str]:
    """The log of the scheduler loop: "block until T" when idle, "step T: [uids]" per step."""
    pending = [(t, uid) for t in sorted(arrivals) for uid in arrivals[t]]
    running: dict[int, int] = {}
    clock, log = 0, []
    while True:
        if not running:
            if not pending:
                return log
            clock = max(clock, pending[0][0])
            log.append(f"block until {clock}")
        while pending and pending[0][0] <= clock:
            uid = pending.pop(0)[1]
            running[uid] = steps[uid]
        log.append(f"step {clock}: {list(running)}")
        for uid in list(running):
            running[uid] -= 1
            if running[uid] == 0:
                del running[uid]
        clock += 1
