def overlap_timeline(prompt_len: int, max_tokens: int) -> list[tuple[int, int, int, bool]]:
    """One request alone under overlap scheduling: after every step, its
    (cached_len, device_len, host_len, finished)."""
    max_device_len = prompt_len + max_tokens
    cached, device = prompt_len, prompt_len + 1  # step 0 launches the prefill
    host = prompt_len
    timeline = [(cached, device, host, False)]
    while True:
        if device < max_device_len:  # the ledger can decode: launch the next forward
            cached, device = device, device + 1
        host += 1  # the previous forward's token reaches the host
        finished = host >= max_device_len
        timeline.append((cached, device, host, finished))
        if finished:
            return timeline


def tokens_if_ledger_decides(prompt_len: int, max_tokens: int) -> int:
    """How many tokens the host would have reported when a check on the ledger
    (device_len >= prompt_len + max_tokens) first declared the request finished."""
    for _, device, host, _ in overlap_timeline(prompt_len, max_tokens)[1:]:
        if device >= prompt_len + max_tokens:
            return host - prompt_len
    raise AssertionError("unreachable")
