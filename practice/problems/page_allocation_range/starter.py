def pages_to_allocate(cached_len: int, device_len: int, page_size: int) -> tuple[int, int]:
    """[first, last) page indices a forward over [cached_len, device_len) must allocate."""
    raise NotImplementedError("pages owned vs pages needed, both rounded up")


def pages_per_forward(prompt_len: int, max_tokens: int, page_size: int) -> list[int]:
    """New pages of each of a request's max_tokens forwards (prefill first)."""
    raise NotImplementedError("apply pages_to_allocate to every forward's ledger")
