def computed_prompt_tokens(batches: list[list[list[int]]], page_size: int) -> list[list[int]]:
    """For every prompt of every prefill batch (run in order), how many of its tokens the
    prefill computes; the rest come from the radix cache."""
    cached: list[list[int]] = []  # page-aligned prompts inserted so far
    result: list[list[int]] = []
    for batch in batches:
        computed = []
        for prompt in batch:
            query = prompt[:-1]  # the last prompt token is always computed
            best = 0
            for seq in cached:
                n = 0
                while n < min(len(seq), len(query)) and seq[n] == query[n]:
                    n += 1
                best = max(best, n)
            matched = best - best % page_size
            computed.append(len(prompt) - matched)
        for prompt in batch:  # inserted after the batch's forward, whole pages only
            cached.append(prompt[: len(prompt) - len(prompt) % page_size])
        result.append(computed)
    return result
