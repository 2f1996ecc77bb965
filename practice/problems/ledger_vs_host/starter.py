def overlap_timeline(prompt_len: int, max_tokens: int) -> list[tuple[int, int, int, bool]]:
    """One request alone under overlap scheduling: after every step, its
    (cached_len, device_len, host_len, finished)."""
    raise NotImplementedError("launch from the ledger, then let the previous token reach the host")


def tokens_if_ledger_decides(prompt_len: int, max_tokens: int) -> int:
    """How many tokens the host would have reported when a check on the ledger
    (device_len >= prompt_len + max_tokens) first declared the request finished."""
    raise NotImplementedError("find the first step whose device_len reaches the limit")
