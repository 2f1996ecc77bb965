def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def verify_pages(
    device_len: int, drafts: int, emitted: int, page: int
) -> tuple[tuple[int, int], list[int], list[int]]:
    """The ledger after a verify step's rollback, the pages it allocated and those it frees."""
    owned = ceil_div(device_len - 1, page)
    allocated = list(range(owned, ceil_div(device_len + drafts, page)))
    new_device_len = device_len + emitted
    kept = ceil_div(new_device_len - 1, page)
    freed = [p for p in allocated if p >= kept]
    return (new_device_len - 1, new_device_len), allocated, freed
