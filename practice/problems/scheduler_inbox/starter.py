def handle_all(msgs: list[tuple], max_seq_len: int) -> list[tuple]:
    """Act on user/abort/status/step messages in order; return every answer in order."""
    raise NotImplementedError("keep waiting and running, answer errors, statuses and dones")
