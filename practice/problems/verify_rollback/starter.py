def verify_pages(
    device_len: int, drafts: int, emitted: int, page: int
) -> tuple[tuple[int, int], list[int], list[int]]:
    """The ledger after a verify step's rollback, the pages it allocated and those it frees."""
    raise NotImplementedError("allocate up to the drafts' end, keep up to the new cached_len")
