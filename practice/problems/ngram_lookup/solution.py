def propose_drafts(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Exactly k drafts: what followed the most recent earlier occurrence of the last n
    tokens (the longest n first), padded by repeating the sequence's last token."""
    if k == 0:
        return []
    proposal: list[int] = []
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[len(tokens) - n :]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                proposal = tokens[start + n : start + n + k]
                break
        if proposal:
            break
    return proposal + [tokens[-1]] * (k - len(proposal))
