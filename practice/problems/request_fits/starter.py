def check_request_fits(
    prompt_len: int, max_tokens: int, max_seq_len: int, num_pages: int, page_size: int
) -> str:
    """'empty', 'max_seq_len', 'pool' (checked in this order) or 'ok'."""
    raise NotImplementedError("check the prompt, the page-table row and the KV pool")


def max_tokens_allowed(prompt_len: int, max_seq_len: int, num_pages: int, page_size: int) -> int:
    """The largest max_tokens that check_request_fits accepts for this prompt (0 if none)."""
    raise NotImplementedError("the smaller of the row limit and the pool limit")
