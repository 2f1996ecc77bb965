def pack(allowed: set[int], vocab_size: int) -> list[int]:
    """ceil(vocab_size / 32) signed 32-bit words; bit j % 32 of word j // 32 is token j."""
    words = [0] * ((vocab_size + 31) // 32)
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def unpack(words: list[int], vocab_size: int) -> set[int]:
    """The allowed token ids (< vocab_size) of a packed row."""
    return {j for j in range(vocab_size) if ((words[j // 32] & 0xFFFFFFFF) >> (j % 32)) & 1}


def apply(logits: list[float], words: list[int]) -> list[float]:
    """A copy of the logits with every token whose bit is 0 set to -inf."""
    allowed = unpack(words, len(logits))
    return [x if j in allowed else float("-inf") for j, x in enumerate(logits)]
