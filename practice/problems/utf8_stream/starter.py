class Utf8Stream:
    """UTF-8 text from bytes arriving piece by piece, whole characters only."""

    def push(self, piece: bytes) -> str:
        """Take the next bytes; return the text they complete (never half a character)."""
        raise NotImplementedError("return the newly completed characters")

    def flush(self) -> str:
        """At the end: the rest, with U+FFFD for bytes that are not a character."""
        raise NotImplementedError("decode what is left, with replacement")
