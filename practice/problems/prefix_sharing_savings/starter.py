def computed_prompt_tokens(batches: list[list[list[int]]], page_size: int) -> list[list[int]]:
    """For every prompt of every prefill batch (run in order), how many of its tokens the
    prefill computes; the rest come from the radix cache."""
    raise NotImplementedError("match each prompt (but its last token) against the cached pages")
