def plan_sockets(routes: list[tuple[str, str]], directory: str) -> dict[str, dict]:
    """For each receiver's address: {"bind": receiver, "connect": sorted unique senders}.

    ValueError if a process sends to itself.
    """
    raise NotImplementedError("group the routes by receiver")
