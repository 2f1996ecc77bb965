def pack(allowed: set[int], vocab_size: int) -> list[int]:
    """ceil(vocab_size / 32) signed 32-bit words; bit j % 32 of word j // 32 is token j."""
    raise NotImplementedError("pack: the allowed ids as signed 32-bit words")


def unpack(words: list[int], vocab_size: int) -> set[int]:
    """The allowed token ids (< vocab_size) of a packed row."""
    raise NotImplementedError("unpack: the allowed ids of a packed row")


def apply(logits: list[float], words: list[int]) -> list[float]:
    """A copy of the logits with every token whose bit is 0 set to -inf."""
    raise NotImplementedError("apply: forbidden tokens' logits to -inf")
