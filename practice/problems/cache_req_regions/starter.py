def cache_req_regions(
    old: int, lcp_now: int, cached_len: int, page_size: int, finished: bool
) -> dict:
    """The matched / duplicate / inserted / tail regions of a request's cached slots, the
    non-empty regions that are freed, and how many pages they return."""
    raise NotImplementedError("compute new and shared, then the regions and what is freed")
