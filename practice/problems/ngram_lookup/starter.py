def propose_drafts(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Exactly k drafts: what followed the most recent earlier occurrence of the last n
    tokens (the longest n first), padded by repeating the sequence's last token."""
    raise NotImplementedError("look up the last n tokens earlier on, longest n first")
