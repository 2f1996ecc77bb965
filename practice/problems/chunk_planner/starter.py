def plan_prefill(
    prompt_lens: list[int], max_extend_tokens: int
) -> list[list[tuple[int, int, int]]]:
    """The prefill batches that compute these prompts: for each step, (uid, start, end) of
    the prompt tokens each request computes in it."""
    raise NotImplementedError("fill each step's token budget first come, first served")
