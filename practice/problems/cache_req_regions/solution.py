def cache_req_regions(
    old: int, lcp_now: int, cached_len: int, page_size: int, finished: bool
) -> dict:
    """The matched / duplicate / inserted / tail regions of a request's cached slots, the
    non-empty regions that are freed, and how many pages they return."""
    new = cached_len - cached_len % page_size
    shared = min(lcp_now - lcp_now % page_size, new)
    duplicate, tail = (old, shared), (new, cached_len)
    freed = [r for r in ([duplicate, tail] if finished else [duplicate]) if r[1] > r[0]]
    pages = sum(-(-(end - start) // page_size) for start, end in freed)
    return {
        "matched": (0, old),
        "duplicate": duplicate,
        "inserted": (shared, new),
        "tail": tail,
        "freed": freed,
        "pages_freed": pages,
    }
