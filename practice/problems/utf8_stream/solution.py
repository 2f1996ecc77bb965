def _complete_prefix_len(buffer: bytes) -> int:
    """How many leading bytes of `buffer` end on a character boundary (for valid UTF-8)."""
    for back in range(1, min(3, len(buffer)) + 1):
        byte = buffer[-back]
        if byte & 0b1100_0000 == 0b1100_0000:  # a lead byte: how long is its sequence?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(buffer) - back if need > back else len(buffer)
        if byte & 0b1000_0000 == 0:  # ASCII: a boundary right after it
            return len(buffer)
    return len(buffer)  # only continuation bytes: they can never complete, let them out


class Utf8Stream:
    """UTF-8 text from bytes arriving piece by piece, whole characters only."""

    def __init__(self) -> None:
        self.buffer = b""

    def push(self, piece: bytes) -> str:
        """Take the next bytes; return the text they complete (never half a character)."""
        self.buffer += piece
        cut = _complete_prefix_len(self.buffer)
        text, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return text.decode("utf-8", "replace")

    def flush(self) -> str:
        """At the end: the rest, with U+FFFD for bytes that are not a character."""
        text, self.buffer = self.buffer, b""
        return text.decode("utf-8", "replace")
