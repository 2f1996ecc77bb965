def check_request_fits(
    prompt_len: int, max_tokens: int, max_seq_len: int, num_pages: int, page_size: int
) -> str:
    """'empty', 'max_seq_len', 'pool' (checked in this order) or 'ok'."""
    if prompt_len == 0:
        return "empty"
    needed = prompt_len + max_tokens
    if needed > max_seq_len:
        return "max_seq_len"
    if needed + page_size > num_pages * page_size:
        return "pool"
    return "ok"


def max_tokens_allowed(prompt_len: int, max_seq_len: int, num_pages: int, page_size: int) -> int:
    """The largest max_tokens that check_request_fits accepts for this prompt (0 if none)."""
    by_row = max_seq_len - prompt_len
    by_pool = num_pages * page_size - page_size - prompt_len
    return max(0, min(by_row, by_pool))
