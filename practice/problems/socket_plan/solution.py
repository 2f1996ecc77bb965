def plan_sockets(routes: list[tuple[str, str]], directory: str) -> dict[str, dict]:
    """For each receiver's address: {"bind": receiver, "connect": sorted unique senders}.

    ValueError if a process sends to itself.
    """
    senders: dict[str, set[str]] = {}
    for sender, receiver in routes:
        if sender == receiver:
            raise ValueError(f"{sender} sends to itself")
        senders.setdefault(receiver, set()).add(sender)
    return {
        f"ipc://{directory}/{receiver}.sock": {"bind": receiver, "connect": sorted(names)}
        for receiver, names in senders.items()
    }
