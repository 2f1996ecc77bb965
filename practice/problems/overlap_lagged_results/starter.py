def overlap_outputs(
    tokens: list[list[int]], max_tokens: list[int], eos: set[int]
) -> tuple[list[list[tuple[int, int, bool]]], list[int]]:
    """Simulate overlap scheduling of requests prefilled together at step 0.

    tokens[uid][k] is what the request's k-th forward samples (k = 0: the prefill).
    Returns the outputs (uid, token, finished) reported at each step, and how many forwards
    each request ran.
    """
    raise NotImplementedError("launch batch N+1 from the ledgers, then process batch N")
