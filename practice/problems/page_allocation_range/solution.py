def div_ceil(a: int, b: int) -> int:
    return -(-a // b)


def pages_to_allocate(cached_len: int, device_len: int, page_size: int) -> tuple[int, int]:
    """[first, last) page indices a forward over [cached_len, device_len) must allocate."""
    first = div_ceil(cached_len, page_size)
    last = div_ceil(device_len, page_size)
    return first, max(first, last)


def pages_per_forward(prompt_len: int, max_tokens: int, page_size: int) -> list[int]:
    """New pages of each of a request's max_tokens forwards (prefill first)."""
    counts = []
    cached, device = 0, prompt_len
    for _ in range(max_tokens):
        first, last = pages_to_allocate(cached, device, page_size)
        counts.append(last - first)
        cached, device = device, device + 1
    return counts
